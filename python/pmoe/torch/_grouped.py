"""The experts on the rows that arrived, packed, with torch._grouped_mm; and where those rows lie
in dispatch's padded buffer, found on the device.

Dispatch lands the rows of local expert e in rows [0, counts[e]) of slot e of a padded buffer
[E_local, R, H] (R = W * max_tokens). Packed, they are one [bound, H] tensor:

    packed row i:   | e = 0: counts[0] rows | e = 1: counts[1] rows | ... | tail: zero rows |
                    0                       offs[0]                 offs[1] ...  offs[-1]   bound
    offs = cumsum(counts) (int32, on the counts' device): what torch._grouped_mm takes

On the CPU the counts are host memory, so bound = counts.sum() and there is no tail. On a GPU,
reading the counts would wait for the exchange, so bound is what can arrive at most,
R * min(top_k, E_local) rows (a token crosses to a rank once and lands in at most top_k of its
experts), and the rows past offs[-1] are a zero tail: the layout (index, expert of each row) is
computed from the counts on the device (cumsum, searchsorted), so nothing waits and a CUDA graph
can hold it. torch._grouped_mm computes no tail row (rows past offs[-1] are in no group): the
GEMMs cost the rows that arrived, where running every expert over the padded buffer costs
E_local * R rows (E / k times more: 32 with E = 256, top-8). The tail costs memory and the
elementwise passes, not GEMM work.

torch._grouped_mm leaves the rows past offs[-1] of its output (and of its input's gradient)
unwritten, memory as it was, NaN possibly: every consumer here clears them with torch.where,
which, unlike a product with zero, also clears a NaN.

Where torch has no grouped GEMM that runs without waiting on the host (grouped_mm_runs below),
the experts run one GEMM chain per expert on the packed rows (the CPU, where the counts are host
memory anyway), or, on a GPU, batched over the padded buffer as before (padded_experts), since a
loop over experts would need the counts on the host.
"""
import functools
from typing import NamedTuple

import torch
import torch.nn.functional as F


class Layout(NamedTuple):
    """Where packed row i comes from: flat row index[i] of the padded buffer [E_local * R, ...],
    for i < offs[-1]; tail rows (valid[i] False) point at one padding row no token uses."""
    index: torch.Tensor   # [bound] int64
    valid: torch.Tensor   # [bound] bool: i < offs[-1]
    expert: torch.Tensor  # [bound] int64 local expert of each row; E_local in the tail
    offs: torch.Tensor    # [E_local] int32 cumulative counts, on the counts' device
    rows: int             # R, rows per expert in the padded buffer


def _ends_and_experts(counts, bound):
    ends = torch.cumsum(counts, 0, dtype=torch.int64)
    i = torch.arange(bound, device=counts.device)
    return ends, i, torch.searchsorted(ends, i, right=True)  # the first expert ending past i


def layout_experts(counts, bound):
    """[bound] int64: the local expert of each packed row, E_local past counts.sum()."""
    return _ends_and_experts(counts, bound)[2]


def layout(counts, rows, bound):
    """The Layout of `bound` packed rows for counts [E_local] int32 of a padded buffer with
    `rows` rows per expert; device-side only (no host wait). bound >= counts.sum()."""
    local = counts.shape[0]
    ends, i, expert = _ends_and_experts(counts, bound)
    valid = expert < local
    owner = expert.clamp(max=local - 1)
    flat = owner * rows + (i - (ends - counts)[owner])
    # Tail rows read from, and write to, one row that no token uses: the last row of the expert
    # with the fewest rows. One exists whenever there is a tail (bound <= E_local * R).
    spare = torch.argmin(counts) * rows + (rows - 1)
    return Layout(torch.where(valid, flat, spare), valid, expert, ends.to(torch.int32), rows)


def keep(valid, t):
    """t with the rows past offs[-1] zero (NaN included), for a [bound, ...] tensor."""
    return torch.where(valid.view(-1, *([1] * (t.dim() - 1))), t, torch.zeros((), dtype=t.dtype,
                                                                               device=t.device))


