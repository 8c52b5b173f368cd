"""pmoe's GPU all-to-all beside its two baselines, measured in the same run, as one JSON.

    python3 tools/ata_ratios.py --pmoe PMOE.json --torch TORCH.json --out RATIOS.json

PMOE.json: `pmoe-bench all-to-all --device cuda --json` (pmoe's dispatch, combine and round trip,
and the row nccl_alltoallv: NCCL's all-to-all-v of the same rows). TORCH.json:
`tools/torch_ata_bench.py --device cuda --out` (Torch AtA, all_to_all_single over NCCL). One row
per EP size, tokens per rank and op (dispatch, combine, dispatch_combine): each side's mean time
(µs) and the ratio baseline / pmoe (above 1: pmoe is faster), or, where a side did not run, why
(scripts/device_checks.sh runs this in its bench part). A markdown table goes to stdout.
"""
import argparse
import json

OPS = ("dispatch", "combine", "dispatch_combine")


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise SystemExit(f"ata_ratios.py: cannot read {path} ({e}): the run that writes it failed "
                         "or did not finish (its log says why)")


def merge(pmoe, torch, pmoe_name, torch_name):
    mine = {(r["ranks"], r["tokens"], r["op"]): r for r in pmoe["rows"]}
    theirs = {(r["ep"], r["tokens"], r["op"]): r for r in torch["rows"] if r["impl"] == "torch_ata"}
    torch_skipped = {s["ep"]: s["reason"] for s in torch.get("skipped", [])}
    rows = []
    for (W, tokens, op), r in sorted(mine.items()):
        if op not in OPS:
            continue
        row = {"ep": W, "tokens": tokens, "op": op, "pmoe_us": r["mean_us"], "not_run": {}}
        # NCCL's all-to-all-v is a round trip only, like the CPU's alltoallv row.
        if op == "dispatch_combine":
            nccl = mine.get((W, tokens, "nccl_alltoallv"))
            row["nccl_alltoallv_us"] = nccl["mean_us"] if nccl else None
            if not nccl:
                row["not_run"]["nccl_alltoallv"] = "no nccl_alltoallv row in " + pmoe_name
            elif nccl["mean_us"] is None:
                row["not_run"]["nccl_alltoallv"] = nccl["not_run"]
        t = theirs.get((W, tokens, op))
        row["torch_ata_us"] = t["mean_us"] if t else None
        if not t:
            row["not_run"]["torch_ata"] = torch_skipped.get(
                W, f"no Torch AtA row for EP{W}, {tokens} tokens in {torch_name}")
        for side in ("nccl_alltoallv", "torch_ata"):
            base, ours = row.get(side + "_us"), row["pmoe_us"]
            if side + "_us" in row:
                row[side + "_over_pmoe"] = base / ours if base and ours else None
        rows.append(row)
    return rows


def markdown(rows):
    def cell(v, fmt):
        return fmt.format(v) if v is not None else "not run"

    lines = ["| EP | tokens | op | pmoe (µs) | NCCL all-to-all-v (µs) | ratio | Torch AtA (µs) | ratio |",
             "|---:|---:|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        nccl = ("", "") if "nccl_alltoallv_us" not in r else (
            cell(r["nccl_alltoallv_us"], "{:.1f}"), cell(r["nccl_alltoallv_over_pmoe"], "{:.2f}"))
        lines.append(f"| {r['ep']} | {r['tokens']} | {r['op']} | {cell(r['pmoe_us'], '{:.1f}')} | "
                     f"{nccl[0]} | {nccl[1]} | {cell(r['torch_ata_us'], '{:.1f}')} | "
                     f"{cell(r['torch_ata_over_pmoe'], '{:.2f}')} |")
    told = []
    for r in rows:
        for side, why in r["not_run"].items():
            if why not in told:
                told.append(why)
                lines.append(f"\n{side} not run: {why}")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pmoe", required=True, help="pmoe-bench all-to-all --device cuda's JSON")
    parser.add_argument("--torch", required=True, help="tools/torch_ata_bench.py --device cuda's JSON")
    parser.add_argument("--out", required=True, help="the merged JSON")
    args = parser.parse_args()
    pmoe, torch = load(args.pmoe), load(args.torch)
    if pmoe["config"].get("device") != "cuda":
        raise SystemExit(f"{args.pmoe}: not a pmoe-bench all-to-all --device cuda run")
    if torch["config"].get("device") != "cuda":
        raise SystemExit(f"{args.torch}: not a tools/torch_ata_bench.py --device cuda run")
    rows = merge(pmoe, torch, args.pmoe, args.torch)
    if not rows:
        raise SystemExit(f"{args.pmoe}: no dispatch, combine or dispatch_combine rows")
    doc = {"what": "mean time per call (µs), slowest rank; ratio = baseline / pmoe",
           "pmoe": {k: pmoe[k] for k in ("commit", "machine", "config")},
           "torch": {k: torch[k] for k in ("command", "commit", "machine", "torch", "config")},
           "rows": rows}
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    print(markdown(rows))


if __name__ == "__main__":
    main()
