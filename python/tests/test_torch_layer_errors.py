"""pmoe.torch.EpMoE on 1 and 2 thread ranks (pmoe.run_ranks, no torchrun): input the layer cannot
take raises pmoe.Error naming what came and what it accepts, before any work, and the layer
works afterwards."""
import pytest

import pmoe

torch = pytest.importorskip("torch")
pt = pytest.importorskip("pmoe.torch")


def make_layer(comm, dtype=torch.float32):
    torch.manual_seed(3)
    return pt.EpMoE(comm, hidden_dim=8, ffn_dim=16, num_experts=2 * comm.size, top_k=2,
                    max_tokens=4, dtype=dtype)


@pytest.mark.parametrize("ranks", [1, 2])
def test_float64_input_names_the_dtypes(ranks):
    def rank_main(comm):
        layer = make_layer(comm)
        x = torch.randn(3, 8, generator=torch.Generator().manual_seed(comm.rank))
        with pytest.raises(pmoe.Error, match=r"EpMoE: x is torch\.float64, but this layer was "
                                             r"built with dtype=torch\.float32") as caught:
            layer(x.double())
        assert "torch.bfloat16 or torch.float16" in str(caught.value)
        assert layer(x).shape == (3, 8)  # every rank rejected the same call before it began
    pmoe.run_ranks(ranks, rank_main)


def test_bf16_input_to_an_f32_layer_is_refused_too():
    def rank_main(comm):
        layer = make_layer(comm)
        with pytest.raises(pmoe.Error, match=r"x is torch\.bfloat16.*x\.to\(torch\.float32\)"):
            layer(torch.zeros(2, 8, dtype=torch.bfloat16))
    pmoe.run_ranks(1, rank_main)


def test_other_bad_input_is_pmoe_error_before_the_router():
    def rank_main(comm):
        layer = make_layer(comm)
        with pytest.raises(pmoe.Error, match=r"shape \(3, 6\), expected \[m, 8\]"):
            layer(torch.zeros(3, 6))
        with pytest.raises(pmoe.Error, match="5 tokens, more than max_tokens = 4"):
            layer(torch.zeros(5, 8))
        with pytest.raises(pmoe.Error, match="expected a torch.Tensor, got list"):
            layer([[0.0] * 8])
    pmoe.run_ranks(1, rank_main)


def test_float64_layer_is_refused_at_construction():
    def rank_main(comm):
        with pytest.raises(pmoe.Error, match="float64"):
            make_layer(comm, dtype=torch.float64)
    pmoe.run_ranks(1, rank_main)