def pack(padded, where):
    """padded [E_local, R, H] -> [bound, H]: each expert's arrived rows, then a zero tail.
    Differentiable (the gradient lands in the arrived rows; the padding gets zero)."""
    flat = padded.reshape(-1, padded.shape[-1])
    return keep(where.valid, flat.index_select(0, where.index))


def unpack(packed, where, local):
    """packed [bound, H] -> padded [E_local, R, H], zero past each expert's count.
    Differentiable (a tail row of packed gets zero gradient)."""
    hidden = packed.shape[-1]
    out = torch.zeros(local * where.rows, hidden, dtype=packed.dtype, device=packed.device)
    # Tail rows all write zeros to one padding row: the same value whichever lands last.
    return out.index_copy(0, where.index, keep(where.valid, packed)).view(local, where.rows,
                                                                            hidden)


def grouped_mm_runs(dtype, device, *widths):
    """Whether torch._grouped_mm runs for these operands with no host wait: on the CPU (torch
    >= 2.9: f32, bf16, f16), and on CUDA only for bf16 on sm90 / sm100, torch's CUTLASS kernel
    (its fallback elsewhere copies the offsets to the host and loops over groups). Either way
    each row's stride, i.e. every width (H, F), must be a multiple of 16 bytes."""
    if not hasattr(torch, "_grouped_mm"):
        return False
    if any(w * dtype.itemsize % 16 for w in widths):
        return False
    if device.type == "cpu":
        return _runs_on_cpu(dtype)
    if device.type == "cuda" and torch.version.hip is None:
        return dtype == torch.bfloat16 and torch.cuda.get_device_capability(device)[0] in (9, 10)
    return False


@functools.cache
def _runs_on_cpu(dtype):
    """Whether this torch has a CPU _grouped_mm for dtype (2.9 and later), forward and backward."""
    try:
        a = torch.ones(2, 8, dtype=dtype, requires_grad=True)
        b = torch.ones(2, 8, 8, dtype=dtype, requires_grad=True)
        out = torch._grouped_mm(a, b, offs=torch.tensor([1, 2], dtype=torch.int32))
        out.backward(torch.ones_like(out))  # (its backward refuses a broadcast gradient)
        return True
    except (RuntimeError, NotImplementedError):
        return False


def _activate(h, gate):
    return F.gelu(h) if gate is None else F.silu(gate) * h


def padded_experts(expert_x, w1, w2, w3=None):
    """The reference: every local expert batched over every row of the padded buffer
    [E_local, R, H] (zero rows give zero rows, which combine never reads). E_local * R rows of
    GEMM work whatever arrived; the way pmoe.torch ran them on a GPU before grouped GEMMs."""
    h = expert_x @ w1
    return _activate(h, expert_x @ w3 if w3 is not None else None) @ w2


def packed_experts(x, where, w1, w2, w3=None, grouped=None):
    """The local experts on packed rows x [bound, H] (Layout `where`): [bound, H], expert e's
    rows through expert e, the tail zero. grouped: use torch._grouped_mm (default: where
    grouped_mm_runs says it runs); otherwise one GEMM chain per expert on its rows, which
    reads the counts on the host (callers on a GPU use padded_experts instead)."""
    if grouped is None:
        grouped = grouped_mm_runs(x.dtype, x.device, w1.shape[1], w1.shape[2])
    if grouped and x.shape[0] > 0:  # torch's backward refuses a grouped GEMM of no rows
        def mm(a, w):
            return torch._grouped_mm(a, w, offs=where.offs)
        out = mm(_activate(mm(x, w1), mm(x, w3) if w3 is not None else None), w2)
        return keep(where.valid, out)
    # No grouped GEMM for this dtype, device or width: a GEMM chain per expert on its own rows
    # (still no padding computed on); the counts are read on the host.
    ends = [0] + where.offs.tolist()
    parts = []
    for e in range(w1.shape[0]):
        rows = x[ends[e]:ends[e + 1]]
        h = rows @ w1[e]
        parts.append(_activate(h, rows @ w3[e] if w3 is not None else None) @ w2[e])
    tail = x.shape[0] - ends[-1]
    parts.append(x.new_zeros(tail, w2.shape[2]))
    return torch.cat(parts)
