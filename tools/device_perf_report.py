"""The report of scripts/device_perf.sh: pmoe's exchange beside torch's local exchange and a copy of
the same bytes, the targets beside the results, and each exchange kernel's time and top
stall reasons as ncu measured them at EP1.

    python3 tools/device_perf_report.py --gpu NAME --pmoe BENCH.json [--pmoe MORE.json]
        [--torch TORCH.json] [--ncu TOKENS=RAW.csv ...] [--predicted EMULATED.json ...]
        [--model-gpu h100-sxm|h200] --out OUT
        writes OUT.md (printed too) and OUT.json
    python3 tools/device_perf_report.py --self-test
        parses a small ncu CSV written here in ncu's raw-page layout (the dry run's check)

Inputs: pmoe-bench all-to-all --device cuda's JSON (rows dispatch, combine, dispatch_combine and
nccl_alltoallv, times of the slowest rank, ranks sharing the GPU); tools/torch_local_exchange.py's
JSON; `ncu --import REPORT --csv --page raw --print-units base` of runs at EP1; and the kernel
model's predictions: pmoe-bench JSONs of runs on the emulated device with --gpu (each op row's
kernel_counts.predicted[GPU]: kernel_us for a graph replay, host_us with the host's launches, each
kernel's µs), printed beside every measurement of the model's GPU (--model-gpu, else named from
--gpu: H200 -> h200, H100 -> h100-sxm), so every run checks the model. Missing inputs are
reported as not measured. The exit status is 0 whether targets are met or not (they are printed,
met or NOT met); 2 where an input cannot be read.
"""
import argparse
import csv
import io
import json
import re
import statistics
import sys

# The targets. Times: pmoe-bench's median over the timed iterations
# of the slowest rank. Copy fraction: the copy of the same bytes' median time over pmoe's.
TARGETS = [
    ("EP1, 1 token, dispatch", 1, 1, "dispatch", "us", 15.0),
    ("EP1, 1 token, combine", 1, 1, "combine", "us", 15.0),
    ("EP1, 128 tokens, dispatch", 1, 128, "dispatch", "us", 25.0),
    ("EP1, 128 tokens, combine", 1, 128, "combine", "us", 25.0),
    ("EP8 sharing the GPU, 128 tokens, dispatch", 8, 128, "dispatch", "us", 80.0),
    ("EP8 sharing the GPU, 128 tokens, combine", 8, 128, "combine", "us", 80.0),
    ("EP1, 1024 tokens, dispatch, fraction of a copy of its bytes", 1, 1024, "dispatch",
     "copy_fraction", 0.5),
    ("EP1, 1024 tokens, combine, fraction of a copy of its bytes", 1, 1024, "combine",
     "copy_fraction", 0.5),
]

# The exchange kernels, as scripts/device_perf.sh's ncu filter names them.
STALL = re.compile(r"^smsp__average_warps_issue_stalled_(\w+)_per_issue_active\.ratio$")


def number(text):
    """ncu's cell as a float (thousands separators dropped), or None."""
    try:
        return float(str(text).replace(",", ""))
    except ValueError:
        return None


