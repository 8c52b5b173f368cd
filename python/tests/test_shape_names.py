"""One name per dimension (pmoe.MoeShape) from pmoe.torch to the kernels, and the names the
dimensions had before, which still work for one release with a DeprecationWarning: they build
the same op or layer, and disagreeing with the new name is an error."""
import warnings

import numpy as np
import pytest

import pmoe

SHAPE = dict(max_tokens=6, num_experts=4, top_k=2, hidden_dim=8)


def test_an_all_to_all_says_its_shape():
    def rank_main(comm):
        a2a = pmoe.AllToAll(comm, in_dtype="f32", out_dtype="f32", **SHAPE)
        assert a2a.shape == pmoe.MoeShape(**SHAPE), a2a.shape
    pmoe.run_ranks(2, rank_main)
    config = pmoe.MoeConfig(hidden_dim=8, ffn_dim=4, num_experts=4, top_k=2)
    assert config.shape(6) == pmoe.MoeShape(**SHAPE)
    assert "max_tokens=6" in repr(config.shape(6))


# The warnings are caught around run_ranks: the warnings module's state is the process's, not
# a thread's.
def test_the_old_all_to_all_names_warn_and_build_the_same_op():
    def rank_main(comm):
        a2a = pmoe.AllToAll(comm, max_num_tokens=6, num_experts=4, experts_per_token=2,
                            hidden_dim=8, in_dtype="f32", out_dtype="f32")
        assert a2a.shape == pmoe.MoeShape(**SHAPE)
    with pytest.warns(DeprecationWarning) as caught:
        pmoe.run_ranks(2, rank_main)
    said = {str(w.message) for w in caught}
    assert said == {"AllToAll: max_num_tokens is deprecated; pass max_tokens instead",
                    "AllToAll: experts_per_token is deprecated; pass top_k instead"}, said


def test_an_old_name_that_disagrees_is_an_error():
    def rank_main(comm):
        with pytest.raises(pmoe.Error, match="top_k = 2 and experts_per_token = 3"):
            pmoe.AllToAll(comm, experts_per_token=3, **SHAPE)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        pmoe.run_ranks(1, rank_main)
    with pytest.raises(TypeError, match="missing the argument max_tokens"):
        pmoe.run_ranks(1, lambda comm: pmoe.AllToAll(comm, num_experts=4, top_k=2, hidden_dim=8))


def test_the_old_layer_names_warn_and_build_the_same_layer():
    x = np.random.default_rng(0).uniform(-1, 1, size=(5, 8)).astype(np.float32)
    now = pmoe.MoeConfig(hidden_dim=8, ffn_dim=16, num_experts=4, top_k=2, seed=3)
    with pytest.warns(DeprecationWarning, match="feature_dim is deprecated"):
        old = pmoe.MoeConfig(feature_dim=8, ffn_dim=16, num_experts=4, top_k=2, seed=3)
    assert old.hidden_dim == 8
    with pytest.warns(DeprecationWarning, match="MoeConfig.feature_dim is deprecated"):
        assert old.feature_dim == 8
    np.testing.assert_array_equal(pmoe.SimpleMoe(old, 5).forward(x),
                                  pmoe.SimpleMoe(now, 5).forward(x))

    def rank_main(comm):
        pmoe.EpMoe(comm, now, max_tokens_per_rank=5)
        pmoe.EpMoe(comm, now, 5)  # the bound by position, as before
    with pytest.warns(DeprecationWarning, match="max_tokens_per_rank is deprecated"):
        pmoe.run_ranks(2, rank_main)


def test_the_old_torch_names_warn():
    torch = pytest.importorskip("torch")
    pt = pytest.importorskip("pmoe.torch")

    def rank_main(comm):
        a2a = pt.AllToAll(comm, max_num_tokens=6, num_experts=4, experts_per_token=2,
                          hidden_dim=8)
        assert (a2a.max_tokens, a2a.top_k) == (6, 2)
        assert a2a.max_num_tokens == 6  # the old attribute, read once more (it warns)
        pt.EpMoE(comm, hidden_dim=8, ffn_dim=16, num_experts=4, top_k=2, max_num_tokens=6,
                 dtype=torch.float32)
    with pytest.warns(DeprecationWarning) as caught:
        pmoe.run_ranks(2, rank_main)
    said = {str(w.message) for w in caught}
    assert "pmoe.torch.AllToAll: max_num_tokens is deprecated; pass max_tokens instead" in said
    assert "pmoe.torch.AllToAll: experts_per_token is deprecated; pass top_k instead" in said
    assert "pmoe.torch.EpMoE: max_num_tokens is deprecated; pass max_tokens instead" in said
    assert "pmoe.torch.AllToAll.max_num_tokens is deprecated; read max_tokens instead" in said
