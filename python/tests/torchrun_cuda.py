"""pmoe.torch's communicator on a CUDA device, under torchrun: W processes (the tests run 2),
gloo for torch.distributed's set-up, every rank on cuda:0 (one GPU shared through CUDA IPC, or,
where no GPU is visible, pmoe's emulated CUDA device, whose IPC is POSIX shared memory).

Everywhere (the emulated device included):
- pmoe.torch.communicator(device="cuda:0") gives a SocketCommunicator on cuda:0 with a stream;
  pmoe.AllToAll dispatch/combine on pmoe's own device arrays (pmoe.zeros / pmoe.copy) against
  the NumPy reference, with the ranks on one node and (on the emulated device: on a GPU, NCCL
  refuses two ranks on one GPU) split into one node each through the remote path;
- errors: a CPU tensor given to a CUDA communicator's pmoe.torch ops, a tensor on another device
  given to a CPU one, ranks that ask for different kinds of device, a device pmoe cannot serve
  (asked by one rank only: every rank raises), and a CUDA communicator whose ranks name different
  nodes with no ranks_per_node split (every rank raises; none waits).

With a GPU, CUDA torch and pmoe's CUDA backend for GPUs (else it says why it skips them):
- dispatch, combine and EpMoE forward and backward on CUDA tensors against the same calls on a
  CPU communicator, with torch's sync-debug mode set to error (no host synchronisation); EpMoE
  in bf16 too, its experts on packed rows with torch._grouped_mm (sm90/sm100), against the
  padded computation;
- stream ordering: the inputs written late on a non-default current stream, the outputs read on
  it at once;
- a CUDA graph of dispatch -> experts -> combine, captured once and replayed on new inputs;
- pmoe.transformers' PmoeEP on CUDA tensors (and, with --transformers-model, a small random
  Mixtral loaded with ep_implementation="pmoe") against the single-process computation.
Exits non-zero if any check fails.
"""
import argparse
import os
import sys
import traceback

import numpy as np
import torch
import torch.distributed as dist

import pmoe
import pmoe.torch as pt

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference import check_f32_round_trip, make_inputs  # noqa: E402
from test_cuda_device import on_device, to_host  # noqa: E402  (pmoe arrays to and from a device)

torch.set_num_threads(1)  # W processes on a 2-core machine
DEVICE = "cuda:0"


def say(text):
    if dist.get_rank() == 0:
        print(text, flush=True)


def expect_error(what, run, *needles):
    """run() must raise pmoe.Error whose message holds every needle."""
    try:
        run()
    except pmoe.Error as e:
        missing = [n for n in needles if n not in str(e)]
        if missing:
            raise AssertionError(f"{what}: the error does not name {missing}: {e}") from None
        return str(e)
    raise AssertionError(f"{what}: no pmoe.Error raised")


def check_device_arrays(comm, ranks_per_node):
    """AllToAll on pmoe's device arrays over the torch communicator, against the reference."""
    world = comm.size
    max_tokens, num_experts, hidden = 6, 2 * world, 64
    top_k = min(3, num_experts)
    inputs = [make_inputs(r, max_tokens - r % 2, num_experts, top_k, hidden, "f32", seed=3)
              for r in range(world)]
    a2a = pmoe.AllToAll(comm, max_tokens=max_tokens, num_experts=num_experts,
                        top_k=top_k, hidden_dim=hidden, in_dtype="f32",
                        out_dtype="f32", ranks_per_node=ranks_per_node)
    local, rows = a2a.num_local_experts, world * max_tokens
    x, indices, weights = (on_device(a, comm.device) for a in inputs[comm.rank])
    m = len(inputs[comm.rank][0])
    counts = pmoe.zeros([local], "i32", comm.device)
    expert_x = pmoe.zeros([local, rows, hidden], "f32", comm.device)
    y = pmoe.zeros([m, hidden], "f32", comm.device)
    for _ in range(2):  # a second call reuses the buffers at the next epoch
        a2a.dispatch(x, indices, counts, expert_x)
        comm.synchronize()
        host_x = to_host(expert_x, (local, rows, hidden), np.float32)
        scale = np.array([1 + 0.125 * (comm.rank * local + e) for e in range(local)],
                         np.float32).reshape(local, 1, 1)
        expert_y = on_device(host_x * scale, comm.device)  # reference.py's stand-in experts
        a2a.combine(expert_y, indices, weights, y)
        comm.synchronize()
    mine = (to_host(counts, (local,), np.int32), host_x, to_host(y, (m, hidden), np.float32))
    everyone = [None] * world
    dist.all_gather_object(everyone, mine)
    check_f32_round_trip(dict(enumerate(everyone)), inputs, world, num_experts)
    say(f"ok AllToAll on {comm.device} device arrays over pmoe.torch.communicator, "
        f"ranks_per_node={ranks_per_node}")


