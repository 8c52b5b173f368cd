"""pmoe against transformers' own "all_to_all" as the expert-parallel implementation of a
transformers MoE model, under torchrun, on the same model, ranks and tokens.

    python3 tools/transformers_ep_bench.py --ranks 2,4 --tokens 64,256,1024 --out bench/results/NAME
        launches `torchrun --standalone --nproc-per-node W` for each W; writes NAME.json, NAME.md

Three measurements per model, W and tokens per rank m, each for ep_implementation "pmoe" and
"all_to_all", forward and backward:
- exchange: the implementation alone, with experts that return their rows (no expert compute):
  dispatch + combine, and their backward; beside them, the yardstick "local": the same rows
  moved within each rank, without communication (local_exchange);
- block: one MoE block of the model (router, experts split over the ranks, shared experts where
  the family has them), built from its config, with the model's own EP plan applied;
- step: a training step of the whole model (from_pretrained with DistributedConfig(fsdp_size=W,
  ep_size=W, ep_implementation=...)): forward, backward, AdamW step.
Every rank holds its own m tokens. Before timing, each measurement is checked: the exchange
against the closed form (y = x * sum of the weights, and its gradients), the block and the
first step's loss between the two implementations; a wrong answer exits non-zero.

Protocol: a barrier before every timed iteration, the iteration's time being the slowest rank's
(an all-reduce MAX at the end), warm-ups first. The two implementations are timed interleaved,
in the order ABBA ABBA ..., so that the machine's drift (other jobs, its clock) falls on both
alike instead of on whichever would run second. --order blocks keeps ABBA but over four blocks
of iterations, so that each call follows one of its own implementation rather than the other's
(a small pmoe exchange runs slower after a gloo call, a cache flush or an idle wait than right
after itself: docs/transformers.md). The models are small random ones (hf_models.py):
a Mixtral-like (8 experts, top-2) and a DeepSeek-like (32 experts, top-8, a shared expert),
hidden 512, two layers.
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from bench_output import git_commit, load_average, machine, write_results

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "python", "tests"))
sys.path.insert(0, HERE)

MODELS = {
    "mixtral-like": dict(model_type="mixtral", hidden=512, num_experts=8, top_k=2, layers=2,
                         vocab=1024),
    "deepseek-like": dict(model_type="deepseek_v3", hidden=512, num_experts=32, top_k=8,
                          layers=2, vocab=1024),
}
IMPLEMENTATIONS = ("pmoe", "all_to_all")
LOCAL = "local"  # the exchange's yardstick: the same rows moved within each rank (local_exchange)


def worker(args):
    import torch
    import torch.distributed as dist
    import transformers
    from torch.distributed.device_mesh import init_device_mesh
    from transformers import AutoModelForCausalLM
    from transformers.distributed.configuration_utils import DistributedConfig
    from transformers.distributed.expert_parallel import (EPImplementationInterface,
                                                          apply_expert_parallelism)

    import pmoe.transformers  # noqa: F401  registers "pmoe"
    from hf_models import save_tiny, tiny_config

    torch.set_num_threads(1)
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world, 1), mesh_dim_names=("ep", "tp"))
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    rows = []

    def timed(fns):
        """fns: {impl: fn}. Times every fn in ABBA order, by iteration (--order interleaved) or
        by blocks of iterations (--order blocks: 4 blocks of iters / 4, each after one untimed
        call); {impl: [us per iteration]}."""
        names = list(fns)
        times = {name: [] for name in names}

        def one(name, keep):
            dist.barrier()
            start = time.perf_counter()
            fns[name]()
            if keep:
                times[name].append(time.perf_counter() - start)

        if args.order == "interleaved":
            for i in range(args.warmup + args.iters):
                for name in (names if i % 2 == 0 else names[::-1]):
                    one(name, i >= args.warmup)
        else:
            for _ in range(args.warmup):
                for name in names:
                    one(name, False)
            for block in range(4):
                for name in (names if block % 2 == 0 else names[::-1]):
                    one(name, False)
                    for _ in range(-(-args.iters // 4)):
                        one(name, True)
        slowest = torch.tensor([times[name] for name in names], dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        return {name: [t * 1e6 for t in row] for name, row in zip(names, slowest.tolist())}

    def record_all(model, what, m, fns):
        for impl, times in timed(fns).items():
            record(model, what, impl, m, times)

    def record(model, what, impl, m, times):
        rows.append({"model": model, "what": what, "impl": impl, "ep": world, "tokens": m,
                     "mean_us": statistics.mean(times), "std_us": statistics.pstdev(times),
                     "median_us": statistics.median(times), "min_us": min(times)})

    def check(name, got, want):
        got, want = got.detach().float(), want.detach().float()
        scale = max(want.abs().max().item(), 1e-6)
        err = (got - want).abs().max().item()
        if not err <= tol * scale:
            raise SystemExit(f"rank {rank}: {name}: max error {err:.3g} > {tol} * {scale:.3g}")

    class RowsBack(torch.nn.Module):
        """Experts that return their rows, times their (unit) weights: no compute."""

        def __init__(self, local):
            super().__init__()
            self.num_experts = local

        def forward(self, rows, ids, weights):
            return rows * weights.to(rows.dtype)

    for name, spec in MODELS.items():
        if name not in args.models:
            continue
        config = tiny_config(**spec)
        hidden, experts, top_k = spec["hidden"], spec["num_experts"], spec["top_k"]
        tmp = tempfile.mkdtemp(prefix="pmoe-bench-") if rank == 0 else None
        path = [os.path.join(tmp, name) if rank == 0 else None]
        if rank == 0:
            save_tiny(path[0], spec["model_type"], seed=0,
                      **{k: v for k, v in spec.items() if k != "model_type"})
        dist.broadcast_object_list(path, src=0)
        for m in args.tokens:
            gen = torch.Generator().manual_seed(100 * rank + m)
            x = torch.randn(m, hidden, generator=gen).to(dtype)
            idx = torch.rand(m, experts, generator=gen).topk(top_k, dim=-1).indices
            w = torch.rand(m, top_k, generator=gen)
            w = w / w.sum(-1, keepdim=True)
            grad_y = torch.randn(m, hidden, generator=gen).to(dtype)
            ids = torch.randint(0, spec["vocab"], (1, m), generator=gen)

            if "exchange" in args.parts:
                # The exchange alone.
                fns = {}
                for impl in IMPLEMENTATIONS:
                    ep = EPImplementationInterface()[impl](RowsBack(experts // world), mesh["ep"],
                                                           mesh["tp"])
                    xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()

                    def exchange(ep=ep, xg=xg, wg=wg):
                        xg.grad = wg.grad = None
                        y = ep(xg, idx, wg)
                        y.backward(grad_y)
                        return y

                    y = exchange()
                    total = w.sum(-1, keepdim=True)
                    check(f"{name} {impl} exchange y", y, x.float() * total)
                    check(f"{name} {impl} exchange grad x", xg.grad, grad_y.float() * total)
                    check(f"{name} {impl} exchange grad w", wg.grad,
                          (grad_y.float() @ x.float().t()).diagonal().unsqueeze(1).expand(m, top_k))
                    fns[impl] = exchange
                fns[LOCAL] = local_exchange(x, idx, w, grad_y, experts, RowsBack(experts))
                y = fns[LOCAL]()
                check(f"{name} local exchange y", y, x.float() * w.sum(-1, keepdim=True))
                record_all(name, "exchange", m, fns)

            if "block" in args.parts:
                # One MoE block, with the model's EP plan.
                plan = {key.split("mlp.", 1)[1]: style
                        for key, style in config.base_model_ep_plan.items() if ".mlp." in key}
                outputs, fns = {}, {}
                for impl in IMPLEMENTATIONS:
                    torch.manual_seed(0)  # the same block on every rank and for both
                    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
                    block = model.model.layers[0].mlp
                    apply_expert_parallelism(block, mesh["ep"], mesh["tp"], plan,
                                             ep_implementation=impl)
                    xb = x.unsqueeze(0).clone().requires_grad_()

                    def run_block(block=block, xb=xb):
                        xb.grad = None
                        for p in block.parameters():
                            p.grad = None
                        out = block(xb)
                        out = out[0] if isinstance(out, tuple) else out
                        out.backward(grad_y.unsqueeze(0))
                        return out

                    outputs[impl] = (run_block().detach(), xb.grad.clone())
                    fns[impl] = run_block
                record_all(name, "block", m, fns)
                check(f"{name} block output, pmoe vs all_to_all", outputs["pmoe"][0],
                      outputs["all_to_all"][0])
                check(f"{name} block grad x, pmoe vs all_to_all", outputs["pmoe"][1],
                      outputs["all_to_all"][1])

            if "step" in args.parts:
                # A training step of the whole model.
                losses, fns, models = {}, {}, []
                for impl in IMPLEMENTATIONS:
                    model = AutoModelForCausalLM.from_pretrained(
                        path[0], dtype=dtype, distributed_config=DistributedConfig(
                            fsdp_size=world, ep_size=world, ep_implementation=impl))
                    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

                    def step(model=model, optimizer=optimizer):
                        logits = model(ids).logits
                        loss = torch.nn.functional.cross_entropy(logits[0].float(),
                                                                 torch.roll(ids[0], -1))
                        loss.backward()
                        optimizer.step()
                        optimizer.zero_grad()
                        return loss.detach()

                    losses[impl] = step()
                    fns[impl] = step
                    models.append((model, optimizer))
                record_all(name, "step", m, fns)
                del models, fns
                check(f"{name} first step's loss, pmoe vs all_to_all", losses["pmoe"],
                      losses["all_to_all"])

            if rank == 0:
                print(f"{name} W={world} m={m}: checked and timed", flush=True)
        dist.barrier()
        if rank == 0:
            import shutil
            shutil.rmtree(tmp, ignore_errors=True)
    if rank == 0:
        with open(args.worker_out, "w") as f:
            json.dump(rows, f)
    dist.barrier()
    dist.destroy_process_group()


def local_exchange(x, idx, w, grad_y, num_experts, experts):
    """The yardstick for the exchange: the same permutation of rows, forward and backward, done
    within this rank with torch's own ops and no communication, as a single-process MoE layer
    does it. Every token is copied to its k expert rows, sorted by expert (index_select), run
    through the same do-nothing experts, and summed back (index_add); autograd gives the
    backward. Each rank moves as many rows as it sends in the exchange, so an implementation
    that communicates can hardly move them for less: all_to_all / local bounds the speed-up any
    implementation can show over all_to_all on this machine."""
    import torch

    xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
    k = idx.shape[1]

    def run():
        xg.grad = wg.grad = None
        flat = idx.reshape(-1)
        order = flat.argsort(stable=True)
        token = order // k
        rows = xg.index_select(0, token)
        out = experts(rows, flat[order].unsqueeze(1), wg.reshape(-1)[order].unsqueeze(1))
        y = torch.zeros_like(xg).index_add(0, token, out)
        y.backward(grad_y)
        return y

    return run


def markdown(doc):
    config = doc["config"]
    lines = [f"# pmoe vs transformers' all_to_all as a transformers model's EP implementation "
             f"({config['dtype']})", "",
             f"Command: `{doc['command']}`  ",
             f"Commit: {doc['commit']}. Machine: {doc['machine']['cpu']}, "
             f"{doc['machine']['cores']} cores. torch {doc['torch']}, transformers "
             f"{doc['transformers']}.  ",
             f"Load before: {doc['load_before']}; after: {doc['load_after']}.", "",
             f"{config['iters']} timed iterations after {config['warmup']} warm-ups, the "
             "implementations in ABBA order, " + (
                 "by blocks of iterations (each call after one of its own; an untimed call "
                 "opens each block)" if config.get("order") == "blocks" else
                 "interleaved by iteration (each call after the other implementation's)") +
             "; a barrier before each; an iteration's time is the slowest rank's; mean ± std in "
             "ms, forward and backward. Ranks are processes of one machine (pmoe: POSIX shared "
             "memory; all_to_all: gloo). ratio = all_to_all / pmoe (above 1: pmoe is faster). "
             "share = the exchange's time times the layers, over the step's. exchange local: "
             "the same rows moved within each rank by torch's index_select and index_add, no "
             "communication (local_exchange in the tool); all_to_all / local bounds the "
             "speed-up any implementation can show over all_to_all here, and pmoe / local is "
             "how far pmoe is from that yardstick.", ""]
    table = {(r["model"], r["what"], r["impl"], r["ep"], r["tokens"]): r for r in doc["rows"]}
    parts = [p for p in ("exchange", "block", "step") if p in config.get("parts", (p,))]
    for model in [m for m in MODELS if any(r["model"] == m for r in doc["rows"])]:
        layers = MODELS[model]["layers"]
        for ep in sorted({r["ep"] for r in doc["rows"] if r["model"] == model}):
            share = "exchange" in parts and "step" in parts
            local = any(r["impl"] == LOCAL for r in doc["rows"])
            header = "| tokens per rank | " + "".join(
                f"{what} pmoe | {what} all_to_all | ratio | " +
                ("exchange local | all_to_all / local | pmoe / local | "
                 if what == "exchange" and local else "") for what in parts)
            header += "share pmoe | share all_to_all |" if share else ""
            columns = 3 * len(parts) + (2 if share else 0) + (3 if local and "exchange" in parts
                                                              else 0)
            lines += [f"## {model}, {ep} ranks", "", header.rstrip(),
                      "|---:|" + "---:|" * columns]
            for m in sorted({r["tokens"] for r in doc["rows"] if r["model"] == model}):
                cells = []
                for what in parts:
                    a = table.get((model, what, "pmoe", ep, m))
                    b = table.get((model, what, "all_to_all", ep, m))
                    for c in (a, b):
                        cells.append(f"{c['mean_us'] / 1e3:.2f} ± {c['std_us'] / 1e3:.2f}"
                                     if c else "")
                    cells.append(f"{b['mean_us'] / a['mean_us']:.2f}" if a and b else "")
                    if what == "exchange" and local:
                        c = table.get((model, what, LOCAL, ep, m))
                        cells.append(f"{c['mean_us'] / 1e3:.2f} ± {c['std_us'] / 1e3:.2f}"
                                     if c else "")
                        cells.append(f"{b['mean_us'] / c['mean_us']:.2f}" if b and c else "")
                        cells.append(f"{a['mean_us'] / c['mean_us']:.2f}" if a and c else "")
                for impl in IMPLEMENTATIONS if share else ():
                    ex = table.get((model, "exchange", impl, ep, m))
                    st = table.get((model, "step", impl, ep, m))
                    cells.append(f"{100 * layers * ex['mean_us'] / st['mean_us']:.0f}%"
                                 if ex and st else "")
                lines.append(f"| {m} | " + " | ".join(cells) + " |")
            lines.append("")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", default="2,4")
    parser.add_argument("--tokens", default="64,256,1024")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--dtype", default="f32", choices=("f32", "bf16"))
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--order", default="interleaved", choices=("interleaved", "blocks"),
                        help="ABBA by iteration (each call follows the other implementation's), "
                             "or by blocks of iterations (each call follows its own)")
    parser.add_argument("--parts", default="exchange,block,step",
                        help="which measurements to run (a quick look at one: --parts exchange)")
    parser.add_argument("--out", help="write OUT.json and OUT.md")
    parser.add_argument("--worker-out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.tokens = [int(t) for t in args.tokens.split(",")]
    args.models = args.models.split(",")
    args.parts = args.parts.split(",")
    if set(args.parts) - {"exchange", "block", "step"}:
        parser.error(f"--parts: exchange, block and/or step, got {','.join(args.parts)}")
    unknown = set(args.models) - set(MODELS)
    if unknown:
        parser.error(f"unknown model(s) {sorted(unknown)}; known: {', '.join(MODELS)}")
    if args.worker_out:
        return worker(args)

    import torch
    import transformers
    load_before = load_average()
    rows = []
    for w in [int(r) for r in args.ranks.split(",")]:
        part = f"/tmp/transformers_ep_bench.{os.getpid()}.{w}.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={w}", os.path.abspath(__file__), "--worker-out", part,
               "--tokens", ",".join(map(str, args.tokens)), "--models", ",".join(args.models),
               "--dtype", args.dtype, "--warmup", str(args.warmup), "--iters", str(args.iters),
               "--parts", ",".join(args.parts), "--order", args.order]
        subprocess.run(cmd, check=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
        with open(part) as f:
            rows += json.load(f)
        os.remove(part)
    commit = git_commit(ROOT)
    doc = {"command": "python3 " + " ".join(sys.argv), "commit": commit,
           "machine": machine(cuda=False),
           "torch": torch.__version__, "transformers": transformers.__version__,
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "load_before": load_before,
           "load_after": load_average(),
           "config": {"models": {m: MODELS[m] for m in args.models}, "dtype": args.dtype,
                      "warmup": args.warmup, "iters": args.iters, "parts": args.parts,
                      "order": args.order},
           "rows": rows}
    write_results(doc, markdown(doc), args.out)


if __name__ == "__main__":
    main()
