"""pmoe.AllToAll on PyTorch CUDA tensors, ranks sharing one GPU, against the NumPy reference.
GPU-only: torch CUDA tensors need CUDA torch and a real GPU, so it is skipped elsewhere (and on
pmoe's emulated device, whose memory torch cannot see). test_cuda_device.py is its twin with
pmoe's own arrays, which runs everywhere."""
import pytest

import pmoe
from reference import check_f32_round_trip, make_inputs

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(
    not (torch.cuda.is_available() and pmoe.cuda_available() and not pmoe.cuda_emulated()),
    reason="needs a GPU, CUDA torch and pmoe's CUDA backend for GPUs")


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_dispatch_combine_on_cuda_tensors(world_size):
    max_tokens, num_experts, hidden = 6, 2 * world_size, 64
    top_k = min(3, num_experts)
    inputs = [make_inputs(r, max_tokens - r % 2, num_experts, top_k, hidden, "f32", seed=3)
              for r in range(world_size)]
    outcome = {}

    def rank_main(comm):
        stream = torch.cuda.ExternalStream(comm.stream)
        a2a = pmoe.AllToAll(comm, max_tokens=max_tokens, num_experts=num_experts,
                            top_k=top_k, hidden_dim=hidden, in_dtype="f32",
                            out_dtype="f32")
        local, rows = a2a.num_local_experts, world_size * max_tokens
        x, indices, weights = (torch.from_numpy(a).cuda() for a in inputs[comm.rank])
        counts = torch.zeros(local, dtype=torch.int32, device="cuda")
        expert_x = torch.zeros(local, rows, hidden, device="cuda")
        y = torch.zeros(len(x), hidden, device="cuda")
        # This thread's stream only: torch.cuda.synchronize() waits for the whole device, so for
        # the peer ranks' dispatch kernels, which wait for this rank's: a deadlock.
        torch.cuda.current_stream().synchronize()
        a2a.dispatch(x, indices, counts, expert_x)
        stream.synchronize()
        scale = torch.tensor([1 + 0.125 * (comm.rank * local + e) for e in range(local)],
                             device="cuda").view(local, 1, 1)
        with torch.cuda.stream(stream):
            expert_y = expert_x * scale  # the stand-in experts of reference.py
        a2a.combine(expert_y, indices, weights, y)
        stream.synchronize()
        outcome[comm.rank] = (counts.cpu().numpy(), expert_x.cpu().numpy(), y.cpu().numpy())

    pmoe.run_ranks(world_size, rank_main, device="cuda:0")
    check_f32_round_trip(outcome, inputs, world_size, num_experts)
