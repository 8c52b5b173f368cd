"""pmoe.torch's devices without torch CUDA: one process, 1 or 2 thread ranks (pmoe.run_ranks) on
the CPU or on cuda:0 (pmoe's emulated CUDA device where no GPU is visible). What
pmoe.torch.communicator(device=...) accepts, and the errors that name both devices when a tensor
is not on the one its communicator serves. The two-process SocketCommunicator on cuda:0 is
torchrun_cuda.py's (python.torchrun_cuda.2); torch CUDA tensors need a GPU (the same script on
one, from scripts/device_checks.sh)."""
import pytest
import torch

import pmoe
import pmoe.torch as pt
from pmoe.torch._comm import resolve_device

no_torch_cuda = pytest.mark.skipif(torch.cuda.is_available(),
                                   reason="checks what happens where torch has no CUDA")


def test_device_names():
    assert resolve_device(None) == "cpu"
    assert resolve_device("cpu") == resolve_device(torch.device("cpu")) == "cpu"
    assert resolve_device("cuda:1") == resolve_device(torch.device("cuda", 1)) == "cuda:1"
    assert resolve_device(2) == "cuda:2"


@no_torch_cuda
def test_cuda_without_an_index_is_gpu_0_where_torch_has_no_cuda():
    assert resolve_device("cuda") == "cuda:0"


@pytest.mark.parametrize("device,needle", [("mps", "pmoe serves the CPU or a CUDA GPU"),
                                           ("cuda:x", "'cuda:N'"), (1.5, "float"),
                                           (True, "bool")])
def test_devices_pmoe_cannot_serve(device, needle):
    with pytest.raises(pmoe.Error, match=needle):
        resolve_device(device)


def run_on(device, fn, n=1):
    pmoe.run_ranks(n, fn, device=device)


def small(comm):
    return pt.AllToAll(comm, max_tokens=4, num_experts=2 * comm.size, top_k=1,
                       hidden_dim=8)


@no_torch_cuda
def test_cpu_tensors_on_a_cuda_communicator_say_what_to_use():
    seen = {}

    def rank_main(comm):
        a2a = small(comm)
        assert a2a.device == torch.device("cuda:0")
        x, idx = torch.zeros(4, 8), torch.zeros(4, 1, dtype=torch.int64)
        for what, run in (("x", lambda: pt.dispatch(a2a, x, idx)),
                          ("expert_y", lambda: pt.combine(a2a, torch.zeros(1, 4 * comm.size, 8),
                                                          idx, torch.ones(4, 1)))):
            with pytest.raises(pmoe.Error) as caught:
                run()
            seen[what] = str(caught.value)

    run_on("cuda:0", rank_main)
    for what, text in seen.items():
        assert text.startswith(f"{what}: tensor on cpu, but this communicator serves cuda:0")
        for needle in ("emulated device", "pmoe.zeros", "pmoe.copy", "device=None"):
            assert needle in text, (needle, text)


@no_torch_cuda
def test_ep_layer_on_a_cuda_communicator_without_torch_cuda_is_refused():
    def rank_main(comm):
        with pytest.raises(pmoe.Error, match="EpMoE: the communicator serves cuda:0"):
            pt.EpMoE(comm, hidden_dim=8, ffn_dim=8, num_experts=2, top_k=1, max_tokens=4)

    run_on("cuda:0", rank_main)


def test_tensors_elsewhere_on_a_cpu_communicator_name_both_devices():
    def rank_main(comm):
        a2a = small(comm)
        meta = torch.zeros(4, 8, device="meta")
        idx = torch.zeros(4, 1, dtype=torch.int64)
        with pytest.raises(pmoe.Error, match=r"^x: tensor on meta, but this communicator serves "
                                             r"the CPU; move it there \(\.cpu\(\)\)"):
            pt.dispatch(a2a, meta, idx)
        with pytest.raises(pmoe.Error, match="^indices: tensor on meta, but this communicator "
                                             "serves the CPU"):
            pt.dispatch(a2a, torch.zeros(4, 8), idx.to("meta"))
        rows = torch.zeros(1, 4, 8)
        with pytest.raises(pmoe.Error, match="^weights: tensor on meta"):
            pt.combine(a2a, rows, idx, torch.ones(4, 1, device="meta"))
        # Nothing was sent: the op still runs a whole pair afterwards.
        expert_x, counts = pt.dispatch(a2a, torch.ones(4, 8), idx)
        y = pt.combine(a2a, expert_x, idx, torch.ones(4, 1))
        torch.testing.assert_close(y, torch.ones(4, 8))
        assert a2a.settles() == 0

    run_on("cpu", rank_main)