def parse_ncu(text):
    """Kernel name -> {launches, duration_us (median), grid, block, registers, dram_pct, stalls:
    [(reason, cycles per issue)] by cycles, most first} from ncu's raw page as CSV."""
    lines = [line for line in text.splitlines() if line.startswith('"')]  # no ==PROF== lines
    table = list(csv.reader(io.StringIO("\n".join(lines))))
    if not table:
        return {}
    header = table[0]
    if "Kernel Name" not in header:
        raise ValueError("no 'Kernel Name' column: not ncu's raw page")
    col = {name: i for i, name in enumerate(header)}
    units = {}
    launches = {}
    for row in table[1:]:
        if len(row) != len(header):
            continue
        is_units = number(row[col["ID"]]) is None if "ID" in col else not row[col["Kernel Name"]]
        if is_units:  # the row under the header: each metric's unit
            units = {header[i]: u for i, u in enumerate(row)}
            continue
        launches.setdefault(row[col["Kernel Name"]], []).append(row)

    def value(row, metric):
        return number(row[col[metric]]) if metric in col else None

    def duration_us(row):
        v = value(row, "gpu__time_duration.sum")
        if v is None:
            return None
        unit = units.get("gpu__time_duration.sum", "nsecond")
        scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3,
                 "ms": 1e3, "second": 1e6, "s": 1e6}.get(unit, 1e-3)
        return v * scale

    kernels = {}
    for name, rows in launches.items():
        durations = [d for d in (duration_us(r) for r in rows) if d is not None]
        stalls = {}
        for metric in header:
            m = STALL.match(metric)
            if not m or m.group(1) == "selected":  # selected: issuing, not a stall
                continue
            vals = [v for v in (value(r, metric) for r in rows) if v is not None]
            if vals:
                stalls[m.group(1)] = statistics.median(vals)
        first = rows[0]
        kernels[name] = {
            "launches": len(rows),
            "duration_us": statistics.median(durations) if durations else None,
            "duration_us_min": min(durations) if durations else None,
            "grid": first[col["Grid Size"]] if "Grid Size" in col else None,
            "block": first[col["Block Size"]] if "Block Size" in col else None,
            "registers": value(first, "launch__registers_per_thread"),
            "dram_pct": value(first, "dram__throughput.avg.pct_of_peak_sustained_elapsed"),
            "stalls": sorted(stalls.items(), key=lambda kv: -kv[1]),
        }
    return kernels


def load_pmoe(paths):
    """(W, m, op) -> pmoe-bench row, over every JSON given; and the first JSON's machine."""
    rows, machine = {}, None
    for path in paths:
        try:
            with open(path) as f:
                doc = json.load(f)
        except (OSError, ValueError) as e:
            print(f"device_perf_report: {path}: {e}; its rows are not measured", file=sys.stderr)
            continue
        machine = machine or doc.get("machine")
        for r in doc["rows"]:
            rows[(r["ranks"], r["tokens"], r["op"])] = r
    return rows, machine


def load_torch(path):
    if not path:
        return {}
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        print(f"device_perf_report: {path}: {e}; torch and copy not measured", file=sys.stderr)
        return {}
    return {(r["ep"], r["tokens"], r["op"]): r for r in doc["rows"]}


def model_gpu_for(name):
    """The kernel model's GPU for nvidia-smi's name, or None."""
    upper = (name or "").upper()
    return "h200" if "H200" in upper else "h100-sxm" if "H100" in upper else None


def load_predicted(paths, gpu):
    """(W, m, op) -> {kernel_us, host_us, copy_fraction, kernels: {name: µs}, commit} for `gpu`,
    from pmoe-bench JSONs of the emulated device run with --gpu."""
    out = {}
    for path in paths or []:
        try:
            with open(path) as f:
                doc = json.load(f)
        except (OSError, ValueError) as e:
            print(f"device_perf_report: {path}: {e}; no predictions from it", file=sys.stderr)
            continue
        commit = doc.get("commit")
        for r in doc["rows"]:
            p = ((r.get("kernel_counts") or {}).get("predicted") or {}).get(gpu)
            if p:
                out[(r["ranks"], r["tokens"], r["op"])] = {
                    "kernel_us": p["kernel_us"], "host_us": p["host_us"],
                    "copy_fraction": p.get("copy_fraction"), "commit": commit,
                    "kernels": {k["kernel"]: k["total_us"] for k in p["kernels"]}}
    return out


def kernel_base(name):
    """ncu's kernel name without template arguments or parameters: reduce_rows<...> -> reduce_rows."""
    return re.split(r"[<(]", name, maxsplit=1)[0].split("::")[-1].strip()


def ratio(a, b):
    return a / b if a and b else None


