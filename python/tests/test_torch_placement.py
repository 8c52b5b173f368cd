"""pmoe.torch with an expert placement (replicas of experts on several ranks), on thread ranks:
dispatch/combine (padded and packed, the weights with combine or carried by dispatch) and their
gradients equal a single-process reference over the logical experts, and an EpMoE whose every
expert has a replica on each rank gives the whole model's output and gradients."""
import pytest

torch = pytest.importorskip("torch")

import pmoe  # noqa: E402
import pmoe.torch as pt  # noqa: E402

WORLD, HIDDEN, TOP_K, TOKENS = 2, 16, 2, 5
# 3 logical experts on 4 slots: rank 0 serves experts 0 and 1, rank 1 serves 2 and 0 again.
PLACEMENT = [0, 1, 2, 0]
LOGICAL = 3


def routed(rank):
    """x [m, H], indices [m, k] over the logical experts (a skipped slot in row 0), weights."""
    gen = torch.Generator().manual_seed(rank + 7)
    m = TOKENS - rank
    x = torch.randn(m, HIDDEN, generator=gen)
    indices = torch.rand(m, LOGICAL, generator=gen).topk(TOP_K, dim=-1).indices
    indices[0, 1] = -1
    weights = torch.rand(m, TOP_K, generator=gen)
    return x, indices, weights


def reference(x, indices, weights):
    """y[t] = sum_j w[t, j] * (e + 1) * x[t] for e = indices[t, j] >= 0: each logical expert
    scales its rows by its id plus one, wherever its slot is."""
    scale = torch.where(indices >= 0, indices + 1, torch.zeros_like(indices)).to(x.dtype)
    return ((weights * scale).unsqueeze(-1) * x.unsqueeze(1)).sum(1)


@pytest.mark.parametrize("path", ["padded", "packed", "weighted"])
def test_exchange_with_replicas_equals_the_reference(path):
    results = {}

    def rank_main(comm):
        x, indices, weights = routed(comm.rank)
        a2a = pt.AllToAll(comm, max_tokens=TOKENS, num_experts=len(PLACEMENT),
                          top_k=TOP_K, hidden_dim=HIDDEN, placement=PLACEMENT,
                          weighted_dispatch=path == "weighted")
        assert a2a.num_logical_experts == LOGICAL and a2a.num_local_experts == 2
        local = torch.arange(a2a.num_local_experts)
        served = a2a.logical_experts(local)
        assert served.tolist() == PLACEMENT[2 * comm.rank:2 * comm.rank + 2]
        xg, wg = x.clone().requires_grad_(), weights.clone().requires_grad_()
        if path == "padded":
            expert_x, _ = pt.dispatch(a2a, xg, indices)
            expert_y = expert_x * (served + 1).view(-1, 1, 1).to(expert_x.dtype)
            y = pt.combine(a2a, expert_y.contiguous(), indices, wg)
        else:
            out = pt.dispatch_packed(a2a, xg, indices, wg if path == "weighted" else None)
            rows, counts = out[0], out[1]
            expert = torch.repeat_interleave(served, counts.long())
            rows = rows * (expert + 1).unsqueeze(1).to(rows.dtype)
            if path == "weighted":
                y = pt.combine_packed(a2a, rows * out[2].unsqueeze(1), counts, indices)
            else:
                y = pt.combine_packed(a2a, rows, counts, indices, wg)
        (y * torch.arange(1.0, HIDDEN + 1)).sum().backward()
        xr, wr = x.clone().requires_grad_(), weights.clone().requires_grad_()
        want = reference(xr, indices, wr)
        (want * torch.arange(1.0, HIDDEN + 1)).sum().backward()
        results[comm.rank] = (y.detach(), want.detach(), xg.grad, xr.grad, wg.grad, wr.grad)

    pmoe.run_ranks(WORLD, rank_main)
    for rank, (y, want, gx, gx_want, gw, gw_want) in results.items():
        torch.testing.assert_close(y, want, msg=f"rank {rank}: y")
        torch.testing.assert_close(gx, gx_want, msg=f"rank {rank}: grad x")
        # The skipped slot's weight has no gradient through the exchange (zero): so in the
        # reference, whose scale is zero there.
        torch.testing.assert_close(gw, gw_want, msg=f"rank {rank}: grad weights")


def test_ep_layer_with_every_expert_on_every_rank_is_the_whole_model():
    """4 experts, 8 slots over 2 ranks, each rank holding all 4: the layer's output and input
    gradient equal the single-process model's (route, then every token's k experts)."""
    E, F = 4, 8
    placement = [0, 1, 2, 3, 3, 2, 1, 0]
    gen = torch.Generator().manual_seed(5)
    router = torch.randn(E, HIDDEN, generator=gen) / 4
    w1, w2, w3 = (torch.randn(shape, generator=gen) / 4 for shape in
                  ((E, HIDDEN, F), (E, F, HIDDEN), (E, HIDDEN, F)))
    results = {}

    def rank_main(comm):
        layer = pt.EpMoE(comm, hidden_dim=HIDDEN, ffn_dim=F, num_experts=E, top_k=TOP_K,
                         max_tokens=TOKENS, swiglu=True, placement=placement)
        assert layer.w1.shape == (4, HIDDEN, F)  # this rank's 4 slots
        layer.load_dense(router, w1, w2, w3)
        x = torch.randn(TOKENS - comm.rank, HIDDEN,
                        generator=torch.Generator().manual_seed(comm.rank)).requires_grad_()
        y = layer(x)
        y.square().sum().backward()
        xr = x.detach().clone().requires_grad_()
        indices, weights = pt.route(xr, router, TOP_K)
        want = torch.stack([
            sum(weights[t, j] * pt.expert_forward(xr[t:t + 1], w1[e], w2[e], w3[e])[0]
                for j, e in enumerate(indices[t].tolist())) for t in range(xr.shape[0])])
        want.square().sum().backward()
        results[comm.rank] = (y.detach(), want.detach(), x.grad, xr.grad)

    pmoe.run_ranks(WORLD, rank_main)
    for rank, (y, want, gx, gx_want) in results.items():
        torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5, msg=f"rank {rank}: y")
        torch.testing.assert_close(gx, gx_want, rtol=1e-5, atol=1e-5, msg=f"rank {rank}: grad")


def test_a_placement_naming_no_expert_is_refused():
    def rank_main(comm):
        with pytest.raises(pmoe.Error, match="placement"):
            pt.AllToAll(comm, max_tokens=2, num_experts=2, top_k=1,
                        hidden_dim=4, placement=[0, -1])

    pmoe.run_ranks(WORLD, rank_main)
