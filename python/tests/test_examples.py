"""The README's Python example runs and checks its own result."""
import pathlib
import runpy


def test_readme_all_to_all_example(capsys):
    example = pathlib.Path(__file__).parents[1] / "examples" / "all_to_all.py"
    runpy.run_path(str(example), run_name="__main__")
    assert capsys.readouterr().out.strip() == "ok"


def test_readme_transformers_training_example(tmp_path):
    """The README's transformers script under torchrun, on a small random Mixtral: it trains
    (the loss falls over its five steps on every rank) and prints nothing else at exit."""
    import os
    import re
    import subprocess
    import sys

    import pytest
    pytest.importorskip("transformers")
    from hf_models import save_tiny
    save_tiny(tmp_path / "mixtral", "mixtral")
    example = pathlib.Path(__file__).parents[1] / "examples" / "transformers_train.py"
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         str(example), str(tmp_path / "mixtral")],
        capture_output=True, text=True, timeout=300,
        # The CPU example: with a GPU visible, transformers would put the ranks on GPUs 0 and 1.
        env=dict(os.environ, OMP_NUM_THREADS="1", TRANSFORMERS_VERBOSITY="error",
                 CUDA_VISIBLE_DEVICES=""))
    assert done.returncode == 0, done.stdout + done.stderr
    # The ranks share torchrun's stdout, and their lines may be cut into each other: match the
    # records, not the lines.
    records = re.findall(r"rank (\d) step (\d) loss (\d+\.\d+)", done.stdout)
    for rank in ("0", "1"):
        losses = [float(loss) for r, _, loss in records if r == rank]
        assert len(losses) == 5 and losses[-1] < losses[0], done.stdout
    assert "leaked" not in done.stderr
