"""pmoe.AllToAll on a CUDA device with arrays in pmoe's own memory (pmoe.zeros, pmoe.copy), ranks
sharing one device, against the NumPy reference: the twin of test_torch_cuda.py that needs no
torch and no GPU. Where no GPU is visible it runs on pmoe's emulated CUDA device, which every
build of pmoe has, so it never skips."""
import numpy as np
import pytest

import pmoe
from reference import check_f32_round_trip, make_inputs


def on_device(array, device):
    out = pmoe.zeros(array.shape, "i32" if array.dtype == np.int32 else "f32", device)
    pmoe.copy(out, np.ascontiguousarray(array))
    return out


def to_host(array, shape, dtype):
    out = np.zeros(shape, dtype)
    pmoe.copy(out, array)
    return out


def test_cuda_ranks_run_in_every_build():
    """device='cuda:N' runs on a GPU, or on the emulated device where none is visible."""
    assert pmoe.cuda_available()
    seen = {}

    def rank_main(comm):
        seen[comm.rank] = (comm.device, comm.stream)

    pmoe.run_ranks(2, rank_main, device="cuda:0")
    assert seen[0][0] == seen[1][0] == "cuda:0"
    assert 0 not in (seen[0][1], seen[1][1]) and seen[0][1] != seen[1][1]  # a stream per rank


@pytest.mark.parametrize("world_size,ranks_per_node,cross_node,sums_in_node",
                         [(1, 0, "direct", False), (2, 0, "direct", False),
                          (4, 0, "direct", False), (4, 2, "direct", False),
                          (4, 2, "hierarchical", False), (4, 2, "hierarchical", True)])
def test_dispatch_combine_on_device_arrays(world_size, ranks_per_node, cross_node, sums_in_node):
    """ranks_per_node = 2 splits the 4 ranks into two nodes (remote puts between them, on the
    emulated device through its proxy), each cross_node mode with its own kernels, and
    hierarchical with the node's relay summing its experts' rows (another f32 sum order, so y
    within rounding); on a GPU, which these ranks share, the split is refused by name."""
    max_tokens, num_experts, hidden = 6, 2 * world_size, 64
    top_k = min(3, num_experts)
    inputs = [make_inputs(r, max_tokens - r % 2, num_experts, top_k, hidden, "f32", seed=3)
              for r in range(world_size)]
    outcome = {}

    def rank_main(comm):
        device = comm.device
        a2a = pmoe.AllToAll(comm, max_tokens=max_tokens, num_experts=num_experts,
                            top_k=top_k, hidden_dim=hidden, in_dtype="f32",
                            out_dtype="f32", ranks_per_node=ranks_per_node,
                            cross_node=cross_node, combine_sums_in_node=sums_in_node)
        local, rows = a2a.num_local_experts, world_size * max_tokens
        x, indices, weights = (on_device(a, device) for a in inputs[comm.rank])
        m = len(inputs[comm.rank][0])
        counts = pmoe.zeros([local], "i32", device)
        expert_x = pmoe.zeros([local, rows, hidden], "f32", device)
        y = pmoe.zeros([m, hidden], "f32", device)
        a2a.dispatch(x, indices, counts, expert_x)
        comm.synchronize()
        host_x = to_host(expert_x, (local, rows, hidden), np.float32)
        scale = np.array([1 + 0.125 * (comm.rank * local + e) for e in range(local)],
                         np.float32).reshape(local, 1, 1)
        expert_y = on_device(host_x * scale, device)  # the stand-in experts of reference.py
        a2a.combine(expert_y, indices, weights, y)
        comm.synchronize()
        outcome[comm.rank] = (to_host(counts, (local,), np.int32), host_x,
                              to_host(y, (m, hidden), np.float32))

    if ranks_per_node and not pmoe.cuda_emulated():
        # These ranks share one GPU, and NCCL gives GIN one rank of a communicator per GPU: the
        # split is refused by name (scripts/device_checks.sh's gin part runs it across processes).
        with pytest.raises(pmoe.Error, match="ranks sharing a GPU cannot take the GPU remote path"):
            pmoe.run_ranks(world_size, rank_main, device="cuda:0")
        return
    pmoe.run_ranks(world_size, rank_main, device="cuda:0")
    check_f32_round_trip(outcome, inputs, world_size, num_experts,
                         y_rtol=1e-6 if sums_in_node else 0.0)


