"""pmoe dispatch/combine against the all-to-all PyTorch users write ("Torch AtA"), under torchrun.

    python3 tools/torch_ata_bench.py --ep 2,4 --tokens 1,128 --out bench/results/NAME
        launches `torchrun --standalone --nproc-per-node W` for each W, writes NAME.json and
        NAME.md (by default the DeepSeek-V3 shape of pplx-kernels' dispatch/combine table:
        E = 256, top-k 8, H = 7168, bf16)

Both sides run in the same processes, on the same inputs, under the same protocol: a barrier
before every timed iteration, the iteration's time being the slowest rank's (an all-reduce MAX
at the end), warm-ups first. Both are checked against a plain reference before they are timed;
a wrong answer exits non-zero.

pmoe: pmoe.AllToAll on a pmoe.torch.communicator() (POSIX shared memory between the ranks of
this machine), with the caller's own torch tensors (the expert rows land in pmoe's padded
[E_local, W * max_tokens, H] layout).

Torch AtA, what a PyTorch user writes (gloo on the CPU):
    dispatch: sort the token copies by expert (x[token_of_slot]), all_to_all_single the
              per-expert counts, all_to_all_single the rows with per-rank splits, regroup the
              received rows by local expert (a stable sort: rows of one expert stay in (source
              rank, token) order, the same order as pmoe's)
    combine:  the reverse: un-regroup, all_to_all_single back, then y = sum of weight * row per
              token (index_add_ in f32, rounded to bf16 once)

--device cuda: Torch AtA alone, on CUDA tensors with the NCCL backend, one GPU per rank (NCCL
refuses two ranks of one communicator on one GPU, so an EP size larger than the GPU count is
skipped and the JSON's "skipped" says why); a CUDA synchronize closes each timed iteration.
pmoe's GPU times come from `pmoe-bench all-to-all --device cuda` in the same run, and
tools/ata_ratios.py puts the two side by side (scripts/device_checks.sh, part bench).
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time

from bench_output import git_commit, load_average, machine, write_results


def worker(args):
    import torch
    import torch.distributed as dist

    cuda = args.device == "cuda"
    torch.set_num_threads(1)
    if cuda:
        dev = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(dev)
    else:
        import pmoe
        import pmoe.torch as pt
        dev = torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(seconds=300))
    rank, W = dist.get_rank(), dist.get_world_size()
    comm = None if cuda else pt.communicator()
    E, k, H = args.experts, args.top_k, args.hidden
    L = E // W
    dtype = torch.bfloat16
    results = []

    def sync():
        if cuda:
            torch.cuda.synchronize(dev)

    def timed(fn):
        times = []
        for i in range(args.warmup + args.iters):
            dist.barrier()
            sync()
            start = time.perf_counter()
            fn()
            sync()
            if i >= args.warmup:
                times.append(time.perf_counter() - start)
        slowest = torch.tensor(times, dtype=torch.float64, device=dev)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        return [t * 1e6 for t in slowest.tolist()]

    for m in args.tokens:
        gen = torch.Generator().manual_seed(1000 + m)
        xs, idxs, ws = [], [], []
        for _ in range(W):
            xs.append(torch.randn(m, H, generator=gen).to(dtype))
            idxs.append(torch.stack([torch.randperm(E, generator=gen)[:k] for _ in range(m)]))
            ws.append(torch.rand(m, k, generator=gen))
        x, idx, w = xs[rank].to(dev), idxs[rank].to(dev), ws[rank].to(dev)
        idx32 = idx.to(torch.int32)
        scale = (1 + torch.arange(L, dtype=torch.float32, device=dev) / L + rank).view(L, 1)  # expert

        # Reference: each local expert's rows in (source rank, token) order, and y.
        want_rows = [[xs[r][t] for r in range(W) for t in range(m) if (idxs[r][t] == rank * L + e)
                      .any()] for e in range(L)]
        all_scales = torch.cat([(1 + torch.arange(L, dtype=torch.float32) / L + r)
                                for r in range(W)])
        want_y = torch.zeros(m, H)
        for j in range(k):
            e = idxs[rank][:, j]
            rows = (xs[rank].float() * all_scales[e].view(m, 1)).to(dtype).float()
            want_y += ws[rank][:, j:j + 1] * rows

        def check(name, expert_rows, counts, y):
            for e in range(L):
                if int(counts[e]) != len(want_rows[e]):
                    raise SystemExit(f"{name}: rank {rank} expert {e}: {int(counts[e])} rows, "
                                     f"want {len(want_rows[e])}")
                if want_rows[e] and not torch.equal(expert_rows(e).cpu(),
                                                    torch.stack(want_rows[e])):
                    raise SystemExit(f"{name}: rank {rank} expert {e}: wrong rows")
            err = (y.float().cpu() - want_y).abs().max().item() if m else 0.0
            if err > 2e-2 * max(want_y.abs().max().item(), 1e-3):
                raise SystemExit(f"{name}: rank {rank}: combine off by {err}")

        # pmoe, on preallocated tensors (as a layer would keep them); on CUDA, pmoe-bench.
        if not cuda:
            a2a = pmoe.AllToAll(comm, max_tokens=m, num_experts=E, top_k=k,
                                hidden_dim=H, in_dtype="bf16", out_dtype="bf16")
            counts = torch.zeros(L, dtype=torch.int32)
            expert_x = torch.zeros(L, W * m, H, dtype=dtype)
            expert_y = torch.zeros(L, W * m, H, dtype=dtype)
            y = torch.zeros(m, H, dtype=dtype)
            a2a.dispatch(x, idx32, counts, expert_x)
            expert_y.copy_((expert_x.float() * scale.view(L, 1, 1)).to(dtype))
            a2a.combine(expert_y, idx32, w, y)
            check("pmoe", lambda e: expert_x[e, :int(counts[e])], counts, y)

        # Torch AtA.
        state = {}

        def torch_dispatch():
            flat = idx.flatten()
            order = torch.argsort(flat, stable=True)  # copies sorted by expert
            token_of = torch.div(order, k, rounding_mode="floor")
            send = x[token_of]
            per_expert = torch.bincount(flat, minlength=E)
            recv_per_expert = torch.empty_like(per_expert)
            dist.all_to_all_single(recv_per_expert, per_expert)
            send_splits = per_expert.view(W, L).sum(1).tolist()
            recv_counts = recv_per_expert.view(W, L)
            recv_splits = recv_counts.sum(1).tolist()
            recv = torch.empty(sum(recv_splits), H, dtype=dtype, device=dev)
            dist.all_to_all_single(recv, send, recv_splits, send_splits)
            # Received rows are ordered (source rank, expert, token): regroup by expert.
            expert_of_row = torch.repeat_interleave(
                torch.arange(L, device=dev).repeat(W), recv_counts.flatten())
            regroup = torch.argsort(expert_of_row, stable=True)
            state.update(order=order, token_of=token_of, send_splits=send_splits,
                         recv_splits=recv_splits, regroup=regroup,
                         counts=recv_counts.sum(0))
            state["rows"] = recv[regroup]

        def torch_combine():
            rows = state["out_rows"]
            back = torch.empty_like(rows)
            back[state["regroup"]] = rows  # undo the regroup
            returned = torch.empty(len(state["order"]), H, dtype=dtype, device=dev)
            dist.all_to_all_single(returned, back, state["send_splits"], state["recv_splits"])
            weight = w.flatten()[state["order"]].view(-1, 1)
            acc = torch.zeros(m, H, device=dev)
            acc.index_add_(0, state["token_of"], returned.float() * weight)
            state["y"] = acc.to(dtype)

        def torch_experts():
            starts = torch.cumsum(state["counts"], 0) - state["counts"]
            local_expert = torch.repeat_interleave(torch.arange(L, device=dev), state["counts"])
            state["out_rows"] = (state["rows"].float() * scale[local_expert]).to(dtype)
            state["starts"] = starts

        torch_dispatch()
        torch_experts()
        torch_combine()
        check("torch", lambda e: state["rows"][int(state["starts"][e]):
                                               int(state["starts"][e] + state["counts"][e])],
              state["counts"], state["y"])

        # The timed loops: each op alone, then the round trip, both sides alike.
        def pmoe_dispatch():
            a2a.dispatch(x, idx32, counts, expert_x)

        def pmoe_combine():
            a2a.combine(expert_y, idx32, w, y)

        # pmoe's op alternates dispatch -> combine: time each with its partner outside the clock.
        t_d, t_c = [], []
        for i in range(0 if cuda else args.warmup + args.iters):
            dist.barrier()
            s = time.perf_counter()
            pmoe_dispatch()
            d = time.perf_counter() - s
            dist.barrier()
            s = time.perf_counter()
            pmoe_combine()
            c = time.perf_counter() - s
            if i >= args.warmup:
                t_d.append(d)
                t_c.append(c)
        rows = {}
        if not cuda:
            for name, ts in (("dispatch", t_d), ("combine", t_c)):
                slowest = torch.tensor(ts, dtype=torch.float64)
                dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
                rows[("pmoe", name)] = [t * 1e6 for t in slowest.tolist()]
            rows[("pmoe", "dispatch_combine")] = timed(lambda: (pmoe_dispatch(), pmoe_combine()))
        rows[("torch_ata", "dispatch")] = timed(torch_dispatch)
        torch_experts()
        rows[("torch_ata", "combine")] = timed(torch_combine)
        rows[("torch_ata", "dispatch_combine")] = timed(
            lambda: (torch_dispatch(), torch_experts(), torch_combine()))
        for (impl, op), us in rows.items():
            results.append({"impl": impl, "op": op, "ep": W, "tokens": m, "device": args.device,
                            "us": us,
                            "mean_us": statistics.fmean(us), "std_us": statistics.pstdev(us),
                            "median_us": statistics.median(us)})
        if not cuda:
            del a2a, expert_x, expert_y
    if rank == 0:
        with open(args.worker_out, "w") as f:
            json.dump(results, f)
    dist.barrier()
    dist.destroy_process_group()


def markdown(doc):
    lines = [f"# pmoe vs Torch AtA under torchrun: E={doc['config']['experts']}, "
             f"top-k={doc['config']['top_k']}, H={doc['config']['hidden']}, bf16", "",
             f"Command: `{doc['command']}`  ",
             f"Commit: {doc['commit']}. Machine: {doc['machine']['cpu']}, "
             f"{doc['machine']['cores']} cores. torch {doc['torch']}.  ",
             f"Load before: {doc['load_before']}; after: {doc['load_after']}.", "",
             f"{doc['config']['iters']} timed iterations after {doc['config']['warmup']} warm-ups; "
             "barrier before each; an iteration's time is the slowest rank's. mean ± std (µs). "
             + ("Ranks are processes, one GPU each (Torch AtA: NCCL on CUDA tensors; pmoe's GPU "
                "rows come from pmoe-bench all-to-all --device cuda)."
                if doc["config"]["device"] == "cuda" else
                "Ranks are processes of one machine (pmoe: POSIX shared memory; Torch AtA: gloo)."),
             ""] + [f"Skipped: {s['reason']}.  " for s in doc["skipped"]] + [""]
    table = {(r["impl"], r["op"], r["ep"], r["tokens"]): r for r in doc["rows"]}
    eps = sorted({r["ep"] for r in doc["rows"]})
    for m in sorted({r["tokens"] for r in doc["rows"]}):
        lines += [f"## {m} token(s) per rank", "",
                  "| op | " + " | ".join(f"EP{w}" for w in eps) + " |",
                  "|---|" + "---:|" * len(eps)]
        for impl in ("pmoe", "torch_ata"):
            for op in ("dispatch", "combine", "dispatch_combine"):
                cells = [table.get((impl, op, w, m)) for w in eps]
                lines.append(f"| {impl} {op} | " + " | ".join(
                    f"{c['mean_us']:.1f} ± {c['std_us']:.1f}" if c else "" for c in cells) + " |")
        for op in ("dispatch", "combine", "dispatch_combine"):
            cells = []
            for w in eps:
                a, b = table.get(("pmoe", op, w, m)), table.get(("torch_ata", op, w, m))
                cells.append(f"{a['mean_us'] / b['mean_us']:.3f}" if a and b else "")
            lines.append(f"| ratio pmoe / Torch AtA, {op} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ep", default="2,4")
    parser.add_argument("--tokens", default="1,128")
    parser.add_argument("--experts", type=int, default=256)
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=7168)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="cuda: Torch AtA on CUDA tensors with NCCL, one GPU per rank")
    parser.add_argument("--out", help="write OUT.json and OUT.md")
    parser.add_argument("--worker-out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.tokens = [int(t) for t in args.tokens.split(",")]
    if args.worker_out:
        return worker(args)

    import torch
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    load_before = load_average()
    rows, skipped = [], []
    for w in [int(e) for e in args.ep.split(",")]:
        gpus = torch.cuda.device_count() if args.device == "cuda" else 0
        if args.device == "cuda" and gpus < w:
            why = (f"EP{w} on CUDA needs {w} GPUs, one a rank (NCCL refuses two ranks of one "
                   f"communicator on one GPU); this machine has {gpus}")
            print(f"torch_ata_bench: skipped: {why}", flush=True)
            skipped.append({"ep": w, "reason": why})
            continue
        part = f"/tmp/torch_ata_bench.{os.getpid()}.{w}.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={w}", os.path.abspath(__file__), "--worker-out", part,
               "--tokens", ",".join(map(str, args.tokens)), "--experts", str(args.experts),
               "--top-k", str(args.top_k), "--hidden", str(args.hidden),
               "--warmup", str(args.warmup), "--iters", str(args.iters), "--device", args.device]
        env = dict(os.environ, OMP_NUM_THREADS="1")
        subprocess.run(cmd, check=True, env=env)
        with open(part) as f:
            rows += json.load(f)
        os.remove(part)
    commit = git_commit(root)
    doc = {"command": "python3 " + " ".join(sys.argv), "commit": commit,
           "machine": machine(args.device == "cuda"),
           "torch": torch.__version__, "load_before": load_before,
           "load_after": load_average(),
           "config": {"experts": args.experts, "top_k": args.top_k, "hidden": args.hidden,
                      "warmup": args.warmup, "iters": args.iters, "dtype": "bf16",
                      "device": args.device},
           "skipped": skipped, "rows": rows}
    write_results(doc, markdown(doc), args.out)


if __name__ == "__main__":
    main()
