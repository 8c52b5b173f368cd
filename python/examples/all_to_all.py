"""The README's Python example, run by python/tests/test_examples.py so that it stays true."""
import torch
import pmoe

def rank_main(comm):                                   # 2 thread ranks; ops release the GIL
    E, k, H, m = 4, 2, 8, 5
    a2a = pmoe.AllToAll(comm, max_tokens=m, num_experts=E, top_k=k,
                        hidden_dim=H, in_dtype="f32", out_dtype="f32")
    x = torch.randn(m, H)
    weights, indices = torch.topk(torch.randn(m, E).softmax(-1), k)   # int64 indices are fine
    weights = weights / weights.sum(-1, keepdim=True)
    counts = torch.zeros(a2a.num_local_experts, dtype=torch.int32)
    expert_x = torch.zeros(a2a.num_local_experts, comm.size * m, H)
    a2a.dispatch(x, indices, counts, expert_x)   # expert e's tokens: rows [0, counts[e]) of expert_x[e]
    expert_y = 2 * expert_x                      # the experts (here: times two)
    y = torch.zeros(m, H)
    a2a.combine(expert_y, indices, weights, y)   # y[t] = sum_j weights[t, j] * expert_y[row of (t, j)]
    torch.testing.assert_close(y, 2 * x)

pmoe.run_ranks(2, rank_main)                            # or comm = pmoe.mpi_world() under mpirun
print("ok")
