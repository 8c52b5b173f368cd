"""pmoe.AllToAll with MPI processes: run under mpiexec; exits non-zero if any rank's check fails."""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import pmoe  # noqa: E402
from reference import NUMPY_DTYPE, expected_combine, expected_dispatch, expert_fn, from_f32, \
    make_inputs, to_f32  # noqa: E402


def main():
    comm = pmoe.mpi_world()
    W, rank = comm.size, comm.rank
    max_tokens, num_experts, top_k, hidden = 5, 2 * W, 3, 16
    for in_dtype, out_dtype in [("f32", "f32"), ("bf16", "bf16")]:
        a2a = pmoe.AllToAll(comm, max_tokens=max_tokens, num_experts=num_experts,
                            top_k=top_k, hidden_dim=hidden, in_dtype=in_dtype,
                            out_dtype=out_dtype)
        local, rows = a2a.num_local_experts, W * max_tokens
        inputs = [make_inputs(r, max_tokens - r % 2, num_experts, top_k, hidden, in_dtype,
                              seed=7, drop=0.2) for r in range(W)]
        x, indices, weights = inputs[rank]
        counts = np.zeros(local, np.int32)
        expert_x = np.zeros((local, rows, hidden), NUMPY_DTYPE[in_dtype])
        expert_y = np.zeros((local, rows, hidden), NUMPY_DTYPE[in_dtype])
        y = np.zeros((len(x), hidden), NUMPY_DTYPE[out_dtype])
        a2a.dispatch(x, indices, counts, expert_x)
        want = expected_dispatch(inputs, rank, W, num_experts)
        for e in range(local):
            assert counts[e] == len(want[e]), f"rank {rank}: expert {e} count"
            if want[e]:
                np.testing.assert_array_equal(expert_x[e, :counts[e]], np.stack(want[e]))
                expert_y[e, :counts[e]] = from_f32(
                    expert_fn(to_f32(expert_x[e, :counts[e]], in_dtype), rank * local + e),
                    in_dtype)
        a2a.combine(expert_y, indices, weights, y)
        np.testing.assert_array_equal(
            y, expected_combine(x, indices, weights, in_dtype, in_dtype, out_dtype))
        comm.barrier()
    if rank == 0:
        print(f"python mpi all-to-all: {W} processes passed")


if __name__ == "__main__":
    main()