def fmt(v, spec=".1f"):
    return "–" if v is None else format(v, spec)


def build(args):
    pmoe, machine = load_pmoe(args.pmoe)
    torch = load_torch(args.torch)
    model_gpu = args.model_gpu or model_gpu_for(args.gpu)
    predicted = load_predicted(args.predicted, model_gpu) if model_gpu else {}
    configs = sorted({(W, m) for (W, m, op) in pmoe if op in ("dispatch", "combine")})
    rows = []
    for W, m in configs:
        for op in ("dispatch", "combine"):
            p = pmoe.get((W, m, op))
            t = torch.get((W, m, op))
            h = pmoe.get((W, m, op + "_host"))
            pred = predicted.get((W, m, op)) or {}
            pm = p.get("median_us") if p else None
            hm = h.get("median_us") if h else None
            tm = t["torch"]["median_us"] if t else None
            cm = t["copy"]["median_us"] if t else None
            rows.append({
                "ep": W, "tokens": m, "op": op,
                "pmoe_median_us": pm, "pmoe_mean_us": p.get("mean_us") if p else None,
                "torch_median_us": tm, "copy_median_us": cm,
                "copy_bytes": t["copy_bytes"] if t else None,
                "pmoe_over_torch": pm / tm if pm and tm else None,
                "pmoe_over_copy": pm / cm if pm and cm else None,
                "copy_fraction": cm / pm if pm and cm else None,
                "bench_copy_fraction": p.get("copy_fraction") if p else None,
                "pmoe_host_median_us": hm,
                "predicted_us": pred.get("kernel_us"), "predicted_host_us": pred.get("host_us"),
                "predicted_copy_fraction": pred.get("copy_fraction"),
                "measured_over_predicted": ratio(pm, pred.get("kernel_us")),
                "host_measured_over_predicted": ratio(hm, pred.get("host_us")),
            })
    nccl = []
    for W, m in configs:
        dc, nv = pmoe.get((W, m, "dispatch_combine")), pmoe.get((W, m, "nccl_alltoallv"))
        if dc and nv:
            nccl.append({"ep": W, "tokens": m, "pmoe_round_trip_median_us": dc.get("median_us"),
                         "nccl_alltoallv_median_us": nv.get("median_us"),
                         "not_run": nv.get("not_run")})
    by = {(r["ep"], r["tokens"], r["op"]): r for r in rows}
    targets = []
    for label, W, m, op, kind, goal in TARGETS:
        r = by.get((W, m, op))
        if kind == "us":
            value = r["pmoe_median_us"] if r else None
            met = None if value is None else value <= goal
            goal_text = f"<= {goal:g} µs"
        else:
            value = r["copy_fraction"] if r else None
            met = None if value is None else value >= goal
            goal_text = f">= {goal:g}"
        targets.append({"target": label, "goal": goal_text, "value": value, "met": met,
                        "pmoe_mean_us": r["pmoe_mean_us"] if r else None,
                        "predicted": (r["predicted_us"] if kind == "us"
                                      else r["predicted_copy_fraction"]) if r else None})
    ncu = {}
    for spec in args.ncu or []:
        tokens, _, path = spec.partition("=")
        try:
            with open(path) as f:
                ncu[tokens] = parse_ncu(f.read())
        except (OSError, ValueError) as e:
            ncu[tokens] = {"error": f"{path}: {e}"}
    for tokens, kernels in ncu.items():
        pred = (predicted.get((1, int(tokens), "dispatch")) or {}).get("kernels", {}).copy()
        pred.update((predicted.get((1, int(tokens), "combine")) or {}).get("kernels", {}))
        for name, k in kernels.items():
            if name != "error":
                k["predicted_us"] = pred.get(kernel_base(name))
    commits = sorted({p["commit"] for p in predicted.values() if p.get("commit")})
    return {"gpu": args.gpu, "machine": machine, "targets": targets, "rows": rows,
            "nccl": nccl, "ncu_ep1": ncu, "model_gpu": model_gpu,
            "predicted_from": {"files": args.predicted or [], "commits": commits}}


