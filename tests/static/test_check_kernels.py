#!/usr/bin/env python3
"""check_kernels.py's verdicts on made-up measurements (no nvcc, no cuobjdump): one kernel within
every budget passes, and each budget broken on its own fails naming the kernel and the budget.
ctest: static.checker."""
import argparse
import contextlib
import copy
import io
import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_kernels  # noqa: E402

BUDGETS = """\
copy_kernel   2  0   LDG.E.128,STG.E.128  -
send_tokens   2  288 -                    its local arrays,
    indexed at run time
*             2  0   -                    -
"""
WITHIN = {
    "_Zcopy": {"name": "copy_kernel", "registers": 30, "stack": 0, "shared": 0, "local": 0,
               "sass": {"LDG.E.128": 2, "STG.E.128": 2, "LDG.E.U8": 4}},
    "_Zsend": {"name": "send_tokens", "registers": 80, "stack": 272, "shared": 33805, "local": 0,
               "sass": None},
    "_Zmoe": {"name": "plan_tiles_kernel", "registers": 54, "stack": 0, "shared": 0, "local": 0,
              "sass": None},
}


def verdict(kernels, only=None):
    with tempfile.TemporaryDirectory() as scratch:
        budgets = os.path.join(scratch, "budgets.txt")
        measured = os.path.join(scratch, "measured.json")
        open(budgets, "w").write(BUDGETS)
        json.dump({"library": "libpmoe.a", "archs": {"sm_90a": kernels}}, open(measured, "w"))
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = check_kernels.check(argparse.Namespace(measured=measured, budgets=budgets,
                                                          only=only))
        return code, out.getvalue()


def broken(mangled, **changes):
    kernels = copy.deepcopy(WITHIN)
    kernels[mangled].update(changes)
    return kernels


class Verdicts(unittest.TestCase):
    def fails(self, kernels, *words, only=None):
        code, out = verdict(kernels, only)
        self.assertEqual(code, 1, out)
        for w in words:
            self.assertIn(w, out)

    def test_within_every_budget(self):
        code, out = verdict(WITHIN)
        self.assertEqual(code, 0, out)

    def test_registers_over_what_two_blocks_per_sm_allow(self):
        self.fails(broken("_Zmoe", registers=136),
                   "FAIL: plan_tiles_kernel (sm_90a): 136 registers", "the 128 that 2 blocks")

    def test_a_spill_or_local_array_without_a_why(self):
        self.fails(broken("_Zcopy", stack=16), "FAIL: copy_kernel (sm_90a): 16 bytes of stack")

    def test_local_memory_over_its_allowance(self):
        self.fails(broken("_Zsend", local=32), "FAIL: send_tokens (sm_90a)", "over the 288")

    def test_shared_memory_over_the_static_limit(self):
        self.fails(broken("_Zsend", shared=49153),
                   "FAIL: send_tokens (sm_90a): 49153 bytes of shared")

    def test_shared_memory_that_leaves_fewer_blocks_than_the_design_counts_on(self):
        self.fails(broken("_Zsend", shared=48 * 1024, registers=200), "1 blocks fit on an SM")

    def test_a_copy_loop_no_longer_128_bit(self):
        sass = {"LDG.E.64": 2, "STG.E.128": 2}
        self.fails(broken("_Zcopy", sass=sass), "FAIL: copy_kernel (sm_90a): no LDG.E.128",
                   "LDG it has: LDG.E.64")

    def test_a_renamed_copy_kernel(self):
        kernels = copy.deepcopy(WITHIN)
        kernels["_Zcopy"]["name"] = "copy_kernel_v2"
        self.fails(kernels, "no kernel matches the budget line 'copy_kernel'")

    def test_local_memory_needs_a_why(self):
        with tempfile.TemporaryDirectory() as scratch:
            path = os.path.join(scratch, "budgets.txt")
            open(path, "w").write("copy_kernel 2 16 - -\n")
            with self.assertRaises(SystemExit) as raised:
                check_kernels.read_budgets(path)
            self.assertIn("say why", str(raised.exception))

    def test_a_why_goes_on_over_indented_lines(self):
        with tempfile.TemporaryDirectory() as scratch:
            path = os.path.join(scratch, "budgets.txt")
            open(path, "w").write(BUDGETS)
            why = check_kernels.read_budgets(path)[1]["why"]
            self.assertEqual(why, "its local arrays, indexed at run time")

    def test_only_checks_its_own_line(self):
        kernels = broken("_Zmoe", registers=136)
        self.assertEqual(verdict(kernels, only="copy_kernel")[0], 0)
        self.fails(kernels, "plan_tiles_kernel", only="*")


if __name__ == "__main__":
    unittest.main()
