"""pmoe.torch under torchrun: W processes (run with --nproc-per-node 2 and 4), gloo, CPU.

One launch runs every check (torchrun's start-up is the slow part): dispatch/combine and their
gradients against a dense single-process torch reference (f32, bf16; masked slots, top-k = E,
m = 0 on some ranks; padded and packed, with and without the ops' in-place buffers), EpMoE
gradients and training steps against the dense layer, the same on a communicator whose ranks
sit on two "nodes" (PMOE_NODE), bad inputs raising pmoe.Error, and ranks disagreeing on a
config failing on every rank. Exits non-zero if any check fails.

Tolerances: f32 results and gradients within rtol 1e-4 / atol 1e-5 of the f32 reference (the
sums run in another order); bf16 within 3e-2 of the reference's largest magnitude, the reference
computed in f32 from the same bf16 inputs (each bf16 rounding costs up to 2^-8 relative).
float64 is refused: pmoe's ops carry f32, bf16, f16 and f8 only.
"""
import datetime
import os
import sys
import traceback

import torch
import torch.distributed as dist

import pmoe
import pmoe.torch as pt

torch.set_num_threads(1)  # W processes on a 2-core machine


def close(name, got, want, dtype):
    got, want = got.detach().float(), want.detach().float()
    if got.shape != want.shape:
        raise AssertionError(f"{name}: shape {tuple(got.shape)} != {tuple(want.shape)}")
    if want.numel() == 0:
        return
    if dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=lambda m: f"{name}: {m}")
    else:
        scale = max(want.abs().max().item(), 1e-3)
        err = (got - want).abs().max().item()
        if err > 3e-2 * scale:
            raise AssertionError(f"{name}: max error {err:.3g} > 3e-2 * {scale:.3g}")


def make_routing(gen, m, E, k, drop):
    idx = torch.stack([torch.randperm(E, generator=gen)[:k] for _ in range(m)]) if m else \
        torch.zeros(0, k, dtype=torch.int64)
    if drop and m:
        idx[torch.rand(m, k, generator=gen) < drop] = -1
    return idx