def test_combine_sums_in_node_is_refused_by_name_where_it_cannot_run():
    """The CPU backend has no node-summed combine, and direct mode has no relay to sum at."""
    def on(device, **split):
        def rank_main(comm):
            pmoe.AllToAll(comm, max_tokens=4, num_experts=4, top_k=1,
                          hidden_dim=8, in_dtype="f32", out_dtype="f32",
                          combine_sums_in_node=True, **split)
        pmoe.run_ranks(2, rank_main, device=device)

    with pytest.raises(pmoe.Error, match="combine_sums_in_node"):
        on("cpu")
    with pytest.raises(pmoe.Error, match="combine_sums_in_node"):
        on("cuda:0", ranks_per_node=1, cross_node="direct")


def test_cpu_array_on_a_cuda_rank_is_rejected():
    def rank_main(comm):
        a2a = pmoe.AllToAll(comm, max_tokens=4, num_experts=2, top_k=1,
                            hidden_dim=8, in_dtype="f32", out_dtype="f32")
        x = np.zeros((4, 8), np.float32)
        indices = on_device(np.zeros((4, 1), np.int32), comm.device)
        counts = pmoe.zeros([2], "i32", comm.device)
        expert_x = pmoe.zeros([2, 4, 8], "f32", comm.device)
        # The message says what to pass instead: pmoe's own device arrays (or, on a GPU, its
        # frameworks' tensors).
        hint = "pmoe.zeros filled by pmoe.copy"
        with pytest.raises(pmoe.Error, match=f"`x` must be on cuda:0, got cpu .*{hint}"):
            a2a.dispatch(x, indices, counts, expert_x)

    pmoe.run_ranks(1, rank_main, device="cuda:0")


def test_cuda_available_says_what_arrays_the_emulated_device_takes():
    assert "pmoe.zeros" in pmoe.cuda_available.__doc__
    assert "pmoe.copy" in pmoe.cuda_available.__doc__


def test_bad_device_name_is_rejected():
    with pytest.raises(pmoe.Error, match="cuda:N"):
        pmoe.zeros([2], "f32", "cuda:x")


@pytest.mark.parametrize("order", ["all_pairs", "ring"])
def test_overlap_ops_on_device_arrays(order):
    """AllGatherGemm and GemmReduceScatter on a CUDA communicator, against NumPy's A @ B."""
    world_size, m, n, k = 2, 8, 6, 4
    rng = np.random.default_rng(5)
    a = rng.uniform(-1, 1, (m, k)).astype(np.float32)
    b = rng.uniform(-1, 1, (k, n)).astype(np.float32)
    outcome = {}

    def rank_main(comm):
        r, w, device = comm.rank, comm.size, comm.device
        rows, cols = slice(r * m // w, (r + 1) * m // w), slice(r * n // w, (r + 1) * n // w)
        depth = slice(r * k // w, (r + 1) * k // w)
        # Device arrays live until the stream has run: freeing one waits for every stream of the
        # device, the peer's too, which may be waiting for this rank's next call.
        a_ag, b_ag = on_device(a[rows], device), on_device(b[:, cols], device)
        a_rs, b_rs = on_device(a[:, depth], device), on_device(b[depth], device)
        c = pmoe.zeros([m, n // w], "f32", device)
        c2 = pmoe.zeros([m // w, n], "f32", device)
        ag = pmoe.AllGatherGemm(comm, m, n, k, dtype="f32", chunks=2 * w, order=order,
                                min_overlap_bytes=0)
        rs = pmoe.GemmReduceScatter(comm, m, n, k, dtype="f32", chunks=2 * w, order=order,
                                    min_overlap_bytes=0)
        ag.run(a_ag, b_ag, c)
        rs.run(a_rs, b_rs, c2)
        comm.synchronize()
        outcome[r] = (to_host(c, (m, n // w), np.float32), to_host(c2, (m // w, n), np.float32))

    pmoe.run_ranks(world_size, rank_main, device="cuda:0")
    full = a.astype(np.float64) @ b.astype(np.float64)
    w = world_size
    for r in range(w):
        np.testing.assert_allclose(outcome[r][0], full[:, r * n // w:(r + 1) * n // w],
                                   rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(outcome[r][1], full[r * m // w:(r + 1) * m // w],
                                   rtol=1e-5, atol=1e-5)