def check_errors(comm_gpu, comm_cpu):
    rank = dist.get_rank()
    a2a = pt.AllToAll(comm_gpu, max_tokens=4, num_experts=2 * comm_gpu.size,
                      top_k=1, hidden_dim=8)
    x = torch.zeros(4, 8)
    idx = torch.zeros(4, 1, dtype=torch.int64)
    if not torch.cuda.is_available():
        expect_error("CPU tensor, CUDA communicator", lambda: pt.dispatch(a2a, x, idx),
                     "cpu", DEVICE, "pmoe.zeros", "pmoe.copy")
    else:
        expect_error("CPU tensor, CUDA communicator", lambda: pt.dispatch(a2a, x, idx),
                     "cpu", DEVICE, ".to('cuda:0')")
    cpu_a2a = pt.AllToAll(comm_cpu, max_tokens=4, num_experts=2 * comm_cpu.size,
                          top_k=1, hidden_dim=8)
    meta = torch.zeros(4, 8, device="meta")
    expect_error("meta tensor, CPU communicator", lambda: pt.dispatch(cpu_a2a, meta, idx),
                 "meta", "the CPU")
    if torch.cuda.is_available():
        expect_error("CUDA tensor, CPU communicator",
                     lambda: pt.dispatch(cpu_a2a, x.to(DEVICE), idx.to(DEVICE)),
                     DEVICE, "the CPU", "communicator(device='cuda:0')")
    # Each rank of these raises, whichever rank asked for the odd thing.
    expect_error("different kinds of device",
                 lambda: pt.communicator(device=DEVICE if rank == 0 else None),
                 "different kinds of device", "rank 0: cuda:0", "rank 1: cpu")
    expect_error("a device pmoe cannot serve",
                 lambda: pt.communicator(device="mps" if rank == 1 else DEVICE),
                 "mps", "rank 1" if rank != 1 else "pmoe serves the CPU or a CUDA GPU")
    os.environ[pt._comm.NODE_ENV] = f"node{rank}"
    try:
        split = pt.communicator(device=DEVICE)
        expect_error("nodes without a split",
                     lambda: pmoe.AllToAll(split, max_tokens=4, num_experts=2 * split.size,
                                           top_k=1, hidden_dim=8, in_dtype="f32",
                                           out_dtype="f32"),
                     "CUDA", "node")
        del split
    finally:
        del os.environ[pt._comm.NODE_ENV]
    say("ok errors: devices named, every rank raises")


# ---- torch CUDA tensors: a GPU only ---------------------------------------------------------

def gpu_reason():
    if not torch.cuda.is_available():
        return "torch has no CUDA here"
    if not pmoe.cuda_available() or pmoe.cuda_emulated():
        return "pmoe's CUDA ops run on its emulated device, which torch's tensors cannot reach"
    return ""


def same(name, got, want, tol=1e-5):
    got, want = got.detach().float().cpu(), want.detach().float().cpu()
    if got.shape != want.shape or not torch.allclose(got, want, rtol=tol, atol=tol):
        err = (got - want).abs().max().item() if got.shape == want.shape else "shape"
        raise AssertionError(f"{name}: differs from the CPU run (max error {err})")


