"""pmoe.torch outside torchrun, one process: `import pmoe` pulls in no torch, and the torch layer
refuses to start without torch.distributed, with pmoe.Error."""
import subprocess
import sys

import pytest

import pmoe


def test_import_pmoe_needs_no_torch():
    code = "import sys, pmoe; assert 'torch' not in sys.modules, 'pmoe imported torch'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_communicator_without_process_group():
    import pmoe.torch as pt
    with pytest.raises(pmoe.Error, match="init_process_group"):
        pt.communicator()
