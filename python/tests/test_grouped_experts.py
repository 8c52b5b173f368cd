"""The experts on packed rows with torch._grouped_mm (pmoe.torch._grouped) against the padded
computation they replace: one process, no ranks, for the layout and the expert compute; EpMoE on
2 thread ranks (pmoe.run_ranks), the CPU; f32 and bf16, forward and backward, experts that get
no row. The CUDA case (bf16, under torch.cuda.set_sync_debug_mode("error")) runs only where
torch sees a GPU."""
import pytest

torch = pytest.importorskip("torch")

import pmoe  # noqa: E402
import pmoe.torch as pt  # noqa: E402
import pmoe.torch._moe as moe  # noqa: E402
from pmoe.torch import _grouped  # noqa: E402

COUNTS = [3, 0, 5, 0]  # experts 1 and 3 get no row
ROWS = 6


def tolerance(dtype):
    # f32: the padded reference runs batched GEMMs (bmm), the grouped path one GEMM per group,
    # in other blockings. bf16: the intermediate h is rounded to bf16 in both, so a one-ulp
    # difference there carries on, as in the other bf16 tests.
    return dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=3e-2, atol=3e-2)


def bounds(counts):
    """The CPU's exact bound, and the GPU's (the most rows that can arrive, top-2)."""
    return [sum(counts), ROWS * min(2, len(counts))]


@pytest.mark.parametrize("bound", bounds(COUNTS))
def test_layout_packs_each_experts_first_rows(bound):
    counts = torch.tensor(COUNTS, dtype=torch.int32)
    where = _grouped.layout(counts, ROWS, bound)
    padded = torch.arange(len(COUNTS) * ROWS * 2, dtype=torch.float32).view(len(COUNTS), ROWS, 2)
    want = torch.cat([padded[e, :n] for e, n in enumerate(COUNTS)])
    tail = bound - sum(COUNTS)
    packed = _grouped.pack(padded, where)
    torch.testing.assert_close(packed, torch.cat([want, torch.zeros(tail, 2)]), rtol=0, atol=0)
    assert where.offs.dtype == torch.int32 and where.offs.tolist() == [3, 3, 8, 8]
    assert where.expert.tolist() == [0] * 3 + [2] * 5 + [len(COUNTS)] * tail
    assert where.valid.tolist() == [True] * 8 + [False] * tail
    assert torch.equal(_grouped.layout_experts(counts, bound), where.expert)
    # Back to the padded layout: the arrived rows where they were, zeros elsewhere.
    arrived = torch.arange(ROWS).unsqueeze(0) < counts.unsqueeze(1)
    torch.testing.assert_close(_grouped.unpack(packed * 2, where, len(COUNTS)),
                               torch.where(arrived.unsqueeze(2), padded * 2, 0), rtol=0, atol=0)


def padded_inputs(dtype, counts, swiglu, hidden=16, ffn=32, seed=0):
    """(expert_x zero past the counts, the same with NaN there, w1, w2, w3, output weights)."""
    gen = torch.Generator().manual_seed(seed)
    local = len(counts)
    x = torch.randn(local, ROWS, hidden, generator=gen)
    arrived = (torch.arange(ROWS).unsqueeze(0) < torch.tensor(counts).unsqueeze(1)).unsqueeze(2)
    zeros = torch.where(arrived, x, 0).to(dtype)
    nans = torch.where(arrived, x, float("nan")).to(dtype)
    ws = [torch.randn(local, a, b, generator=gen) / a ** 0.5
          for a, b in ((hidden, ffn), (ffn, hidden), (hidden, ffn))]
    ws = [w.to(dtype) for w in ws[:3 if swiglu else 2]] + ([] if swiglu else [None])
    probe = torch.where(arrived, torch.randn(local, ROWS, hidden, generator=gen), 0)
    return zeros, nans, ws, probe


def run(expert_x, ws, probe, fn):
    """fn's output and the gradients of expert_x and the weights for the loss <out, probe>
    (probe zero past the counts: combine reads no other row)."""
    x = expert_x.clone().requires_grad_()
    params = [w.clone().requires_grad_() if w is not None else None for w in ws]
    out = fn(x, *params)
    (out.float() * probe).sum().backward()
    return [out, x.grad] + [p.grad for p in params if p is not None]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("swiglu", [False, True])
