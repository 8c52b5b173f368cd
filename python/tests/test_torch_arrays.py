"""Torch CPU tensors through pmoe's plain API: torch.topk's int64 indices work as they are, and a
layer given a torch tensor returns one (same dtype, same device), equal to what NumPy input gives.
(The autograd layer, pmoe.torch, has tests of its own under torchrun.)"""
import numpy as np
import pytest
import torch

import pmoe
import pmoe.torch as pt


def test_layers_return_torch_for_torch_input():
    config = pmoe.MoeConfig(hidden_dim=16, ffn_dim=32, num_experts=4, top_k=2, act="swiglu",
                            seed=9)
    x = torch.rand(5, 16, generator=torch.Generator().manual_seed(1)) * 2 - 1
    layer = pmoe.SimpleMoe(config, max_tokens=8)
    y = layer.forward(x)
    assert isinstance(y, torch.Tensor) and y.dtype == torch.float32 and y.shape == (5, 16)
    np.testing.assert_array_equal(y.numpy(), layer.forward(x.numpy()))

    bf16 = pmoe.MoeConfig(hidden_dim=16, ffn_dim=32, num_experts=4, top_k=2, dtype="bf16",
                          seed=9)
    y16 = pmoe.SimpleMoe(bf16, max_tokens=8).forward(x.to(torch.bfloat16))
    assert isinstance(y16, torch.Tensor) and y16.dtype == torch.bfloat16


def test_ep_layer_with_torch_tensors_on_thread_ranks():
    config = pmoe.MoeConfig(hidden_dim=8, ffn_dim=16, num_experts=4, top_k=2, seed=2)
    x = torch.linspace(-1, 1, 6 * 8).reshape(6, 8)
    want = pmoe.SimpleMoe(config, max_tokens=6).forward(x)
    got = {}

    def rank_main(comm):
        layer = pmoe.EpMoe(comm, config, max_tokens=3)
        got[comm.rank] = layer.forward(x[3 * comm.rank:3 * comm.rank + 3].contiguous())
    pmoe.run_ranks(2, rank_main)
    y = torch.cat([got[0], got[1]])
    assert isinstance(got[0], torch.Tensor)
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-6)


def test_all_to_all_takes_topk_int64_indices():
    E, k, H, m = 4, 2, 8, 3

    def rank_main(comm):
        op = pmoe.AllToAll(comm, max_tokens=m, num_experts=E, top_k=k,
                           hidden_dim=H, in_dtype="f32", out_dtype="f32")
        x = torch.arange(m * H, dtype=torch.float32).reshape(m, H) + 100 * comm.rank
        scores = torch.tensor([[0.1, 0.9, 0.3, 0.2], [0.8, 0.1, 0.7, 0.0], [0.0, 0.1, 0.2, 0.9]])
        weights, indices = torch.topk(scores, k)
        assert indices.dtype == torch.int64
        counts = torch.zeros(op.num_local_experts, dtype=torch.int32)
        expert_x = torch.zeros(op.num_local_experts, comm.size * m, H)
        op.dispatch(x, indices, counts, expert_x)
        # Identity experts: combine gives back sum_j w_j * x.
        y = torch.zeros(m, H)
        op.combine(expert_x, indices, weights.contiguous(), y)
        torch.testing.assert_close(y, x * weights.sum(1, keepdim=True), rtol=1e-6, atol=1e-5)
    pmoe.run_ranks(2, rank_main)


def test_raw_ops_refuse_what_they_cannot_take_with_pmoe_error():
    def rank_main(comm):
        op = pmoe.AllToAll(comm, max_tokens=2, num_experts=2, top_k=1,
                           hidden_dim=4, in_dtype="f32", out_dtype="f32")
        counts, expert_x = torch.zeros(2, dtype=torch.int32), torch.zeros(2, 2, 4)
        indices = torch.zeros(2, 1, dtype=torch.int64)
        x = torch.zeros(2, 4, requires_grad=True)
        with pytest.raises(pmoe.Error, match=r"`x` requires grad: pmoe's ops record no gradients; "
                                             r"pass x.detach\(\), or use pmoe.torch"):
            op.dispatch(x, indices, counts, expert_x)
        with pytest.raises(pmoe.Error, match="`indices` must be an array .* got list"):
            op.dispatch(x.detach(), [[0], [1]], counts, expert_x)
        with pytest.raises(pmoe.Error, match="`x`: this Tensor refused to export itself through DLPack"):
            op.dispatch(x.detach().to("meta"), indices, counts, expert_x)
        op.dispatch(x.detach(), indices, counts, expert_x)  # the op is still usable
        assert counts.tolist() == [2, 0]
    pmoe.run_ranks(1, rank_main)


def test_padded_functions_refuse_an_in_place_all_to_all():
    """Its ops lay rows out packed, for dispatch_packed and combine_packed only."""
    def rank_main(comm):
        a2a = pt.AllToAll(comm, max_tokens=3, num_experts=2, top_k=1,
                          hidden_dim=4, in_place_buffers=True)
        x, indices = torch.randn(3, 4), torch.zeros(3, 1, dtype=torch.int64)
        with pytest.raises(pmoe.Error, match=r"dispatch: this AllToAll was made with "
                                             r"in_place_buffers=True.*use those"):
            pt.dispatch(a2a, x, indices)
        rows, counts = pt.dispatch_packed(a2a, x, indices)  # what it is for
        y = pt.combine_packed(a2a, rows, counts, indices, torch.ones(3, 1))
        torch.testing.assert_close(y, x, rtol=0, atol=0)
    pmoe.run_ranks(1, rank_main)


def test_torch_layer_passes_int64_indices_through():
    """pmoe.torch hands torch.topk's int64 indices to the ops as they are: no int32 copy."""
    import pmoe.torch

    class Spy:
        """Records the indices each call of the wrapped op receives."""

        def __init__(self, op, seen):
            self.op, self.seen = op, seen

        def dispatch(self, x, indices, *rest):
            self.seen.append(indices)
            return self.op.dispatch(x, indices, *rest)

        def combine(self, expert_y, indices, *rest):
            self.seen.append(indices)
            return self.op.combine(expert_y, indices, *rest)

        def __getattr__(self, name):
            return getattr(self.op, name)

    E, k, H, m = 4, 2, 8, 3

    def rank_main(comm):
        a2a = pmoe.torch.AllToAll(comm, max_tokens=m, num_experts=E, top_k=k,
                                  hidden_dim=H)
        seen = []
        a2a.forward_exchange.op = Spy(a2a.forward_exchange.op, seen)
        x = torch.rand(m, H, generator=torch.Generator().manual_seed(comm.rank))
        scores = torch.rand(m, E, generator=torch.Generator().manual_seed(7 + comm.rank))
        weights, indices = torch.topk(scores, k)
        expert_x, _ = pmoe.torch.dispatch(a2a, x, indices)
        y = pmoe.torch.combine(a2a, expert_x, indices, weights)
        assert len(seen) == 2 and all(i is indices for i in seen), [i.dtype for i in seen]
        torch.testing.assert_close(y, x * weights.sum(1, keepdim=True), rtol=1e-6, atol=1e-5)
    pmoe.run_ranks(2, rank_main)