def case_inputs(W, m_of, E, k, H, drop, seed):
    """Every rank's (x, indices, weights), the same on every rank (seeded)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for r in range(W):
        m = m_of(r)
        out.append((torch.randn(m, H, generator=gen), make_routing(gen, m, E, k, drop),
                    torch.rand(m, k, generator=gen) + 0.1))
    return out


def dense_moe(xs, idxs, ws, E, expert):
    """The single-process reference: y[t] = sum_j w[t, j] * expert(e, x[t]) over j with e >= 0."""
    ys = []
    for x, idx, w in zip(xs, idxs, ws):
        y = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float32)
        for e in range(E):
            share = (w.float() * (idx == e)).sum(1, keepdim=True)
            y = y + share * expert(e, x).float()
        ys.append(y)
    return ys


def check_dispatch_combine(comm, dtype, *, m_of, experts_per_rank, k, drop, seed, H=12, tag="",
                           packed=False, in_place=False, weighted=False, a2a=None):
    """Forward rows and y, and gradients of x, weights and an expert parameter, vs dense.
    packed: through dispatch_packed/combine_packed (in_place: with the ops' own buffers;
    weighted: the weights carried by dispatch, applied to the rows, and a combine that sums);
    a2a: an AllToAll to use again (its kept buffers must not leak one call into the next).
    Returns the AllToAll."""
    W, rank = comm.size, comm.rank
    E = experts_per_rank * W
    max_tokens = max(m_of(r) for r in range(W)) or 1
    if a2a is None:
        a2a = pt.AllToAll(comm, max_tokens=max_tokens, num_experts=E, top_k=k,
                          hidden_dim=H, dtype=dtype, in_place_buffers=in_place,
                          weighted_dispatch=weighted)
    inputs = case_inputs(W, m_of, E, k, H, drop, seed)
    scale_full = torch.linspace(0.5, 1.5, E)
    name = (f"{tag}dispatch/combine{' packed' if packed else ''}{' in place' if in_place else ''}"
            f"{' weighted' if weighted else ''} {dtype} W={W} k={k} drop={drop} rank {rank}")

    # Distributed: expert e's output is tanh(c_e * row), c a parameter.
    x = inputs[rank][0].to(dtype).requires_grad_()
    idx, w = inputs[rank][1], inputs[rank][2].clone().requires_grad_()
    c = scale_full.clone().requires_grad_()
    if weighted:
        rows, counts, row_w = pt.dispatch_packed(a2a, x, idx, w)
        # Each row's weight is its slot's: the weight of its token at its expert.
        want_w = [inputs[r][2][t][inputs[r][1][t] == a2a.first_expert + e].sum()
                  for e in range(a2a.num_local_experts) for r in range(W)
                  for t in range(len(inputs[r][1])) if (inputs[r][1][t] == a2a.first_expert + e).any()]
        torch.testing.assert_close(row_w.detach(), torch.stack(want_w) if want_w
                                   else torch.zeros(0), rtol=0, atol=0)
    elif packed:
        rows, counts = pt.dispatch_packed(a2a, x, idx)
    if packed:
        starts = [0] + torch.cumsum(counts, 0).tolist()
        if rows.shape[0] != starts[-1]:
            raise AssertionError(f"{name}: {rows.shape[0]} packed rows, counts sum {starts[-1]}")
        expert_rows = lambda e: rows[starts[e]:starts[e + 1]]  # noqa: E731
    else:
        expert_x, counts = pt.dispatch(a2a, x, idx)
        expert_rows = lambda e: expert_x[e, :int(counts[e])]  # noqa: E731
    # Rows of each local expert, in (source rank, source token) order.
    for e in range(a2a.num_local_experts):
        g = a2a.first_expert + e
        want = [inputs[r][0][t] for r in range(W) for t in range(len(inputs[r][1]))
                if (inputs[r][1][t] == g).any()]
        if int(counts[e]) != len(want):
            raise AssertionError(f"{name}: expert {g} got {int(counts[e])} rows, want {len(want)}")
        if want:
            torch.testing.assert_close(expert_rows(e), torch.stack(want).to(dtype),
                                       rtol=0, atol=0)
    local_c = c[a2a.first_expert:a2a.first_expert + a2a.num_local_experts]
    if weighted:
        row_c = torch.repeat_interleave(local_c, counts.long()).unsqueeze(1)
        out = torch.tanh(rows.float() * row_c).to(dtype)
        y = pt.combine_packed(a2a, (out.float() * row_w.unsqueeze(1)).to(dtype), counts, idx)
    elif packed:
        row_c = torch.repeat_interleave(local_c, counts.long()).unsqueeze(1)
        y = pt.combine_packed(a2a, torch.tanh(rows.float() * row_c).to(dtype), counts, idx, w)
    else:
        expert_y = torch.tanh(expert_x.float() * local_c.view(-1, 1, 1)).to(dtype)
        y = pt.combine(a2a, expert_y, idx, w)
    g_y = torch.randn(y.shape, generator=torch.Generator().manual_seed(seed + 1 + rank))
    (y.float() * g_y).sum().backward()
    grad_c = c.grad.clone()
    dist.all_reduce(grad_c)

    # Dense: every rank's tokens in one process.
    xs = [i[0].to(dtype).float().requires_grad_() for i in inputs]
    ws = [i[2].clone().requires_grad_() for i in inputs]
    c_ref = scale_full.clone().requires_grad_()
    ys = dense_moe(xs, [i[1] for i in inputs], ws, E,
                   lambda e, xx: torch.tanh(xx * c_ref[e]).to(dtype))
    loss = sum((yy * torch.randn(yy.shape, generator=torch.Generator().manual_seed(seed + 1 + r))
                ).sum() for r, yy in enumerate(ys))
    loss.backward()
    close(f"{name}: y", y, ys[rank], dtype)
    close(f"{name}: grad x", x.grad, xs[rank].grad, dtype)
    close(f"{name}: grad weights", w.grad, ws[rank].grad, dtype)
    close(f"{name}: grad expert parameter", grad_c, c_ref.grad, dtype)
    masked = idx < 0
    if masked.any() and w.grad[masked].abs().max() != 0:
        raise AssertionError(f"{name}: masked slots got a gradient")
    return a2a


def dense_epmoe(xs, router, W1, W2, W3, k, dtype):
    """The layer in one process, in f32, routing in `dtype` (as the layer does: bf16 logits can
    pick other experts than f32 ones)."""
    ys = []
    for x in xs:
        idx, w = pt.route(x.to(dtype), router.to(dtype), k)
        y = torch.zeros(x.shape, dtype=torch.float32)
        for e in range(W1.shape[0]):
            share = (w * (idx == e)).sum(1, keepdim=True)
            y = y + share * pt.expert_forward(x, W1[e], W2[e], W3[e] if W3 is not None
                                              else None).float()
        ys.append(y)
    return ys


def check_epmoe(comm, dtype, *, swiglu, m_of, experts_per_rank=2, k=2, H=16, F=24, steps=0,
                seed=5, tag="", x_grad=True):
    """Gradients of x, router and experts, and `steps` SGD steps' losses, vs the dense layer.
    x_grad=False: x needs no gradient, so autograd runs combine's backward but not dispatch's,
    and the layer's backward op must settle that half-run pair at its next use."""
    W, rank = comm.size, comm.rank
    E = experts_per_rank * W
    max_tokens = max(m_of(r) for r in range(W)) or 1
    gen = torch.Generator().manual_seed(seed)
    router = (torch.randn(E, H, generator=gen) * 0.5).to(dtype)
    W1 = (torch.randn(E, H, F, generator=gen) / H ** 0.5).to(dtype)
    W2 = (torch.randn(E, F, H, generator=gen) / F ** 0.5).to(dtype)
    W3 = (torch.randn(E, H, F, generator=gen) / H ** 0.5).to(dtype) if swiglu else None
    xs_all = [torch.randn(m_of(r), H, generator=gen).to(dtype) for r in range(W)]
    targets = [torch.randn(m_of(r), H, generator=gen) for r in range(W)]
    total = sum(m_of(r) for r in range(W))
    name = f"{tag}EpMoE {dtype} swiglu={swiglu} W={W} rank {rank}"

    layer = pt.EpMoE(comm, hidden_dim=H, ffn_dim=F, num_experts=E, top_k=k,
                     max_tokens=max_tokens, swiglu=swiglu, dtype=dtype)
    layer.load_dense(router, W1, W2, W3)
    dense = [t.clone().float().requires_grad_() for t in (router, W1, W2)]
    dense.append(W3.clone().float().requires_grad_() if swiglu else None)
    lr = 0.2
    local = slice(layer.first_expert, layer.first_expert + E // W)
    for step in range(max(steps, 1)):
        x = xs_all[rank].detach().clone().requires_grad_(x_grad)
        y = layer(x)
        loss = ((y.float() - targets[rank]) ** 2).sum() / total
        loss.backward()
        for p in layer.replicated_parameters():
            dist.all_reduce(p.grad)
        loss_all = loss.detach().clone()
        dist.all_reduce(loss_all)

        xd = [t.detach().float().clone().requires_grad_() for t in xs_all]
        yd = dense_epmoe(xd, dense[0], dense[1], dense[2], dense[3], k, dtype)
        loss_d = sum(((yy - tt) ** 2).sum() for yy, tt in zip(yd, targets)) / total
        loss_d.backward()
        close(f"{name} step {step}: loss", loss_all, loss_d, dtype)
        if x_grad and layer.a2a.settles():  # full backward: every dispatch has its combine
            raise AssertionError(f"{name}: {layer.a2a.settles()} settling calls in training")
        if not x_grad and layer.a2a.settles() != step:  # one per step after the first
            raise AssertionError(f"{name}: {layer.a2a.settles()} settling calls after {step} steps")
        if step == 0:
            close(f"{name}: y", y, yd[rank], dtype)
            if x_grad:
                close(f"{name}: grad x", x.grad, xd[rank].grad, dtype)
            close(f"{name}: grad router", layer.router.weight.grad, dense[0].grad, dtype)
            close(f"{name}: grad w1", layer.w1.grad, dense[1].grad[local], dtype)
            close(f"{name}: grad w2", layer.w2.grad, dense[2].grad[local], dtype)
            if swiglu:
                close(f"{name}: grad w3", layer.w3.grad, dense[3].grad[local], dtype)
        with torch.no_grad():
            for p in layer.parameters():
                p -= lr * p.grad
                p.grad = None
            for p in dense:
                if p is not None:
                    p -= lr * p.grad
                    p.grad = None


def expect_error(what, fn, needle):
    try:
        fn()
    except pmoe.Error as e:
        if needle.lower() not in str(e).lower():
            raise AssertionError(f"{what}: pmoe.Error without '{needle}': {e}")
        return
    except Exception as e:  # noqa: BLE001 - the point is that it must be pmoe.Error
        raise AssertionError(f"{what}: raised {type(e).__name__}, not pmoe.Error: {e}")
    raise AssertionError(f"{what}: no error")


def check_bad_inputs(comm):
    W = comm.size
    a2a = pt.AllToAll(comm, max_tokens=4, num_experts=2 * W, top_k=2,
                      hidden_dim=8, dtype=torch.float32)
    idx = torch.tensor([[0, 1], [1, 0], [0, -1]])
    x = torch.randn(3, 8)
    expect_error("x float64", lambda: pt.dispatch(a2a, x.double(), idx), "dtype")
    expect_error("x non-contiguous", lambda: pt.dispatch(a2a, torch.randn(8, 3).t(), idx),
                 "contiguous")
    expect_error("x on meta", lambda: pt.dispatch(a2a, x.to("meta"), idx), "meta")
    expect_error("too many tokens", lambda: pt.dispatch(a2a, torch.randn(5, 8), idx), "max_tokens = 4")
    expect_error("indices require grad",
                 lambda: pt.dispatch(a2a, x, idx.float().requires_grad_()), "requires grad")
    expect_error("indices float", lambda: pt.dispatch(a2a, x, idx.float()), "dtype")
    expect_error("indices out of range", lambda: pt.dispatch(a2a, x, idx + 2 * W), "")
    expect_error("indices repeated", lambda: pt.dispatch(a2a, x, torch.tensor([[0, 0]] * 3)), "")
    expect_error("float64 layer", lambda: pt.AllToAll(
        comm, max_tokens=4, num_experts=2 * W, top_k=2, hidden_dim=8,
        dtype=torch.float64), "float64")
    rows = (a2a.num_local_experts, W * 4, 8)
    expect_error("expert_y bf16", lambda: pt.combine(a2a, torch.zeros(rows, dtype=torch.bfloat16),
                                                     idx, torch.ones(3, 2)), "dtype")
    expect_error("weights int", lambda: pt.combine(a2a, torch.zeros(rows), idx,
                                                   torch.ones(3, 2, dtype=torch.int32)),
                 "floating")
    rows, counts = pt.dispatch_packed(a2a, x, idx)
    expect_error("packed rows of another count", lambda: pt.combine_packed(
        a2a, torch.cat([rows, rows[:1]]) if rows.shape[0] else torch.zeros(1, 8), counts, idx,
        torch.ones(3, 2)), "counts say")
    expect_error("packed rows bf16", lambda: pt.combine_packed(
        a2a, rows.bfloat16(), counts, idx, torch.ones(3, 2)), "expected torch.float32")
    expect_error("packed weights at dispatch without weighted_dispatch", lambda:
                 pt.dispatch_packed(a2a, x, idx, torch.ones(3, 2)), "weighted_dispatch=True")
    expect_error("packed combine without weights", lambda: pt.combine_packed(
        a2a, rows, counts, idx), "weights missing")
    y = pt.combine_packed(a2a, rows, counts, idx, torch.ones(3, 2))  # completes the pair
    torch.testing.assert_close(y, x * (idx >= 0).sum(1, keepdim=True))
    weighted = pt.AllToAll(comm, max_tokens=4, num_experts=2 * W, top_k=2,
                           hidden_dim=8, weighted_dispatch=True)
    expect_error("padded dispatch, weighted", lambda: pt.dispatch(weighted, x, idx),
                 "dispatch_packed(a2a, x, indices, weights)")
    expect_error("packed dispatch, weighted, no weights", lambda: pt.dispatch_packed(
        weighted, x, idx), "pass the router weights")
    expect_error("packed dispatch, weighted, weights of another shape", lambda:
                 pt.dispatch_packed(weighted, x, idx, torch.ones(2, 2)), "[3, 2]")
    rows, counts, row_w = pt.dispatch_packed(weighted, x, idx, torch.full((3, 2), 0.5))
    expect_error("packed combine, weighted, weights given", lambda: pt.combine_packed(
        weighted, rows, counts, idx, torch.ones(3, 2)), "only sums")
    y = pt.combine_packed(weighted, rows * row_w.unsqueeze(1), counts, idx)
    torch.testing.assert_close(y, x * 0.5 * (idx >= 0).sum(1, keepdim=True))
    # The layer is still usable after rejected calls: a valid round trip.
    ex, _ = pt.dispatch(a2a, x, idx)
    y = pt.combine(a2a, ex, idx, torch.ones(3, 2))
    want = x * (idx >= 0).sum(1, keepdim=True)
    torch.testing.assert_close(y, want)


def check_disagreement(comm):
    """Rank 0 asks for another hidden size: every rank gets pmoe.Error naming the field."""
    H = 64 if comm.rank == 0 else 8  # sizes that differ after 64-byte alignment
    expect_error("config mismatch", lambda: pt.AllToAll(
        comm, max_tokens=4, num_experts=2 * comm.size, top_k=2, hidden_dim=H),
        "hidden_dim")
    # pmoe's own op, below the torch layer: its config agreement names the field and the values.
    expect_error("raw op config mismatch", lambda: pmoe.AllToAll(
        comm, max_tokens=4, num_experts=2 * comm.size, top_k=2, hidden_dim=H),
        "the ranks' configs differ in hidden_dim")


def run_cases(comm, tag=""):
    W = comm.size
    for dtype in (torch.float32, torch.bfloat16):
        check_dispatch_combine(comm, dtype, m_of=lambda r: 5 - r % 2, experts_per_rank=2, k=3,
                               drop=0.25, seed=11, tag=tag)
    # top-k = E, m = 0 on odd ranks, masked slots.
    check_dispatch_combine(comm, torch.float32, m_of=lambda r: 0 if r % 2 else 4,
                           experts_per_rank=1, k=W, drop=0.3, seed=12, tag=tag)
    # Packed rows, with and without the ops' own buffers; each AllToAll used twice, the second
    # time with other tokens, routes and counts (m = 0 on a rank included), so that rows left in
    # its kept buffers by the first call would show.
    # The same with the weights carried by dispatch (weighted_dispatch).
    for dtype, in_place, weighted in (
            (torch.float32, True, False), (torch.bfloat16, True, False),
            (torch.float32, False, False), (torch.float32, True, True),
            (torch.bfloat16, True, True), (torch.float32, False, True)):
        a2a = check_dispatch_combine(comm, dtype, m_of=lambda r: 5 - r % 2, experts_per_rank=2,
                                     k=3, drop=0.25, seed=13, tag=tag, packed=True,
                                     in_place=in_place, weighted=weighted)
        check_dispatch_combine(comm, dtype, m_of=lambda r: 0 if r == 1 else 3 + r % 2,
                               experts_per_rank=2, k=3, drop=0.25, seed=14, tag=tag, packed=True,
                               in_place=in_place, weighted=weighted, a2a=a2a)
    check_epmoe(comm, torch.float32, swiglu=True, m_of=lambda r: 6 - r, steps=4, tag=tag)


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, W = dist.get_rank(), dist.get_world_size()
    comm = pt.communicator()
    assert comm.rank == rank and comm.size == W
    assert comm.node_ranks == list(range(W)), comm.node_ranks
    comm.barrier()

    run_cases(comm)
    check_epmoe(comm, torch.float32, swiglu=False, m_of=lambda r: 0 if r == 1 else 5)
    # bf16: one step (gradients); later steps would compare bf16 parameters with f32 ones.
    check_epmoe(comm, torch.bfloat16, swiglu=True, m_of=lambda r: 4 + r % 2)
    check_epmoe(comm, torch.float32, swiglu=False, m_of=lambda r: 3 + r, steps=3, x_grad=False,
                tag="x without grad: ")
    check_bad_inputs(comm)

    # Two "nodes": the first half of the ranks on one, the rest on the other.
    os.environ["PMOE_NODE"] = f"node{rank * 2 // W}"
    two = pt.communicator()
    half = W // 2
    mates = list(range(0, half)) if rank < half else list(range(half, W))
    assert two.node_ranks == mates, (two.node_ranks, mates)
    run_cases(two, tag="two nodes: ")

    check_disagreement(comm)
    comm.barrier()
    dist.barrier()
    if rank == 0:
        print(f"torchrun pmoe.torch: {W} processes passed")
    dist.destroy_process_group()


if __name__ == "__main__":
    try:
        main()
    except BaseException as e:
        traceback.print_exc()
        print(f"rank {os.environ.get('RANK')}: FAILED: {type(e).__name__}: {e}", file=sys.stderr,
              flush=True)
        os._exit(1)  # do not wait in gloo's teardown for peers that may be stuck
