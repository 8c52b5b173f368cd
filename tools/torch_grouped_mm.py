#!/usr/bin/env python3
"""torch._grouped_mm on the expert stage pmoe-bench moe times, side by side with pmoe's.

The stage of one rank holding every expert (pmoe-bench moe --ranks 1), swiglu as the presets are:
  hidden = x . W1_e     x [rows, H] bf16, W1 [E, H, 2F], one group of rows an expert
  act    = silu(hidden[:, :F]) * hidden[:, F:]
  out    = act . W2_e   W2 [E, F, O]
rows = batch * top_k, one group an expert (the group ends in `offs`, on the device, as pmoe's
library GEMM reads them). --group-sizes gives each expert's rows as pmoe's router made them for
the same preset and batch (pmoe-bench moe --device cuda passes them), so that both sides pad the
same groups to their 128-row tiles; without it, an even split (stated in the output line). FLOPs are the two GEMMs' (2 rows (H 2F + F O)), as pmoe-bench
counts them; the time is the median of --iters CUDA-event timings after --warmup runs.

Prints one line (and writes --json): torch._grouped_mm's time and TFLOP/s, or why it did not run
(no torch, no CUDA, no _grouped_mm): that is not a failure, the exit status stays 0.
"""
import argparse
import json
import sys

PRESETS = {  # H, F, E, top_k: tools/pmoe-bench/moe_bench.cpp's kPresets
    "mixtral-8x7b": (4096, 14336, 8, 2),
    "deepseek-v3": (7168, 2048, 32, 8),
    "qwen3-30b-a3b": (2048, 768, 128, 8),
}


def report(args, result):
    line = f"torch._grouped_mm, {args.preset} expert stage, batch {args.batch}: "
    if "why_not" in result:
        line += "not run: " + result["why_not"]
    else:
        line += (f"{result['ms']:.3f} ms, {result['tflops']:.1f} TFLOP/s ({result['device']}; "
                 f"groups {result['groups']})")
    print(line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(result, preset=args.preset, batch=args.batch), f, indent=1)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="mixtral-8x7b", choices=sorted(PRESETS))
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--json", default="")
    p.add_argument("--experts", type=int, default=0, help="experts (default: the preset's)")
    p.add_argument("--group-sizes", default="",
                   help="each expert's rows, comma-separated, summing to batch * top_k")
    args = p.parse_args()
    H, F, E, k = PRESETS[args.preset]
    E = args.experts or E
    rows = args.batch * k
    if args.group_sizes:
        per = [int(v) for v in args.group_sizes.split(",")]
        if len(per) != E or sum(per) != rows or min(per) < 0:
            print(f"--group-sizes: {len(per)} groups of {sum(per)} rows, expected {E} groups of "
                  f"batch * top_k = {rows} rows", file=sys.stderr)
            return 2
        groups = f"pmoe's router's, {min(per)} to {max(per)} rows"
    else:
        per = [rows // E + (1 if e < rows % E else 0) for e in range(E)]
        groups = "an even split"
    try:
        import torch
    except ImportError as e:
        return report(args, {"why_not": f"no torch ({e})"})
    if not torch.cuda.is_available():
        return report(args, {"why_not": f"torch {torch.__version__} has no CUDA device "
                                        f"(torch.version.cuda = {torch.version.cuda})"})
    if not hasattr(torch, "_grouped_mm"):
        return report(args, {"why_not": f"torch {torch.__version__} has no _grouped_mm"})
    dev = torch.device("cuda")
    offs = torch.tensor(per, dtype=torch.int32, device=dev).cumsum(0).to(torch.int32)
    g = torch.Generator(device=dev).manual_seed(1)
    x = torch.randn(rows, H, device=dev, dtype=torch.bfloat16, generator=g)
    # The weights as pmoe keeps them ([E, K, N], N contiguous), given to torch as its CUTLASS
    # kernel wants them where it asks for K contiguous (a transposed view of the same values).
    w1 = torch.randn(E, H, 2 * F, device=dev, dtype=torch.bfloat16, generator=g) * H ** -0.5
    w2 = torch.randn(E, F, H, device=dev, dtype=torch.bfloat16, generator=g) * F ** -0.5

    def stage(w1, w2):
        hidden = torch._grouped_mm(x, w1, offs=offs)
        act = torch.nn.functional.silu(hidden[:, :F]) * hidden[:, F:]
        return torch._grouped_mm(act, w2, offs=offs)

    try:
        stage(w1, w2)
    except RuntimeError:
        w1 = w1.transpose(-2, -1).contiguous().transpose(-2, -1)
        w2 = w2.transpose(-2, -1).contiguous().transpose(-2, -1)
        try:
            stage(w1, w2)
        except RuntimeError as e:
            return report(args, {"why_not": f"torch._grouped_mm refused the shapes: {e}"})
    for _ in range(args.warmup):
        stage(w1, w2)
    times = []
    for _ in range(args.iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        stage(w1, w2)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    ms = sorted(times)[len(times) // 2]
    flops = 2.0 * rows * (H * 2 * F + F * H)
    report(args, {"ms": ms, "tflops": flops / (ms * 1e-3) / 1e12, "flops": flops, "rows": rows,
                  "device": torch.cuda.get_device_name(), "torch": torch.__version__,
                  "groups": groups, "group_sizes": per})


if __name__ == "__main__":
    sys.exit(main())