@pytest.mark.parametrize("counts", [COUNTS, [0, 0, 0, 0], [ROWS, 1, 0, 2]])
@pytest.mark.parametrize("on_device", [False, True])
@pytest.mark.parametrize("grouped", [True, False])
def test_packed_experts_equal_the_padded_computation(dtype, swiglu, counts, on_device, grouped):
    """Forward and backward of pack -> experts on packed rows -> unpack equal the experts run
    over the whole padded buffer, with NaN in the padding the packed path must never read (the
    padded one needs it zero). on_device: the GPU's layout (a zero tail, no host read);
    grouped False: the per-expert fallback."""
    zeros, nans, ws, probe = padded_inputs(dtype, counts, swiglu)
    if grouped:
        assert _grouped.grouped_mm_runs(dtype, torch.device("cpu"), 16, 32)
    want = run(zeros, ws, probe, _grouped.padded_experts)
    counts_t = torch.tensor(counts, dtype=torch.int32)
    bound = ROWS * min(2, len(counts)) if on_device else sum(counts)

    def packed_path(x, w1, w2, w3):
        where = _grouped.layout(counts_t, ROWS, bound)
        out = _grouped.packed_experts(_grouped.pack(x, where), where, w1, w2, w3,
                                      grouped=grouped)
        return _grouped.unpack(out, where, len(counts))

    got = run(nans, ws, probe, packed_path)
    for i, (g, w) in enumerate(zip(got, want)):
        assert torch.isfinite(g.float()).all(), i
        torch.testing.assert_close(g, w, **tolerance(dtype), msg=f"tensor {i}")


def test_grouped_mm_needs_16_byte_rows():
    cpu = torch.device("cpu")
    assert _grouped.grouped_mm_runs(torch.float32, cpu, 16, 32)
    assert not _grouped.grouped_mm_runs(torch.float32, cpu, 16, 30)  # 120-byte rows
    assert not _grouped.grouped_mm_runs(torch.bfloat16, cpu, 12, 32)  # 24-byte rows


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("swiglu", [False, True])
def test_epmoe_grouped_equals_padded(monkeypatch, dtype, swiglu):
    """EpMoE on 2 thread ranks: the grouped path (the CPU's exact packing, the GPU's way with a
    zero tail, and the per-expert fallback) against the padded reference. The router sends
    every token to experts 0 and 1 (rank 0's), so rank 1's experts get no row, and rank 1 has
    no token."""
    world, hidden, ffn, num_experts, top_k, max_tokens = 2, 16, 32, 4, 2, 5
    runs = {}

    def rank_main(comm, way):
        rank = comm.rank
        gen = torch.Generator().manual_seed(rank + 1)
        m = (max_tokens, 0)[rank]
        x = torch.randn(m, hidden, generator=gen)
        x[:, :num_experts] = torch.tensor([3.0, 2.0, 0.0, -1.0]) + 0.1 * x[:, :num_experts]
        x = x.to(dtype).requires_grad_()
        layer = pt.EpMoE(comm, hidden_dim=hidden, ffn_dim=ffn, num_experts=num_experts,
                         top_k=top_k, max_tokens=max_tokens, swiglu=swiglu, dtype=dtype)
        layer._padded_experts = way == "padded"
        weights = torch.Generator().manual_seed(3)  # thread ranks share torch's generator
        router = torch.eye(num_experts, hidden) + 0.01 * torch.randn(num_experts, hidden,
                                                                     generator=weights)
        layer.load_dense(router, *(torch.randn(shape, generator=weights) / 4 for shape in
                                   ((num_experts, hidden, ffn), (num_experts, ffn, hidden),
                                    (num_experts, hidden, ffn))[:3 if swiglu else 2]))
        y = layer(x)
        (y.float() * torch.arange(1.0, hidden + 1)).sum().backward()
        runs[(way, rank)] = [y, x.grad] + [p.grad for p in layer.parameters()]

    for way in ("padded", "grouped", "gpu way", "loop"):
        monkeypatch.setattr(moe, "_BATCHED_ON_CPU", way == "gpu way")
        monkeypatch.setattr(_grouped, "grouped_mm_runs",
                            (lambda *a: False) if way == "loop" else _real_grouped_mm_runs)
        pmoe.run_ranks(world, lambda comm: rank_main(comm, way))
    for way in ("grouped", "gpu way", "loop"):
        for rank in range(world):
            for i, (got, want) in enumerate(zip(runs[(way, rank)], runs[("padded", rank)])):
                assert (got is None) == (want is None), (way, rank, i)
                if got is not None:
                    assert torch.isfinite(got.float()).all(), (way, rank, i)
                    torch.testing.assert_close(got, want, **tolerance(dtype),
                                               msg=f"{way}, rank {rank}, tensor {i}")
    # Rank 1's experts got no row: zero gradient, whichever way.
    assert all(float(g.abs().max()) == 0 for g in runs[("grouped", 1)][3:])


