"""pmoe.transformers against the installed transformers, in one process (the model checks run
under torchrun: torchrun_transformers.py): a transformers without the EP registry is refused at
import, naming the version needed, and importing registers "pmoe"."""
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")


def run(code):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)


def test_a_transformers_without_the_registry_is_named_with_the_version_needed():
    # transformers.distributed.expert_parallel as versions before 5.23 have it: no registry.
    done = run("import sys, types\n"
               "import transformers.distributed\n"
               "sys.modules['transformers.distributed.expert_parallel'] = types.ModuleType('old')\n"
               "import pmoe.transformers\n")
    assert done.returncode != 0
    assert "ImportError" in done.stderr
    assert "pmoe.transformers needs transformers >= 5.23.0" in done.stderr
    assert "EPImplementationInterface" in done.stderr


def test_importing_registers_pmoe():
    done = run("import pmoe.transformers\n"
               "from transformers.distributed.expert_parallel import EPImplementationInterface\n"
               "impl = EPImplementationInterface()['pmoe']\n"
               "print(impl.__module__, impl.__name__)\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["pmoe.transformers", "PmoeEP"]
    assert "leaked" not in done.stderr