def routed_inputs(rank, m, hidden, num_experts, top_k, seed=11):
    gen = torch.Generator().manual_seed(seed + rank)
    x = torch.randn(m, hidden, generator=gen)
    indices = torch.rand(m, num_experts, generator=gen).topk(top_k, dim=-1).indices
    indices[0, -1] = -1 if m else 0  # a skipped slot
    weights = torch.rand(m, top_k, generator=gen)
    return x, indices, weights


def exchange(a2a, x, indices, weights, scale):
    """dispatch -> stand-in experts (a scale per local expert) -> combine, differentiable."""
    expert_x, counts = pt.dispatch(a2a, x, indices)
    expert_y = expert_x * scale
    return pt.combine(a2a, expert_y, indices, weights), expert_x, counts


def check_autograd(comm_gpu, comm_cpu):
    """dispatch/combine and EpMoE on CUDA tensors: outputs and gradients as on the CPU, with no
    host synchronisation in pmoe.torch's own steps."""
    rank, world = dist.get_rank(), dist.get_world_size()
    hidden, num_experts, top_k, max_tokens = 32, 2 * world, 2, 8
    m = max_tokens - rank  # uneven token counts
    x, indices, weights = routed_inputs(rank, m, hidden, num_experts, top_k)
    runs = {}
    for name, comm in (("cpu", comm_cpu), ("cuda", comm_gpu)):
        device = torch.device(comm.device)
        a2a = pt.AllToAll(comm, max_tokens=max_tokens, num_experts=num_experts,
                          top_k=top_k, hidden_dim=hidden)
        local = a2a.num_local_experts
        scale = torch.tensor([1 + 0.25 * (rank * local + e) for e in range(local)],
                             device=device).view(local, 1, 1)
        xd = x.to(device).requires_grad_()
        wd = weights.to(device).requires_grad_()
        idx = indices.to(device)
        if name == "cuda":
            torch.cuda.set_sync_debug_mode("error")  # a host wait in pmoe.torch raises
        try:
            y, expert_x, counts = exchange(a2a, xd, idx, wd, scale)
            (y * torch.arange(1.0, hidden + 1, device=device)).sum().backward()
        finally:
            if name == "cuda":
                torch.cuda.set_sync_debug_mode(0)
        runs[name] = (y, counts, xd.grad, wd.grad)
    for label, got, want in zip(("y", "counts", "grad x", "grad weights"), runs["cuda"],
                                runs["cpu"]):
        same(f"dispatch/combine {label}", got, want)
    say("ok dispatch/combine on CUDA tensors: output, counts and gradients as on the CPU, "
        "no host synchronisation")

    # EpMoE: the same weights on both communicators.
    torch.manual_seed(5)
    dense = dict(router_weight=torch.randn(num_experts, hidden) / hidden ** 0.5,
                 w1=torch.randn(num_experts, hidden, 48) / hidden ** 0.5,
                 w2=torch.randn(num_experts, 48, hidden) / 48 ** 0.5,
                 w3=torch.randn(num_experts, hidden, 48) / hidden ** 0.5)
    results = {}
    for name, comm in (("cpu", comm_cpu), ("cuda", comm_gpu)):
        device = torch.device(comm.device)
        layer = pt.EpMoE(comm, hidden_dim=hidden, ffn_dim=48, num_experts=num_experts,
                         top_k=top_k, max_tokens=max_tokens, swiglu=True)
        if any(p.device != device for p in layer.parameters()):
            raise AssertionError(f"EpMoE on {device}: parameters elsewhere")
        layer.load_dense(**{k: v.to(device) for k, v in dense.items()})
        xd = x.to(device).requires_grad_()
        if name == "cuda":
            torch.cuda.set_sync_debug_mode("error")
        try:
            y = layer(xd)
            y.square().sum().backward()
        finally:
            if name == "cuda":
                torch.cuda.set_sync_debug_mode(0)
        results[name] = [y, xd.grad] + [p.grad for p in layer.parameters()]
    for i, (got, want) in enumerate(zip(results["cuda"], results["cpu"])):
        same(f"EpMoE output/gradient {i}", got, want, tol=1e-4)
    say("ok EpMoE forward and backward on CUDA tensors as on the CPU, no host synchronisation")


