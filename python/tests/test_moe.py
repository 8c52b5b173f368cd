"""pmoe's MoE layers against a NumPy reference written here: router, experts and the weighted sum
in float64 from the same generated weights (pmoe.moe_weights)."""
import math
import threading

import numpy as np
import pytest

import pmoe
from reference import bf16_bits_to_f32, f32_to_bf16_bits


def numpy_moe(config, x):
    """y[t] = sum_j softmax(top-k logits)_j * FFN_{e_j}(x[t]), in float64."""
    x = x.astype(np.float64)
    logits = x @ pmoe.moe_weights(config, "router").astype(np.float64)
    y = np.zeros((x.shape[0], config.out_dim))
    erf = np.vectorize(math.erf)
    for t in range(x.shape[0]):
        chosen = np.argsort(-logits[t], kind="stable")[:config.top_k]
        weights = np.exp(logits[t, chosen] - logits[t, chosen].max())
        weights /= weights.sum()
        for e, w in zip(chosen, weights):
            h = x[t] @ pmoe.moe_weights(config, "w1", e).astype(np.float64)
            if config.act == "relu":
                h = np.maximum(h, 0)
            elif config.act == "gelu":
                h = 0.5 * h * (1 + erf(h / math.sqrt(2)))
            else:  # swiglu: silu(gate) * linear
                linear = x[t] @ pmoe.moe_weights(config, "w1_linear", e).astype(np.float64)
                h = h / (1 + np.exp(-h)) * linear
            y[t] += w * (h @ pmoe.moe_weights(config, "w2", e).astype(np.float64))
    return y


def relative_error(got, want):
    return np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30)


def tokens(batch, hidden_dim, seed=0):
    return np.random.default_rng(seed).uniform(-1, 1, size=(batch, hidden_dim)).astype(np.float32)


@pytest.mark.parametrize("act", ["relu", "gelu", "swiglu"])
def test_simple_moe_matches_numpy(act):
    config = pmoe.MoeConfig(hidden_dim=24, ffn_dim=40, num_experts=4, top_k=2, act=act, seed=3)
    x = tokens(7, 24)
    y = pmoe.SimpleMoe(config, max_tokens=8).forward(x)
    assert relative_error(y, numpy_moe(config, x)) <= 1e-5


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_tp_and_ep_match_numpy(world_size):
    config = pmoe.MoeConfig(hidden_dim=16, ffn_dim=32, output_dim=12, num_experts=8, top_k=8,
                            act="swiglu", seed=5)
    x = tokens(10, 16, seed=1)  # 10 tokens: not divisible by 4 ranks
    want = numpy_moe(config, x)
    shards = np.array_split(np.arange(10), world_size)
    results = {}

    def rank_main(comm):
        tp = pmoe.TpMoe(comm, config, max_tokens=10)
        results[("tp", comm.rank)] = tp.forward(x)
        for micro_batches in (1, 2):
            ep = pmoe.EpMoe(comm, config, max_tokens=len(shards[0]),
                            micro_batches=micro_batches)
            results[("ep", micro_batches, comm.rank)] = ep.forward(x[shards[comm.rank]])

    pmoe.run_ranks(world_size, rank_main)
    for r in range(world_size):
        assert relative_error(results[("tp", r)], want) <= 1e-5
        for micro_batches in (1, 2):
            got = results[("ep", micro_batches, r)]
            assert relative_error(got, want[shards[r]]) <= 1e-5 or len(shards[r]) == 0
    # One or two micro-batches: the same layer (BLAS may block the smaller GEMMs differently).
    one = np.concatenate([results[("ep", 1, r)] for r in range(world_size)])
    two = np.concatenate([results[("ep", 2, r)] for r in range(world_size)])
    assert relative_error(two, one) <= 1e-6


def test_ep_with_replicas_and_a_masked_rank_matches_numpy():
    """Every expert on two of 4 ranks (rank r + 2 holds rank r's): after rank 3 stops and the
    others mask it, their outputs still match the whole model's."""
    config = pmoe.MoeConfig(hidden_dim=16, ffn_dim=24, num_experts=4, top_k=2, act="gelu", seed=5)
    x = tokens(10, 16, seed=2)
    want = numpy_moe(config, x)
    shards = np.array_split(np.arange(10), 4)
    results, errors = {}, []
    done = threading.Barrier(4)

    def rank_main(comm):
        try:
            layer = pmoe.EpMoe(comm, config, max_tokens=len(shards[0]),
                               placement=[s % 4 for s in range(8)], rank_mask=True)
            for call in range(3):
                if call == 1:
                    if comm.rank == 3:
                        return  # stops; keeps its layer until every rank is done
                    layer.mask_rank(3, "stopped")
                    assert layer.live_ranks == [True, True, True, False]
                    assert layer.lost_experts() == []
                results[(call, comm.rank)] = layer.forward(x[shards[comm.rank]])
        except AssertionError as e:
            errors.append(f"rank {comm.rank}: {e}")
        finally:
            done.wait(timeout=120)

    pmoe.run_ranks(4, rank_main)
    assert not errors, errors
    for (call, r), got in results.items():
        assert relative_error(got, want[shards[r]]) <= 1e-5, (call, r)


def test_bf16_layer_within_bf16_tolerance():
    config = pmoe.MoeConfig(hidden_dim=32, ffn_dim=64, num_experts=4, top_k=2, dtype="bf16", seed=2)
    x_bits = f32_to_bf16_bits(tokens(5, 32))
    y_bits = pmoe.SimpleMoe(config, max_tokens=5).forward(x_bits)
    assert y_bits.dtype == np.uint16
    assert relative_error(bf16_bits_to_f32(y_bits), numpy_moe(config, bf16_bits_to_f32(x_bits))) <= 2e-2


def test_bad_configs_raise_with_messages():
    with pytest.raises(pmoe.Error, match="top_k = 5 must be in 1..num_experts = 4"):
        pmoe.MoeConfig(hidden_dim=8, ffn_dim=8, num_experts=4, top_k=5)
    with pytest.raises(pmoe.Error, match="unknown activation|activation"):
        pmoe.MoeConfig(hidden_dim=8, ffn_dim=8, num_experts=4, top_k=1, act="tanh")
    config = pmoe.MoeConfig(hidden_dim=8, ffn_dim=8, num_experts=6, top_k=1)

    def rank_main(comm):
        with pytest.raises(pmoe.Error, match="not divisible by the 4 ranks"):
            pmoe.EpMoe(comm, config, max_tokens=2)
    pmoe.run_ranks(4, rank_main)

    with pytest.raises(pmoe.Error, match="x"):
        pmoe.SimpleMoe(config, max_tokens=2).forward(np.zeros((3, 8), np.float32))


def test_too_many_tokens_names_the_keyword_to_raise():
    """Each layer's message names its own constructor keyword, the one the caller can change."""
    config = pmoe.MoeConfig(hidden_dim=8, ffn_dim=8, num_experts=2, top_k=1)
    x = np.zeros((3, 8), np.float32)
    with pytest.raises(pmoe.Error, match="3 tokens, more than the 2 this layer was built for; "
                                         "build it with a larger max_tokens$"):
        pmoe.SimpleMoe(config, max_tokens=2).forward(x)

    def rank_main(comm):
        layer = pmoe.EpMoe(comm, config, max_tokens=2)
        with pytest.raises(pmoe.Error, match="build it with a larger max_tokens$"):
            layer.forward(x)
        assert layer.forward(x[:2]).shape == (2, 8)  # the rejected call cost the layer nothing
    pmoe.run_ranks(2, rank_main)
