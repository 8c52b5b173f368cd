"""pmoe.AllGatherGemm and pmoe.GemmReduceScatter against NumPy: all-gather then GEMM, and GEMM then
reduce-scatter, in float64."""
import numpy as np
import pytest

import pmoe


def relative_error(got, want):
    return np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30)


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("order", ["all_pairs", "ring"])
def test_all_gather_gemm_matches_numpy(world_size, order):
    m, n, k = 6 * world_size, 5 * world_size, 7  # not powers of two
    rng = np.random.default_rng(1)
    a = rng.uniform(-1, 1, (m, k)).astype(np.float32)
    b = rng.uniform(-1, 1, (k, n)).astype(np.float32)
    want = a.astype(np.float64) @ b.astype(np.float64)
    rows, cols = m // world_size, n // world_size
    results = {}

    def rank_main(comm):
        r = comm.rank
        op = pmoe.AllGatherGemm(comm, m, n, k, dtype="f32", chunks=2 * world_size, order=order,
                                min_overlap_bytes=0)
        c = np.zeros((m, cols), np.float32)
        op.run(np.ascontiguousarray(a[r * rows:(r + 1) * rows]),
               np.ascontiguousarray(b[:, r * cols:(r + 1) * cols]), c)
        results[r] = c

    pmoe.run_ranks(world_size, rank_main)
    for r in range(world_size):
        assert relative_error(results[r], want[:, r * cols:(r + 1) * cols]) <= 1e-5


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_gemm_reduce_scatter_matches_numpy(world_size):
    m, n, k = 4 * world_size, 9, 3 * world_size
    rng = np.random.default_rng(2)
    a = rng.uniform(-1, 1, (m, k)).astype(np.float32)
    b = rng.uniform(-1, 1, (k, n)).astype(np.float32)
    want = a.astype(np.float64) @ b.astype(np.float64)
    rows, depth = m // world_size, k // world_size
    results = {}

    def rank_main(comm):
        r = comm.rank
        op = pmoe.GemmReduceScatter(comm, m, n, k, dtype="f32", min_overlap_bytes=0)
        c = np.zeros((rows, n), np.float32)
        serial = np.zeros((rows, n), np.float32)
        a_r = np.ascontiguousarray(a[:, r * depth:(r + 1) * depth])
        b_r = np.ascontiguousarray(b[r * depth:(r + 1) * depth])
        op.run(a_r, b_r, c)
        op.run_serial(a_r, b_r, serial)
        results[r] = (c, serial)

    pmoe.run_ranks(world_size, rank_main)
    for r in range(world_size):
        c, serial = results[r]
        assert relative_error(c, want[r * rows:(r + 1) * rows]) <= 1e-5
        assert relative_error(serial, want[r * rows:(r + 1) * rows]) <= 1e-5


def test_bad_shapes_raise_with_messages():
    def rank_main(comm):
        with pytest.raises(pmoe.Error, match="M"):
            pmoe.AllGatherGemm(comm, 7, 4, 4, dtype="f32")  # M not divisible by 2 ranks
        op = pmoe.AllGatherGemm(comm, 8, 4, 4, dtype="f32")
        with pytest.raises(pmoe.Error, match="`A`|A "):
            op.run(np.zeros((4, 5), np.float32), np.zeros((4, 2), np.float32),
                   np.zeros((8, 2), np.float32))
        with pytest.raises(pmoe.Error, match="order must be"):
            pmoe.GemmReduceScatter(comm, 8, 4, 4, dtype="f32", order="star")
    pmoe.run_ranks(2, rank_main)