def check_grouped_epmoe(comm_gpu, comm_cpu):
    """EpMoE in bf16 on CUDA tensors: its experts on the packed rows with torch._grouped_mm
    (sm90/sm100; elsewhere the padded computation), forward and backward under
    torch.cuda.set_sync_debug_mode("error"), against the padded computation on the GPU and the
    layer on the CPU."""
    from pmoe.torch import _grouped
    rank, world = dist.get_rank(), dist.get_world_size()
    hidden, ffn, num_experts, top_k, max_tokens = 32, 48, 4 * world, 2, 8
    m = max_tokens - 3 * rank  # uneven
    # Routing the two devices agree on: the router reads x's first E columns, whose values are
    # 1 apart (bf16 logits rounded on another device must not pick other experts).
    gen = torch.Generator().manual_seed(40 + rank)
    x = torch.randn(m, hidden, generator=gen) * 0.05
    x[:, :num_experts] += torch.stack([torch.randperm(num_experts, generator=gen).float()
                                       for _ in range(m)]) if m else 0
    x = x.to(torch.bfloat16)
    torch.manual_seed(6)
    dense = dict(router_weight=torch.eye(num_experts, hidden),
                 w1=torch.randn(num_experts, hidden, ffn) / hidden ** 0.5,
                 w2=torch.randn(num_experts, ffn, hidden) / ffn ** 0.5,
                 w3=torch.randn(num_experts, hidden, ffn) / hidden ** 0.5)
    results = {}
    for name, comm, padded in (("cpu", comm_cpu, False), ("cuda padded", comm_gpu, True),
                               ("cuda", comm_gpu, False)):
        device = torch.device(comm.device)
        layer = pt.EpMoE(comm, hidden_dim=hidden, ffn_dim=ffn, num_experts=num_experts,
                         top_k=top_k, max_tokens=max_tokens, swiglu=True,
                         dtype=torch.bfloat16)
        layer.load_dense(**{k: v.to(device) for k, v in dense.items()})
        layer._padded_experts = padded
        xd = x.to(device).requires_grad_()
        if device.type == "cuda":
            torch.cuda.set_sync_debug_mode("error")
        try:
            y = layer(xd)
            y.float().square().sum().backward()
        finally:
            if device.type == "cuda":
                torch.cuda.set_sync_debug_mode(0)
        results[name] = [y, xd.grad] + [p.grad for p in layer.parameters()]
    for want in ("cuda padded", "cpu"):
        for i, (got, ref) in enumerate(zip(results["cuda"], results[want])):
            scale = max(ref.detach().float().abs().max().item(), 1.0)
            same(f"bf16 EpMoE output/gradient {i} against {want}", got / scale, ref / scale,
                 tol=3e-2)
    grouped = _grouped.grouped_mm_runs(torch.bfloat16, torch.device(DEVICE), hidden, ffn)
    how = ("grouped (torch._grouped_mm)" if grouped
           else "padded (no grouped GEMM free of host waits on this GPU)")
    say(f"ok bf16 EpMoE on CUDA tensors, experts {how}, as padded and as on the CPU, no host "
        f"synchronisation")


def check_stream_order(comm_gpu):
    """Inputs written late on a non-default current stream, outputs read there at once."""
    rank, world = dist.get_rank(), dist.get_world_size()
    hidden, num_experts, top_k, m = 64, 2 * world, 2, 8
    a2a = pt.AllToAll(comm_gpu, max_tokens=m, num_experts=num_experts,
                      top_k=top_k, hidden_dim=hidden)
    x, indices, weights = (t.to(DEVICE) for t in routed_inputs(rank, m, hidden, num_experts,
                                                                top_k))
    local = a2a.num_local_experts
    scale = torch.tensor([1 + 0.25 * (rank * local + e) for e in range(local)],
                         device=DEVICE).view(local, 1, 1)
    torch.cuda.synchronize()
    want = exchange(a2a, x, indices, weights, scale)[0].clone()
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    late = torch.zeros_like(x)
    with torch.cuda.stream(stream):
        torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU time before x lands
        late.copy_(x)
        y = exchange(a2a, late, indices, weights, scale)[0]
        got = y * 1.0  # read on the same stream, at once
    torch.cuda.synchronize()
    same("stream order", got, want, tol=0)
    say("ok ordering on a non-default current stream: inputs and outputs in torch's order")