_real_grouped_mm_runs = _grouped.grouped_mm_runs


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs torch with a GPU")
@pytest.mark.parametrize("swiglu", [False, True])
def test_grouped_experts_on_cuda_wait_for_nothing(swiglu):
    """On a GPU, bf16: the layout, the packing and torch._grouped_mm forward and backward, with
    torch.cuda.set_sync_debug_mode("error") (a host wait raises), equal the padded computation.
    Where torch's grouped GEMM would wait (not sm90/sm100), EpMoE runs the padded one instead:
    checked here too."""
    device = torch.device("cuda")
    zeros, nans, ws, probe = padded_inputs(torch.bfloat16, COUNTS, swiglu)
    zeros, nans, probe = zeros.to(device), nans.to(device), probe.to(device)
    ws = [w.to(device) if w is not None else None for w in ws]
    counts = torch.tensor(COUNTS, dtype=torch.int32, device=device)
    want = run(zeros, ws, probe, _grouped.padded_experts)
    if not _grouped.grouped_mm_runs(torch.bfloat16, device, 16, 32):
        pytest.skip("torch's grouped GEMM waits on the host on this GPU (not sm90/sm100): "
                    "EpMoE runs the padded computation there")

    def packed_path(x, w1, w2, w3):
        where = _grouped.layout(counts, ROWS, ROWS * 2)
        out = _grouped.packed_experts(_grouped.pack(x, where), where, w1, w2, w3)
        return _grouped.unpack(out, where, len(COUNTS))

    torch.cuda.set_sync_debug_mode("error")
    try:
        got = run(nans, ws, probe, packed_path)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    for i, (g, w) in enumerate(zip(got, want)):
        assert torch.isfinite(g.float()).all(), i
        torch.testing.assert_close(g, w, **tolerance(torch.bfloat16), msg=f"tensor {i}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("weighted", [False, True])
def test_dispatch_packed_the_gpu_way(monkeypatch, dtype, weighted):
    """dispatch_packed / combine_packed as on a GPU (what pmoe.transformers runs there), on the
    CPU: the rows packed by an index found on the device, into the most rows that can arrive
    with a zero tail, no count read on the host. y and the gradients of x and the weights equal
    the CPU's exact packing; experts that get no row (rank 1 has no token), a skipped slot."""
    from pmoe.torch import _packed
    world, hidden, num_experts, top_k, max_tokens = 2, 16, 6, 2, 5
    runs = {}

    def rank_main(comm, gpu_way):
        rank = comm.rank
        gen = torch.Generator().manual_seed(rank + 7)
        m = (max_tokens, 0)[rank]
        x = torch.randn(m, hidden, generator=gen).to(dtype).requires_grad_()
        indices = torch.rand(m, num_experts, generator=gen).topk(top_k, dim=-1).indices
        if m:
            indices[0, 1] = -1
        w = torch.rand(m, top_k, generator=gen).requires_grad_()
        a2a = pt.AllToAll(comm, max_tokens=max_tokens, num_experts=num_experts,
                          top_k=top_k, hidden_dim=hidden, dtype=dtype,
                          weighted_dispatch=weighted)
        local = a2a.num_local_experts
        scale = torch.tensor([1.5 + e for e in range(local)] + [float("nan")])
        for _ in range(2):  # the op's kept buffers, used twice
            if weighted:
                rows, counts, row_weights = pt.dispatch_packed(a2a, x, indices, w)
            else:
                rows, counts = pt.dispatch_packed(a2a, x, indices)
            ids = _grouped.layout_experts(counts, rows.shape[0])
            # The tail's expert id is E_local: its output row is zero, as transformers' experts
            # make it (the NaN scale there must not reach any result).
            out = torch.where((ids < local).unsqueeze(1), rows * scale[ids].unsqueeze(1), 0)
            if weighted:
                out = out * row_weights.unsqueeze(1)
                y = pt.combine_packed(a2a, out.to(dtype), counts, indices)
            else:
                y = pt.combine_packed(a2a, out.to(dtype), counts, indices, w)
            x.grad = w.grad = None
            (y.float() * torch.arange(1.0, hidden + 1)).sum().backward()
        assert rows.shape[0] == (comm.size * max_tokens * min(top_k, local) if gpu_way
                                 else int(counts.sum()))
        runs[(gpu_way, rank)] = [y, x.grad, w.grad]

    for gpu_way in (False, True):
        monkeypatch.setattr(_packed._Where, "on_device_on_cpu", gpu_way)
        pmoe.run_ranks(world, lambda comm: rank_main(comm, gpu_way))
    for rank in range(world):
        for i, (got, want) in enumerate(zip(runs[(True, rank)], runs[(False, rank)])):
            assert torch.isfinite(got.float()).all(), (rank, i)
            torch.testing.assert_close(got, want, rtol=0, atol=0, msg=f"rank {rank}, tensor {i}")
