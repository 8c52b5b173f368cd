"""Interpreter exit with pmoe objects still referenced (one process: ops of 2 thread ranks, a
layer, an array): nothing printed, exit status 0. pmoe.torch's objects are held
this way by torch's autograd graph (tests/torchrun_exit.py checks that under torchrun); here a
reference is taken and never given back, which is what Python's finalisation then sees."""
import subprocess
import sys

SCRIPT = r"""
import ctypes
import numpy as np
import pmoe

def hold(obj):  # a reference nobody gives back: obj outlives every module at exit
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))
    return obj

kept = []
def rank_main(comm):
    op = pmoe.AllToAll(comm, max_tokens=2, num_experts=2, top_k=1,
                       hidden_dim=8, in_dtype="f32", out_dtype="f32")
    kept.append(hold(op))
    kept.append(hold(pmoe.AllGatherGemm(comm, 8, 4, 4, dtype="f32")))
pmoe.run_ranks(2, rank_main)
config = hold(pmoe.MoeConfig(hidden_dim=8, ffn_dim=8, num_experts=2, top_k=1))
hold(pmoe.SimpleMoe(config, max_tokens=2))
hold(pmoe.zeros([4], "f32", "cpu"))
print("kept", len(kept) + 3, "objects", flush=True)
"""


def test_objects_alive_at_exit_print_nothing():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "kept 7 objects\n", done.stdout
    assert done.stderr == "", done.stderr  # nanobind's "leaked N instances!" would land here