def check_graph(comm_gpu):
    """dispatch -> experts -> combine captured once into a CUDA graph, replayed on new inputs."""
    rank, world = dist.get_rank(), dist.get_world_size()
    hidden, num_experts, top_k, m = 64, 2 * world, 2, 8
    a2a, eager = (pt.AllToAll(comm_gpu, max_tokens=m, num_experts=num_experts,
                              top_k=top_k, hidden_dim=hidden) for _ in range(2))
    local = a2a.num_local_experts
    scale = torch.tensor([1 + 0.25 * (rank * local + e) for e in range(local)],
                         device=DEVICE).view(local, 1, 1)
    x, indices, weights = (t.to(DEVICE) for t in routed_inputs(rank, m, hidden, num_experts,
                                                                top_k))
    static_x, static_idx, static_w = x.clone(), indices.clone(), weights.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        for _ in range(2):  # warm-up outside the capture
            exchange(a2a, static_x, static_idx, static_w, scale)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    # thread_local, as pmoe's own graph test captures: other threads of this process may call CUDA.
    with torch.cuda.graph(graph, capture_error_mode="thread_local"), torch.no_grad():
        static_y = exchange(a2a, static_x, static_idx, static_w, scale)[0]
    for seed in (21, 22, 23):
        nx, nidx, nw = (t.to(DEVICE) for t in routed_inputs(rank, m, hidden, num_experts, top_k,
                                                             seed=seed))
        static_x.copy_(nx)
        static_idx.copy_(nidx)
        static_w.copy_(nw)
        graph.replay()
        with torch.no_grad():
            want = exchange(eager, nx, nidx, nw, scale)[0]  # the graph's op is its own
        same(f"graph replay {seed}", static_y, want, tol=0)
    say("ok a CUDA graph of dispatch -> experts -> combine, replayed on new inputs")


def check_transformers(comm_gpu, full_model):
    """pmoe.transformers' PmoeEP on CUDA tensors (through use_communicator) against the dense
    single-process computation; with full_model, a small random Mixtral too."""
    try:
        import pmoe.transformers
    except (ImportError, pmoe.Error) as missing:  # transformers absent, or without its registry
        say(f"skipped pmoe.transformers on CUDA tensors: {missing}")
        return
    import torchrun_transformers as hf
    pmoe.transformers.use_communicator(comm_gpu)
    try:
        world, rank = dist.get_world_size(), dist.get_rank()
        from torch.distributed.device_mesh import init_device_mesh
        from pmoe.transformers import PmoeEP
        mesh = init_device_mesh("cpu", (world, 1), mesh_dim_names=("ep", "tp"))
        hidden, local_experts, top_k = 8, 2, 2
        tokens = [5, 0, 3][:world] + [4] * max(0, world - 3)
        gen = torch.Generator().manual_seed(7)
        total_experts = local_experts * world
        weight = torch.randn(total_experts, hidden, hidden, generator=gen) / hidden ** 0.5
        xs = [torch.randn(n, hidden, generator=gen) for n in tokens]
        routes = [torch.rand(n, total_experts, generator=gen).topk(top_k, dim=-1)
                  for n in tokens]
        first = rank * local_experts
        experts = hf.ToyExperts(weight[first:first + local_experts].clone().to(DEVICE))
        layer = PmoeEP(experts, mesh["ep"], mesh["tp"])
        x = xs[rank].to(DEVICE).requires_grad_()
        w = routes[rank].values.to(DEVICE).requires_grad_()
        y = layer(x, routes[rank].indices.to(DEVICE), w)
        (y * torch.arange(1.0, hidden + 1, device=DEVICE)).sum().backward()
        want_x = xs[rank].clone().requires_grad_()
        dense = weight.clone().requires_grad_()
        want_y = torch.einsum("nh,nkhg,nk->ng", want_x, dense[routes[rank].indices],
                              routes[rank].values)
        (want_y * torch.arange(1.0, hidden + 1)).sum().backward()
        hf.close("PmoeEP y on CUDA", y.cpu(), want_y, torch.float32)
        hf.close("PmoeEP grad x on CUDA", x.grad.cpu(), want_x.grad, torch.float32)
        say("ok pmoe.transformers PmoeEP on CUDA tensors")
        if full_model:
            check_full_model(hf)
    finally:
        pmoe.transformers.use_communicator(None)