def test_cpu_layer_keeps_its_parameters_on_the_cpu():
    """EpMoE on a CPU communicator: parameters on the CPU, and the same values as before the
    device argument existed (drawn from torch's CPU generator whatever the device)."""
    def rank_main(comm):
        torch.manual_seed(0)
        layer = pt.EpMoE(comm, hidden_dim=8, ffn_dim=8, num_experts=2, top_k=1, max_tokens=4)
        assert all(p.device.type == "cpu" for p in layer.parameters())
        torch.manual_seed(0)
        router = torch.nn.Linear(8, 2, bias=False)
        torch.testing.assert_close(layer.router.weight, router.weight)
        torch.testing.assert_close(layer.w1, torch.randn(2, 8, 8) / 8 ** 0.5)

    run_on("cpu", rank_main)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_gpu_way_gives_the_cpu_way_results(monkeypatch, dtype):
    """What pmoe.torch does on a GPU so that nothing waits on the host (combine's backward over
    every padded row, masked; EpMoE's experts batched over the padded rows), run on the CPU:
    outputs and gradients equal the CPU way's, with a skipped slot and m = 0 on one of 2 thread
    ranks. Combine's backward dispatches with zero_padding=False, so the padding it masks holds
    whatever the memory held."""
    import pmoe.torch._autograd as autograd
    import pmoe.torch._moe as moe
    world, hidden, num_experts, top_k, max_tokens = 2, 16, 4, 2, 6
    runs = {}

    def rank_main(comm, gpu_way):
        rank = comm.rank
        gen = torch.Generator().manual_seed(rank + 1)
        m = (max_tokens, 0)[rank]
        x = torch.randn(m, hidden, generator=gen).to(dtype).requires_grad_()
        indices = torch.rand(m, num_experts, generator=gen).topk(top_k, dim=-1).indices
        if m:
            indices[0, 1] = -1
        w = torch.rand(m, top_k, generator=gen).requires_grad_()
        a2a = pt.AllToAll(comm, max_tokens=max_tokens, num_experts=num_experts,
                          top_k=top_k, hidden_dim=hidden, dtype=dtype)
        expert_x, _ = pt.dispatch(a2a, x, indices)
        expert_y = (expert_x * 1.5).contiguous()
        y = pt.combine(a2a, expert_y, indices, w, zero_padding=False)
        (y.float() * torch.arange(1.0, hidden + 1)).sum().backward()
        layer = pt.EpMoE(comm, hidden_dim=hidden, ffn_dim=8, num_experts=num_experts,
                         top_k=top_k, max_tokens=max_tokens, swiglu=True, dtype=dtype)
        # The ranks are threads of one process, sharing torch's global generator: the weights
        # come from a generator of their own.
        weights = torch.Generator().manual_seed(3)
        layer.load_dense(*(torch.randn(shape, generator=weights) / 4 for shape in
                           ((num_experts, hidden), (num_experts, hidden, 8),
                            (num_experts, 8, hidden), (num_experts, hidden, 8))))
        xl = x.detach().clone().requires_grad_()
        out = layer(xl)
        out.float().square().sum().backward()
        runs[(gpu_way, rank)] = [y, x.grad, w.grad, out, xl.grad] + \
            [p.grad for p in layer.parameters()]

    for gpu_way in (False, True):
        monkeypatch.setattr(autograd._Arrived, "masked_on_cpu", gpu_way)
        monkeypatch.setattr(moe, "_BATCHED_ON_CPU", gpu_way)
        pmoe.run_ranks(world, lambda comm: rank_main(comm, gpu_way))
    # The batched expert GEMMs sum in another blocking than one GEMM per expert.
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=3e-2, atol=3e-2)
    for rank in range(world):
        for i, (got, want) in enumerate(zip(runs[(True, rank)], runs[(False, rank)])):
            assert (got is None) == (want is None), (rank, i)
            if got is not None:
                assert torch.isfinite(got.float()).all(), (rank, i)
                torch.testing.assert_close(got, want, **tol, msg=f"rank {rank}, tensor {i}")
