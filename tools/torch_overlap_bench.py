"""pmoe-bench ag-gemm / gemm-rs with one more row: the PyTorch way of the same op, under torchrun.

    python3 tools/torch_overlap_bench.py M N K --dtype float16 --ranks 2,4 --out bench/results/NAME
        for each W: runs `pmoe-bench ag-gemm` and `gemm-rs` at M N K on W ranks, then
        `torchrun --standalone --nproc-per-node W` for the PyTorch way of both; writes one table
        of both to stdout (and NAME.md, NAME.json)

The PyTorch way, on pmoe's shapes (include/pmoe/overlap.hpp), rank r of W:
    AllGather+GEMM:      A_r [M/W, K], B_r [K, N/W]:  all_gather_into_tensor(A [M, K], A_r), then
                         C_r = matmul(A, B_r)  [M, N/W]
    GEMM+ReduceScatter:  A_r [M, K/W], B_r [K/W, N]:  P = matmul(A_r, B_r) [M, N], then
                         reduce_scatter_tensor(C_r [M/W, N], P) (sum; rank r keeps block r's rows)
The inputs are pmoe-bench's, element for element: the same counter-based generator of the global
A [M, K] and B [K, N] (src/reference/overlap_reference.cpp, operand_value), cut the same way.

Device: CUDA tensors on GPU LOCAL_RANK with NCCL where torch.cuda.is_available() (pmoe-bench then
runs --device cuda under mpirun, one process per GPU, as torchrun places them), else CPU tensors
with gloo (pmoe-bench --device cpu: thread ranks, as by default, or with --pmoe-mpirun
processes). Where the backend lacks one of
the two collectives, an equivalent runs instead (all_gather into row views of A;
all_to_all_single + a sum in rank order), and the output names the op that ran.

Protocol, the one pmoe-bench uses: before and after timing, every rank's whole C_r is compared
with a float64 reference (on the rank's device) from the operands as stored, within pmoe's own
error bound (f32 accumulation over K, one rounding per value stored or sent in the dtype); a
wrong answer on any rank exits non-zero. Then warm-ups, and per iteration each step (collective
alone, GEMM alone, the two back to back) after a barrier (and, on a GPU, a device synchronize),
timed with CUDA events or perf_counter; an iteration's time is the slowest rank's (all-reduce
MAX); medians reported. On the CPU, torch gets as many threads per rank as pmoe's BLAS.
"""
import argparse
import datetime
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from bench_output import git_commit, load_average, machine, write_results

DTYPES = {"f32": "float32", "float32": "float32", "bf16": "bfloat16", "bfloat16": "bfloat16",
          "f16": "float16", "float16": "float16"}
OPS = ("ag-gemm", "gemm-rs")
STEPS = ("comm", "gemm", "total")
# What runs where the backend lacks a collective (or with --force-fallback).
FALLBACK = {"all_gather": "all_gather into row views",
            "reduce_scatter": "all_to_all_single + sum in rank order"}


# --- pmoe's inputs and error bound, in NumPy -------------------------------------------------

def hash64(seed, a, b, c):
    """pmoe::reference::hash64 (splitmix64's finaliser) on uint64 arrays, wrapping as in C++."""
    u = np.uint64
    with np.errstate(over="ignore"):
        z = (u(seed) ^ (a * u(0x9e3779b97f4a7c15)) ^ (b * u(0xc2b2ae3d27d4eb4f)) ^
             (c * u(0x165667b19e3779f9)))
        z = (z ^ (z >> u(30))) * u(0xbf58476d1ce4e5b9)
        z = (z ^ (z >> u(27))) * u(0x94d049bb133111eb)
    return z ^ (z >> u(31))


def operand(seed, which, rows, cols):
    """Global operand `which` (0: A, 1: B) at rows x cols (ranges): uniform in [-1, 1) as f32,
    exactly pmoe's operand_value before its rounding to the dtype (done by the caller)."""
    r = np.arange(rows.start, rows.stop, dtype=np.uint64).reshape(-1, 1)
    c = np.arange(cols.start, cols.stop, dtype=np.uint64).reshape(1, -1)
    bits = hash64(seed, np.uint64(0x0be7a00 + which), r, c) >> np.uint64(40)
    return (2.0 * bits.astype(np.float64) / float(1 << 24) - 1.0).astype(np.float32)  # exact


