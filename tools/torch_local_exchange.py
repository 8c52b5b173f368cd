"""Torch's exchange of pmoe's rows on one GPU, in one process, and a device-to-device copy of the
same bytes: the yardsticks of scripts/device_perf.sh for `pmoe-bench all-to-all --device cuda`.

    python3 tools/torch_local_exchange.py --pmoe BENCH.json [--pmoe MORE.json] --out OUT
        [--device cuda] [--experts 256 --top-k 8 --hidden 7168] [--warmup 5 --iters 50]

For every EP size W and tokens per rank m of pmoe-bench's JSON (ranks sharing the GPU, so the GPU
holds W * m tokens in all), with T = W * m tokens of H bf16 values, each routed to top-k of E
experts (distinct, uniformly drawn, as pmoe-bench's random routing):
  dispatch  the (token, slot) pairs sorted by expert (a stable sort: rows of one expert stay in
            token order, as pmoe orders them), each expert's row count (bincount), and the rows
            gathered in that order with index_select: every expert's rows are local, so this is the
            all-to-all of one process, with no communication;
  combine   y[t] = sum_j w[t, j] * row(t, j), the rows scaled in f32 and summed with index_add_
            in f32, rounded to bf16 once;
  copy      Tensor.copy_ of half the bytes pmoe-bench counts for the op, summed over the W ranks
            (read + written = the op's bytes), one device-to-device copy: how fast the GPU moves
            what the op must move.
A one-process stand-in: what a PyTorch user gets for the same rows without any exchange (the
rows never leave the GPU), and a lower bound for the NCCL all-to-all a torch EP layer would add.

Timed as pmoe-bench times its ops (tools/pmoe-bench/all_to_all_cuda.cpp, time_on_stream): the
stream synchronized, an event recorded, the op issued from the host, an event recorded, the
elapsed time read; `warmup` untimed rounds first; median and mean of `iters`. So host launch
overhead counts on both sides. Checked before timing: the gathered rows equal x's rows in
(expert, token) order and y matches a float64 reference within bf16 rounding; a wrong result
exits non-zero. OUT.json holds the rows; OUT.md the table. --device cpu runs the same code on
the CPU (the dry run's check of this script; its times mean nothing).
"""
import argparse
import json
import statistics
import sys
import time

from bench_output import machine, write_results


def load_pmoe_rows(paths):
    """(W, m) -> {op: (mean_us, bytes summed over the W ranks)} for dispatch and combine, from
    pmoe-bench's JSON (a row's gbps is its per-rank bytes over its mean time)."""
    configs = {}
    for path in paths:
        with open(path) as f:
            doc = json.load(f)
        for r in doc["rows"]:
            if r["op"] not in ("dispatch", "combine") or r.get("mean_us") is None:
                continue
            per_rank = r["gbps"] * r["mean_us"] * 1e3 if r.get("gbps") else None
            configs.setdefault((r["ranks"], r["tokens"]), {})[r["op"]] = (
                r["mean_us"], per_rank * r["ranks"] if per_rank else None)
    return configs


