"""The README's Python example, run by python/tests/test_examples.py so that it stays true."""
import numpy as np
import pmoe

def rank_main(comm):                                 # runs on 2 thread ranks, GIL released in ops
    a2a = pmoe.AllToAll(comm, max_num_tokens=4, num_experts=4, experts_per_token=2,
                        hidden_dim=8, in_dtype="f32", out_dtype="f32")
    x = np.random.rand(4, 8).astype(np.float32)
    indices = np.array([[0, 3], [1, 2], [2, -1], [3, 0]], np.int32)   # -1: slot skipped
    weights = np.full((4, 2), 0.5, np.float32)
    counts = np.zeros(a2a.num_local_experts, np.int32)
    expert_x = np.zeros((a2a.num_local_experts, comm.size * 4, 8), np.float32)
    a2a.dispatch(x, indices, counts, expert_x)        # rows per local expert, (source, token) order
    y = np.zeros_like(x)
    a2a.combine(expert_x, indices, weights, y)        # identity experts: y = weighted sum of x
    want = np.where((indices >= 0)[:, :, None], 0.5 * x[:, None, :], 0).sum(1)
    assert np.allclose(y, want), (y, want)

pmoe.run_ranks(2, rank_main)
print("ok")
