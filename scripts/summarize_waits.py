#!/usr/bin/env python3
"""Tables for scripts/bench_waits.sh: per wait policy, the MoE sweep's medians over 4 oversubscribed
MPI ranks, and EP2 dispatch/combine at 128 tokens, with the per-round ratio of the two policies."""
import glob
import json
import os
import statistics
import sys


def load(out, kind, policy):
    runs = []
    for path in sorted(glob.glob(os.path.join(out, f"{kind}_{policy}_*.json"))):
        with open(path) as f:
            runs.append(json.load(f))
    return runs


def main():
    out = sys.argv[1]
    with open(os.path.join(out, "runs.log")) as f:
        print("```\n" + f.read().rstrip() + "\n```\n")
    print("## A. 4 MPI ranks on the machine's cores: MoE batch sweep, median ms per round\n")
    moe = {p: load(out, "moe", p) for p in ("spin", "adaptive")}
    worst = {}
    print("| variant | batch | PMOE_WAIT=spin | PMOE_WAIT=adaptive (default) |")
    print("|---|---|---|---|")
    keys = sorted({(r["variant"], r["batch_size"]) for run in moe["spin"] + moe["adaptive"]
                   for r in run["rows"] if r["variant"] in ("tp", "ep")},
                  key=lambda k: (k[0] != "tp", k[1]))
    for variant, batch in keys:
        cells = []
        for policy in ("spin", "adaptive"):
            meds = [r["median_ms"] for run in moe[policy] for r in run["rows"]
                    if r["variant"] == variant and r["batch_size"] == batch]
            worst[policy] = max([worst.get(policy, 0)] + meds)
            cells.append(" / ".join(f"{m:.3f}" for m in meds))
        print(f"| {variant} | {batch} | {cells[0]} | {cells[1]} |")
    print()
    for policy in ("spin", "adaptive"):
        verdict = "met" if worst.get(policy, 1e9) <= 1.0 else "NOT met"
        print(f"- {policy}: largest median {worst.get(policy, float('nan')):.3f} ms "
              f"(target <= 1 ms: {verdict})")
    print("\n## B. 2 MPI ranks (ranks <= cores): EP2 at 128 tokens, median us per round\n")
    ep2 = {p: load(out, "ep2", p) for p in ("spin", "adaptive")}
    print("| op | PMOE_WAIT=spin | PMOE_WAIT=adaptive (default) | adaptive / spin, per round | median ratio |")
    print("|---|---|---|---|---|")
    for op in ("dispatch", "combine"):
        med = {p: [r["median_us"] for run in ep2[p] for r in run["rows"] if r["op"] == op]
               for p in ep2}
        ratios = [a / s for a, s in zip(med["adaptive"], med["spin"])]
        print(f"| {op} | {' / '.join(f'{m:.0f}' for m in med['spin'])} | "
              f"{' / '.join(f'{m:.0f}' for m in med['adaptive'])} | "
              f"{' / '.join(f'{r:.2f}' for r in ratios)} | "
              f"{statistics.median(ratios) if ratios else float('nan'):.2f} |")


if __name__ == "__main__":
    main()