def worker(args, configs):
    import torch

    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    if cuda:
        torch.cuda.set_device(dev)
    E, k, H = args.experts, args.top_k, args.hidden
    row_bytes = 2 * H  # bf16
    gen = torch.Generator(device="cpu").manual_seed(7)

    def sync():
        if cuda:
            torch.cuda.current_stream().synchronize()

    def timed(fn):
        """pmoe-bench's protocol: sync, event, op, event, read; median and mean in µs."""
        times = []
        for i in range(args.warmup + args.iters):
            sync()
            if cuda:
                start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                stop.record()
                stop.synchronize()
                us = 1e3 * start.elapsed_time(stop)
            else:
                t0 = time.perf_counter()
                fn()
                us = 1e6 * (time.perf_counter() - t0)
            if i >= args.warmup:
                times.append(us)
        return {"median_us": statistics.median(times), "mean_us": statistics.fmean(times),
                "min_us": min(times)}

    rows = []
    for (W, m) in sorted(configs):
        T = W * m
        x = torch.randn(T, H, generator=gen).to(torch.bfloat16).to(dev)
        idx = torch.rand(T, E, generator=gen).argsort(dim=1)[:, :k].contiguous().to(dev)
        w = torch.rand(T, k, generator=gen).to(dev)
        flat = idx.reshape(-1)
        state = {}

        def dispatch():
            order = torch.argsort(flat, stable=True)
            state["token"] = torch.div(order, k, rounding_mode="floor")
            state["order"] = order
            state["counts"] = torch.bincount(flat, minlength=E)
            state["rows"] = x.index_select(0, state["token"])

        def combine():
            scaled = state["rows"].float() * w.reshape(-1).index_select(0, state["order"])[:, None]
            y32 = torch.zeros(T, H, dtype=torch.float32, device=dev)
            y32.index_add_(0, state["token"], scaled)
            state["y"] = y32.to(torch.bfloat16)

        # The check, once, before timing.
        dispatch()
        combine()
        sync()
        token, experts = state["token"].cpu(), flat.cpu().tolist()
        want_token = torch.tensor(sorted(range(T * k), key=lambda s: (experts[s], s))) // k
        if not torch.equal(token, want_token):
            raise SystemExit(f"torch dispatch: W={W} m={m}: rows out of (expert, token) order")
        if not torch.equal(state["rows"].cpu(), x.cpu()[token]):
            raise SystemExit(f"torch dispatch: W={W} m={m}: wrong rows")
        if int(state["counts"].sum()) != T * k:
            raise SystemExit(f"torch dispatch: W={W} m={m}: counts sum to {int(state['counts'].sum())}")
        x64, w64 = x.cpu().double(), w.cpu().double()
        ref = torch.zeros(T, H, dtype=torch.float64)
        for j in range(k):
            ref += w64[:, j:j + 1] * x64
        err = (state["y"].cpu().double() - ref).abs().max().item()
        if not err <= 2 ** -7 * max(ref.abs().max().item(), 1e-3):
            raise SystemExit(f"torch combine: W={W} m={m}: off by {err}")

        # Bytes each op must move, as pmoe-bench counts them, summed over the W ranks; where the
        # JSON has none, this routing's own count (every row local: T tokens read, T k rows written).
        own = {"dispatch": (T + T * k) * row_bytes, "combine": (T * k + T) * row_bytes}
        for op, fn in (("dispatch", dispatch), ("combine", combine)):
            pmoe_us, pmoe_bytes = configs[(W, m)].get(op, (None, None))
            copy_bytes = int(pmoe_bytes) if pmoe_bytes else own[op]
            half = max(copy_bytes // 2, 16)
            src = torch.empty(half, dtype=torch.uint8, device=dev).fill_(1)
            dst = torch.empty(half, dtype=torch.uint8, device=dev)
            torch_t = timed(fn)
            copy_t = timed(lambda: dst.copy_(src))
            rows.append({"ep": W, "tokens": m, "tokens_on_gpu": T, "op": op,
                         "torch": torch_t, "copy": copy_t, "copy_bytes": 2 * half,
                         "bytes_from": "pmoe-bench" if pmoe_bytes else "this routing",
                         "copy_gbps": 2 * half / (copy_t["median_us"] * 1e3)})
            del src, dst
        del x, idx, w, state
        if cuda:
            torch.cuda.empty_cache()
    return rows


def markdown(doc):
    lines = [f"Torch's local exchange and a D2D copy of the same bytes ({doc['device']}, "
             f"E {doc['experts']}, top-{doc['top_k']}, H {doc['hidden']}, bf16; "
             f"{doc['iters']} iterations)", "",
             "| EP | tokens/rank | tokens on GPU | op | torch median µs | copy median µs | copy MB | copy GB/s |",
             "|---:|---:|---:|---|---:|---:|---:|---:|"]
    for r in doc["rows"]:
        lines.append(f"| {r['ep']} | {r['tokens']} | {r['tokens_on_gpu']} | {r['op']} | "
                     f"{r['torch']['median_us']:.1f} | {r['copy']['median_us']:.1f} | "
                     f"{r['copy_bytes'] / 1e6:.2f} | {r['copy_gbps']:.0f} |")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pmoe", action="append", required=True,
                        help="pmoe-bench all-to-all JSON (repeatable): the (EP, tokens) to run")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    parser.add_argument("--experts", type=int, default=256)
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=7168)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--out", help="write OUT.json and OUT.md")
    args = parser.parse_args()
    configs = load_pmoe_rows(args.pmoe)
    if not configs:
        sys.exit("torch_local_exchange.py: no dispatch/combine rows in " + ", ".join(args.pmoe))
    rows = worker(args, configs)
    doc = {"machine": machine(args.device == "cuda"), "device": args.device,
           "experts": args.experts, "top_k": args.top_k, "hidden": args.hidden,
           "warmup": args.warmup, "iters": args.iters, "rows": rows}
    write_results(doc, markdown(doc), args.out)


if __name__ == "__main__":
    main()