def check_full_model(hf):
    """A small random Mixtral with ep_implementation="pmoe", moved to the GPU after loading:
    its logits against the single-process model's on the CPU."""
    import shutil
    import tempfile
    from transformers import AutoModelForCausalLM
    from transformers.distributed.configuration_utils import DistributedConfig
    world, rank = dist.get_world_size(), dist.get_rank()
    tmp = tempfile.mkdtemp(prefix="pmoe-hf-cuda-") if rank == 0 else None
    shared = [None, None]
    if rank == 0:
        path = os.path.join(tmp, "mixtral")
        shared = [path, hf.save_tiny(path, "mixtral", num_experts=2 * world).vocab_size]
    dist.broadcast_object_list(shared, src=0)
    path, vocab = shared
    try:
        all_ids = hf.batches(world, 1, vocab, 4)
        want = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)(
            all_ids[rank], use_cache=False).logits
        config = DistributedConfig(fsdp_size=world, ep_size=world, ep_implementation="pmoe")
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                     distributed_config=config).to(DEVICE)
        got = model(all_ids[rank].to(DEVICE), use_cache=False).logits
        hf.close("mixtral logits on CUDA", hf.gathered(got).cpu(), want, torch.float32)
        say("ok a transformers Mixtral with ep_implementation='pmoe' on CUDA tensors")
    finally:
        dist.barrier()
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--transformers-model", action="store_true",
                        help="also load a small random Mixtral with ep_implementation='pmoe' "
                             "on the GPU")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    failed = []

    def step(name, run):
        try:
            run()
        except Exception:  # noqa: BLE001: every rank reports and stays in step
            failed.append(name)
            print(f"rank {dist.get_rank()}: FAILED {name}\n{traceback.format_exc()}", flush=True)

    comm_gpu = pt.communicator(device=DEVICE)
    comm_cpu = pt.communicator()
    if comm_gpu.device != DEVICE or not comm_gpu.stream or comm_cpu.device != "cpu":
        failed.append("communicator devices")
        print(f"rank {dist.get_rank()}: FAILED devices {comm_gpu.device} {comm_gpu.stream} "
              f"{comm_cpu.device}", flush=True)
    step("device arrays, one node", lambda: check_device_arrays(comm_gpu, 0))
    if pmoe.cuda_emulated():
        step("device arrays, a node each", lambda: check_device_arrays(comm_gpu, 1))
    else:  # the GIN path: NCCL refuses two ranks of one communicator on one GPU
        say("skipped ranks_per_node=1 on a GPU: the GIN path needs a GPU per rank (mpi.cuda_remote "
            "needs several GPUs and an RDMA NIC; device_checks.sh's gin part says what one GPU can)")
    step("errors", lambda: check_errors(comm_gpu, comm_cpu))
    reason = gpu_reason()
    if reason:
        say(f"skipped the torch CUDA tensor checks: {reason} (scripts/device_checks.sh runs "
            f"them on a GPU)")
    else:
        step("autograd", lambda: check_autograd(comm_gpu, comm_cpu))
        step("grouped experts", lambda: check_grouped_epmoe(comm_gpu, comm_cpu))
        step("stream order", lambda: check_stream_order(comm_gpu))
        step("graph", lambda: check_graph(comm_gpu))
        step("transformers", lambda: check_transformers(comm_gpu, args.transformers_model))
    outcome = [None] * dist.get_world_size()
    dist.all_gather_object(outcome, failed)
    del comm_gpu, comm_cpu
    dist.destroy_process_group()
    if any(outcome):
        print(f"rank {os.environ.get('RANK')}: failures {outcome}", flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