def markdown(doc):
    out = [f"## The exchange's performance part on {doc['gpu']} (scripts/device_perf.sh)", "",
           "pmoe: `pmoe-bench all-to-all --device cuda`, E 256, top-8, H 7168, bf16, ranks sharing "
           "the GPU, median (mean) of the slowest rank's times; torch: one process exchanging the "
           "same rows (EP x tokens of them) with index_select / index_add_ in f32; copy: one "
           "device-to-device copy of the bytes pmoe-bench counts for the op on all ranks "
           "(tools/torch_local_exchange.py). pmoe µs: events around a replay of the op captured "
           "in a CUDA graph (the kernels' time); host µs: events recorded before the host's "
           "launches. predicted: the kernel model (tools/pmoe-bench/kernel_model.hpp) for "
           f"{doc['model_gpu'] or 'no GPU it knows'}, from the counts of the emulated device "
           f"({', '.join(doc['predicted_from']['files']) or 'none given'}; commit "
           f"{', '.join(doc['predicted_from']['commits']) or '?'}): measured/predicted within "
           "0.5..2 is the model holding.", "",
           "### Targets", "", "| target | goal | measured | predicted | met |",
           "|---|---|---|---|---|"]
    for t in doc["targets"]:
        value = "not measured" if t["value"] is None else (
            f"{t['value']:.1f} µs (mean {fmt(t['pmoe_mean_us'])})" if "µs" in t["goal"]
            else f"{t['value']:.2f}")
        met = {None: "not measured", True: "met", False: "NOT met"}[t["met"]]
        spec = ".1f" if "µs" in t["goal"] else ".2f"
        out.append(f"| {t['target']} | {t['goal']} | {value} | {fmt(t['predicted'], spec)} | {met} |")
    met = sum(t["met"] is True for t in doc["targets"])
    measured = sum(t["met"] is not None for t in doc["targets"])
    out += ["", f"{met} of {len(doc['targets'])} targets met ({measured} measured).", "",
            "### pmoe, torch and a copy of the same bytes", "",
            "| EP | tokens/rank | op | pmoe µs | predicted µs | measured/predicted | host µs | "
            "predicted host µs | measured/predicted | torch µs | copy µs | pmoe/torch | "
            "pmoe/copy | copy/pmoe | pmoe-bench's copy_fraction |",
            "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in doc["rows"]:
        out.append(f"| {r['ep']} | {r['tokens']} | {r['op']} | {fmt(r['pmoe_median_us'])} | "
                   f"{fmt(r['predicted_us'])} | {fmt(r['measured_over_predicted'], '.2f')} | "
                   f"{fmt(r['pmoe_host_median_us'])} | {fmt(r['predicted_host_us'])} | "
                   f"{fmt(r['host_measured_over_predicted'], '.2f')} | "
                   f"{fmt(r['torch_median_us'])} | {fmt(r['copy_median_us'])} | "
                   f"{fmt(r['pmoe_over_torch'], '.2f')} | {fmt(r['pmoe_over_copy'], '.2f')} | "
                   f"{fmt(r['copy_fraction'], '.2f')} | {fmt(r['bench_copy_fraction'], '.2f')} |")
    if doc["nccl"]:
        out += ["", "### NCCL all-to-all-v of the same rows (pmoe-bench's nccl_alltoallv row)", "",
                "| EP | tokens/rank | pmoe dispatch+combine µs | NCCL all-to-all-v µs | why not run |",
                "|---:|---:|---:|---:|---|"]
        for r in doc["nccl"]:
            out.append(f"| {r['ep']} | {r['tokens']} | {fmt(r['pmoe_round_trip_median_us'])} | "
                       f"{fmt(r['nccl_alltoallv_median_us'])} | {r['not_run'] or ''} |")
    out += ["", "### Exchange kernels at EP1 (ncu: every launch of the check and one timed "
            "iteration, caches flushed, clocks as found)"]
    if not doc["ncu_ep1"]:
        out += ["", "ncu: not run."]
    for tokens, kernels in doc["ncu_ep1"].items():
        out += ["", f"{tokens} token{'s' if tokens != '1' else ''} a rank:", ""]
        if "error" in kernels:
            out.append(f"ncu: {kernels['error']}")
            continue
        if not kernels:
            out.append("ncu profiled no kernel whose name the filter matches.")
            continue
        out += ["| kernel | launches | µs (median) | predicted µs (a call's launches) | grid x block | "
                "regs | DRAM % of peak | top stalls (warp cycles per issued instruction) |",
                "|---|---:|---:|---:|---|---:|---:|---|"]
        for name, k in sorted(kernels.items(), key=lambda kv: -(kv[1]["duration_us"] or 0)):
            stalls = ", ".join(f"{reason} {v:.1f}" for reason, v in k["stalls"][:3]) or "–"
            out.append(f"| {name} | {k['launches']} | {fmt(k['duration_us'], '.2f')} | "
                       f"{fmt(k.get('predicted_us'), '.2f')} | "
                       f"{k['grid']} x {k['block']} | {fmt(k['registers'], '.0f')} | "
                       f"{fmt(k['dram_pct'])} | {stalls} |")
    return "\n".join(out) + "\n"


SELF_TEST_CSV = '''==PROF== Connected to process 1 (pmoe-bench)
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","dram__throughput.avg.pct_of_peak_sustained_elapsed","gpu__time_duration.sum","launch__registers_per_thread","smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio","smsp__average_warps_issue_stalled_selected_per_issue_active.ratio","smsp__average_warps_issue_stalled_wait_per_issue_active.ratio"
"","","","","","","","","","","","%","nsecond","register/thread","inst","inst","inst"
"0","7","pmoe-bench","h","send_tokens","1","13","(256, 1, 1)","(264, 1, 1)","0","9.0","12.5","5,120","40","3.5","1","0.5"
"1","7","pmoe-bench","h","land_rows","1","13","(256, 1, 1)","(264, 1, 1)","0","9.0","30.1","3,000","32","1.2","1","2.5"
"2","7","pmoe-bench","h","send_tokens","1","13","(256, 1, 1)","(264, 1, 1)","0","9.0","12.0","4,880","40","3.1","1","0.7"
'''


def self_test():
    kernels = parse_ncu(SELF_TEST_CSV)
    send, land = kernels["send_tokens"], kernels["land_rows"]
    assert send["launches"] == 2 and abs(send["duration_us"] - 5.0) < 1e-9, send
    assert [r for r, _ in send["stalls"]] == ["long_scoreboard", "wait"], send["stalls"]
    assert land["stalls"][0][0] == "wait" and land["registers"] == 32, land
    print("device_perf_report: self-test passed (ncu raw CSV: 2 kernels, durations in µs, stalls "
          "ranked, 'selected' left out)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gpu", default="unknown GPU")
    parser.add_argument("--pmoe", action="append", default=[])
    parser.add_argument("--torch")
    parser.add_argument("--ncu", action="append", help="TOKENS=CSV, ncu's raw page at EP1")
    parser.add_argument("--predicted", action="append", default=[],
                        help="pmoe-bench JSON of the emulated device run with --gpu")
    parser.add_argument("--model-gpu", help="the kernel model's GPU (default: from --gpu)")
    parser.add_argument("--out", help="write OUT.md and OUT.json")
    parser.add_argument("--self-test", action="store_true")
    args = parser.parse_args()
    if args.self_test:
        self_test()
        return
    if not args.pmoe:
        parser.error("--pmoe is required")
    doc = build(args)
    text = markdown(doc)
    print(text)
    if args.out:
        with open(args.out + ".md", "w") as f:
            f.write(text)
        with open(args.out + ".json", "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