def tolerance(dtype, k, abs_products, rounded):
    """pmoe's allowed_error: f32 accumulation over k terms, plus roundings in the dtype."""
    unit = {"float32": 2.0 ** -23, "float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}[dtype]
    return 2.0 ** -24 * (k // 4 + 8) * abs_products + unit * rounded


# --- one torchrun rank ------------------------------------------------------------------------

def worker(args):
    import torch
    import torch.distributed as dist

    cuda = args.device == "cuda"
    if cuda:
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
        # pmoe accumulates in f32: keep cuBLAS from reducing in 16 bits or multiplying in TF32.
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    else:
        device = torch.device("cpu")
        torch.set_num_threads(args.threads)
    dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(seconds=300),
                            device_id=device if cuda else None)
    rank, W = dist.get_rank(), dist.get_world_size()
    M, N, K = args.m, args.n, args.k
    dtype = getattr(torch, DTYPES[args.dtype])

    def stored(which, rows, cols):  # the operand as pmoe-bench stores it, rounded to dtype
        return torch.from_numpy(operand(args.seed, which, rows, cols)).to(dtype)

    def all_gather(out, part):
        if ops["all_gather"] == "all_gather_into_tensor":
            dist.all_gather_into_tensor(out, part)
        else:
            dist.all_gather(list(out.chunk(W)), part)

    def reduce_scatter(out, full):
        if ops["reduce_scatter"] == "reduce_scatter_tensor":
            dist.reduce_scatter_tensor(out, full)
        else:  # block b's rows from every rank, summed in rank order
            blocks = torch.empty_like(full)
            dist.all_to_all_single(blocks, full)
            torch.sum(blocks.view(W, M // W, N), dim=0, out=out)

    # Which collectives this backend has: each tried once (the same on every rank); where the
    # call fails, its fallback runs.
    ops = dict(FALLBACK)
    probe = torch.zeros(2 * W, 2, dtype=dtype, device=device)
    for name, want, call in (
            ("all_gather", "all_gather_into_tensor",
             lambda: dist.all_gather_into_tensor(probe, probe[:2].clone())),
            ("reduce_scatter", "reduce_scatter_tensor",
             lambda: dist.reduce_scatter_tensor(probe[:2].clone(), probe))):
        try:
            if not args.force_fallback:
                call()
                ops[name] = want
        except (RuntimeError, NotImplementedError, ValueError):
            pass  # ops[name] stays the fallback

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    def timed(steps):
        """[step][iteration] in ms, each the slowest rank's; a barrier before every step."""
        mine = torch.zeros(len(steps), args.iters, dtype=torch.float64)
        if cuda:
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for i in range(-args.warmup, args.iters):
            for s, step in enumerate(steps):
                sync()
                dist.barrier()
                if cuda:
                    start.record()
                    step()
                    stop.record()
                    stop.synchronize()
                    ms = start.elapsed_time(stop)
                else:
                    t0 = time.perf_counter()
                    step()
                    ms = 1e3 * (time.perf_counter() - t0)
                if i >= 0:
                    mine[s, i] = ms
        mine = mine.to(device)
        dist.all_reduce(mine, op=dist.ReduceOp.MAX)
        return mine.cpu().tolist()

    rows = []
    for op in args.ops:
        if op == "ag-gemm":
            A_r = stored(0, range(rank * M // W, (rank + 1) * M // W), range(K)).to(device)
            B_r = stored(1, range(K), range(rank * N // W, (rank + 1) * N // W)).to(device)
            state = {"A": torch.empty(M, K, dtype=dtype, device=device)}

            def comm():
                all_gather(state["A"], A_r)

            def gemm():
                state["C"] = torch.matmul(state["A"], B_r)

            # Reference: the gathered A (every rank's rows, in rank order) times B_r.
            a = stored(0, range(M), range(K)).to(device).double()
            b = B_r.double()
            want = a @ b
            bound = tolerance(DTYPES[args.dtype], K, a.abs() @ b.abs(), want.abs())
        else:
            k0, k1 = rank * K // W, (rank + 1) * K // W
            A_r = stored(0, range(M), range(k0, k1)).to(device)
            B_r = stored(1, range(k0, k1), range(N)).to(device)
            state = {}

            def gemm():
                state["P"] = torch.matmul(A_r, B_r)

            def comm():
                state["C"] = torch.empty(M // W, N, dtype=dtype, device=device)
                reduce_scatter(state["C"], state["P"])

            # Reference: block `rank`'s rows of sum over s of A_s . B_s.
            a = stored(0, range(rank * M // W, (rank + 1) * M // W), range(K)).to(device).double()
            b = stored(1, range(K), range(N)).to(device).double()
            partials = [a[:, s * K // W:(s + 1) * K // W] @ b[s * K // W:(s + 1) * K // W]
                        for s in range(W)]
            want = sum(partials)
            rounded = W * sum(p.abs() for p in partials) + want.abs()
            bound = tolerance(DTYPES[args.dtype], K, a.abs() @ b.abs(), rounded)
        first, second = (comm, gemm) if op == "ag-gemm" else (gemm, comm)

        def total():
            first()
            second()

        def check(when):
            total()
            error = (state["C"].double() - want).abs()
            bad = (~(error <= bound)).sum().reshape(1)  # NaN counts as bad
            worst = float((error - bound).max())
            dist.all_reduce(bad, op=dist.ReduceOp.MAX)
            if int(bad):
                dist.destroy_process_group()
                raise SystemExit(f"torch {op}: rank {rank}: the check {when} failed (the worst "
                                 f"rank: {int(bad)} elements off; here the largest excess over "
                                 f"the bound is {worst:.3g})")

        check("before timing")
        times = timed([comm, gemm, total])
        check("after timing")
        row = {"impl": "pytorch", "op": op, "ranks": W, "device": args.device,
               "backend": dist.get_backend(),
               "collective": ops["all_gather" if op == "ag-gemm" else "reduce_scatter"],
               "threads": args.threads if not cuda else None, "check": "passed",
               "checked_elements": int(want.numel())}
        for name, ms in zip(STEPS, times):
            row[name] = {"median_ms": statistics.median(ms), "min_ms": min(ms),
                         "max_ms": max(ms), "mean_ms": statistics.fmean(ms),
                         "std_ms": statistics.stdev(ms) if len(ms) > 1 else 0.0, "ms": ms}
        rows.append(row)
        del state
    if rank == 0:
        with open(args.worker_out, "w") as f:
            json.dump(rows, f)
    dist.barrier()
    dist.destroy_process_group()


# --- the driver -------------------------------------------------------------------------------

def run_pmoe(args, op, W, cuda):
    """pmoe-bench's own run at this shape; its JSON."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "pmoe.json")
        cmd = [args.pmoe_bench, op, str(args.m), str(args.n), str(args.k), "--dtype", args.dtype,
               "--ranks", str(W), "--iters", str(args.iters), "--warmup", str(args.warmup),
               "--seed", str(args.seed), "--device", "cuda" if cuda else "cpu", "--json", out]
        env = dict(os.environ)
        if cuda or args.pmoe_mpirun:  # processes (on a GPU: one per GPU, as torchrun's ranks)
            cmd = [shutil.which("mpiexec") or "mpiexec", "-n", str(W), "--bind-to", "none"] + cmd
            env = dict({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                        "OMPI_MCA_rmaps_base_oversubscribe": "1"}, **env)
        print("+ " + " ".join(cmd), flush=True)
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"pmoe-bench failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
        with open(out) as f:
            result = json.load(f)
    result["command"] = " ".join(cmd)
    return result


def run_torch(args, W, threads):
    part = os.path.join(tempfile.gettempdir(), f"torch_overlap_bench.{os.getpid()}.{W}.json")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={W}", os.path.abspath(__file__), str(args.m), str(args.n),
           str(args.k), "--dtype", args.dtype, "--ops", ",".join(args.ops), "--iters",
           str(args.iters), "--warmup", str(args.warmup), "--seed", str(args.seed),
           "--device", args.device, "--threads", str(threads), "--worker-out", part]
    if args.force_fallback:
        cmd.append("--force-fallback")
    print("+ " + " ".join(cmd), flush=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    if subprocess.run(cmd, env=env).returncode != 0:
        sys.exit(f"the PyTorch side failed on {W} ranks (a failed check exits non-zero)")
    with open(part) as f:
        rows = json.load(f)
    os.remove(part)
    return rows


def markdown(doc):
    c = doc["config"]
    lines = [f"# pmoe overlap vs the PyTorch way: M={c['m']} N={c['n']} K={c['k']} {c['dtype']}",
             "", f"Command: `{doc['command']}`  ",
             f"Commit: {doc['commit']}, {doc['date']}. Machine: {doc['machine']['cpu']}, "
             f"{doc['machine']['cores']} cores, GPU: {doc['machine']['gpu']}. "
             f"torch {doc['torch']}.  ",
             f"Load before: {doc['load_before']}; after: {doc['load_after']}.", ""]
    if doc["label"]:
        lines += [doc["label"], ""]
    lines += [f"{c['iters']} timed iterations after {c['warmup']} warm-ups, both sides; a barrier "
              "before each step; a step's time is the slowest rank's; medians (ms). pmoe's "
              "columns come from its own `pmoe-bench` run just before the PyTorch one, on the "
              "same inputs; both were checked against a reference before timing. Last column: "
              "PyTorch's total / pmoe's overlapped (above 1: pmoe faster).", ""]
    titles = {"ag-gemm": "AllGather + GEMM", "gemm-rs": "GEMM + ReduceScatter"}
    for op in c["ops"]:
        lines += [f"## {titles[op]}", "",
                  "| ranks | row | device, how | comm | GEMM | serial total | overlapped | "
                  "speedup vs serial | PyTorch / pmoe |",
                  "|---:|---|---|---:|---:|---:|---:|---:|---:|"]
        for W in c["ranks"]:
            p = doc["pmoe"][f"{op}/{W}"]
            s, pc = p["summary"], p["config"]
            t = next(r for r in doc["rows"] if r["op"] == op and r["ranks"] == W)
            how = f"{pc['runtime']}, {p['machine']['launcher']}, " + (
                f"BLAS threads {pc['blas_threads']}, transfers "
                + ("on a communication thread" if pc["communication_thread"] else "between GEMMs")
                if pc["device"] == "cpu" else f"copy {pc['copy']}")
            ratio = t["total"]["median_ms"] / s["overlapped_ms"]
            lines.append(f"| {W} | pmoe | {how} | {s['serial_comm_ms']:.3f} | "
                         f"{s['serial_gemm_ms']:.3f} | {s['serial_total_ms']:.3f} | "
                         f"{s['overlapped_ms']:.3f} | {s['speedup']:.3f} | {ratio:.3f} |")
            where = (f"{t['device']}, {t['backend']}, torchrun processes"
                     + (f", {t['threads']} thread(s)" if t["threads"] else ""))
            lines.append(f"| {W} | PyTorch: {t['collective']} | {where} | "
                         f"{t['comm']['median_ms']:.3f} | {t['gemm']['median_ms']:.3f} | "
                         f"{t['total']['median_ms']:.3f} | | | |")
        lines.append("")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("m", type=int, metavar="M")
    parser.add_argument("n", type=int, metavar="N")
    parser.add_argument("k", type=int, metavar="K")
    parser.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    parser.add_argument("--ranks", default="2,4", help="world sizes, one torchrun each")
    parser.add_argument("--ops", default=",".join(OPS))
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="auto: cuda where torch sees a GPU")
    parser.add_argument("--pmoe-bench", help="the binary (default: build/default's)")
    parser.add_argument("--pmoe-mpirun", action="store_true",
                        help="run pmoe-bench under mpiexec -n W, processes like torchrun's "
                             "(always so on a GPU; else its ranks are threads of one process)")
    parser.add_argument("--label", default="", help="a line for the table's header")
    parser.add_argument("--out", help="write OUT.json and OUT.md")
    parser.add_argument("--force-fallback", action="store_true",
                        help="use the equivalents of the two collectives even where they exist")
    parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--worker-out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.ops = args.ops.split(",")
    if any(op not in OPS for op in args.ops):
        parser.error(f"--ops: each of {', '.join(OPS)}")
    if args.worker_out:
        return worker(args)

    import torch
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    cuda = args.device == "cuda"
    args.pmoe_bench = args.pmoe_bench or os.path.join(root,
                                                      "build/default/tools/pmoe-bench/pmoe-bench")
    ranks = [int(w) for w in args.ranks.split(",")]
    if cuda and max(ranks) > torch.cuda.device_count():
        sys.exit(f"--ranks {args.ranks}: NCCL needs a GPU per rank, torch sees "
                 f"{torch.cuda.device_count()}")
    load_before = load_average()
    pmoe, rows = {}, []
    for W in ranks:
        for op in args.ops:
            pmoe[f"{op}/{W}"] = run_pmoe(args, op, W, cuda)
        threads = pmoe[f"{args.ops[0]}/{W}"]["config"]["blas_threads"]
        rows += run_torch(args, W, threads)
    commit = git_commit(root)
    doc = {"command": "python3 " + shlex.join(sys.argv), "commit": commit,
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
           "machine": machine(cuda), "torch": torch.__version__, "label": args.label,
           "load_before": load_before,
           "load_after": load_average(),
           "config": {"m": args.m, "n": args.n, "k": args.k, "dtype": args.dtype,
                      "ranks": ranks, "ops": args.ops, "iters": args.iters,
                      "warmup": args.warmup, "seed": args.seed, "device": args.device},
           "pmoe": pmoe, "rows": rows}
    write_results(doc, markdown(doc), args.out)


if __name__ == "__main__":
    main()
