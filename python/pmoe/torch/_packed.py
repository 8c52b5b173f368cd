"""Dispatch and combine on packed rows: the rows that arrived, [n, H], not the padded
[E_local, W * max_tokens, H] buffer, which stays inside the AllToAll and is reused by every
call.

This is the form an expert-parallel layer wants (transformers' experts_forward takes packed rows
and their expert ids), and the one that moves the fewest bytes: a padded buffer made per call is
mostly untouched memory, and the first touch of each of its pages costs a page fault (on this
project's 2-core VM, making and filling a quarter of a fresh 64 MiB buffer took 5 to 8 times as
long as filling a kept one). With AllToAll(in_place_buffers=True) on the CPU, tokens are staged in
the op's input buffer and expert rows written to its output buffer, where the node's peers read
them: dispatch copies a token once, not once per destination, and combine copies no expert row
before it sums. Those ops also lay the rows out packed (pmoe's packed_expert_rows): dispatch
asks how many rows arrive (arriving_rows) between its send and its recv and lands them in a new
tensor of exactly that size, which is the rows returned, with no gather; combine's expert rows
are one contiguous copy into the op's buffer.

The gradients are those of dispatch and combine (_autograd.py), on packed rows:
    dispatch_packed:  grad_x = a combine of grad_rows, unit weights
    combine_packed:   grad_rows[i] = w[t, j] * grad_y[t] for row i serving slot j of token t;
                      grad_w[t, j] = <grad_y[t], rows[i]>, returned by a combine
where a row finds its slot j from the (weights, expert ids) dispatched with combine's backward.

With an AllToAll made with weighted_dispatch=True, the weights travel with the tokens instead
(DeepEP's dispatch carries topk_weights the same way): dispatch_packed(a2a, x, indices, weights)
also returns each row's weight w[t, j], which the experts apply, and combine_packed(a2a, rows,
counts, indices) only sums. The gradients then need no exchange of their own:
    combine_packed (sum):      grad_rows[i] = grad_y[t]               a dispatch of grad_y
    dispatch_packed (weights): grad_x[t] = sum_j grad_rows[row(t, j)], grad_w[t, j] =
                               grad_row_weights[row(t, j)]            one combine, unit weights,
                                                                       of [grad_rows | grad_w]
so a forward and backward exchange take 4 rounds instead of 6. The weights and expert ids cross
as the exact bits of f32 numbers. In a 16-bit dtype the weighted rows are rounded to it before
combine sums them, and the weights' gradient comes back in it (the weights-at-combine path
weights the rows in f32): pmoe.transformers uses weighted dispatch for f32 layers only.

Rows of local expert e are rows[offsets[e]:offsets[e + 1]] with offsets the cumulative counts,
ordered by (source rank, source token), as dispatch lays them out. On the CPU n = counts.sum().
On a GPU, reading that sum would wait for the exchange, so n is the most rows that can arrive,
W * max_tokens * min(top_k, E_local), and the rows past counts.sum() are a zero tail: the
packing index is computed on the device (_grouped.layout), and nothing waits on the host. The
caller's experts should give the tail zero rows (combine reads none of them; in pmoe.transformers
they carry expert id E_local, transformers' mark of a row for no local expert).
"""
import torch

from . import _grouped
from ._autograd import slot_gradients
from ._exchange import _error


class _Where:
    """Where the rows that arrived lie in an op's [E_local, rows, w] buffers: packed from flat
    row 0 (a packed op: the CPU's in-place one), each expert's span on the CPU (copied as
    spans), or, on a GPU, a layout found on the device (_grouped.layout): n is then the most
    rows that can arrive, rows * min(top_k, E_local), and the rows past the counts' sum are a
    zero tail, so that nothing waits for the counts on the host."""

    on_device_on_cpu = False  # tests set it to run the GPU's way on the CPU

    def __init__(self, counts, rows, packed, top_k):
        self.counts, self.packed, self.layout = counts, packed, None
        if packed or (counts.device.type == "cpu" and not _Where.on_device_on_cpu):
            self.spans = counts.tolist()
            self.n = sum(self.spans)
        else:
            self.spans = None
            self.n = rows * min(top_k, counts.shape[0])
            self.layout = _grouped.layout(counts, rows, self.n)

    def experts(self):
        """[n] int64: the local expert of each packed row (E_local in a GPU layout's tail)."""
        if self.layout is not None:
            return self.layout.expert
        return torch.repeat_interleave(torch.arange(len(self.spans), device=self.counts.device),
                                       self.counts.long(), output_size=self.n)

    def gather(self, padded):
        """padded [E_local, rows, w] -> its arrived rows, packed [n, w] (a new tensor)."""
        if self.spans is not None:
            return torch.cat([padded[e, :count] for e, count in enumerate(self.spans)])
        return _grouped.pack(padded, self.layout)

    def scatter(self, buffer, packed, column=0):
        """packed [n, c] into columns [column, column + c) of the arrived rows of an op's
        buffer [E_local, rows, w]; other rows and columns are left as they are (but for one
        padding row, which a GPU layout's tail rows write zeros to)."""
        columns = slice(column, column + packed.shape[1])
        if self.packed:
            buffer.view(-1, buffer.shape[-1])[:self.n, columns].copy_(packed)
        elif self.spans is not None:
            start = 0
            for e, count in enumerate(self.spans):
                buffer[e, :count, columns].copy_(packed[start:start + count])
                start += count
        else:
            buffer.view(-1, buffer.shape[-1])[:, columns].index_copy_(
                0, self.layout.index, _grouped.keep(self.layout.valid, packed))
        return buffer


def _land(op, x, indices, where=None):
    """op's dispatch of x: (rows [n, w] packed, a new tensor; counts; their _Where). A packed
    op lands them so, in a tensor of exactly their size; another lands them in its kept padded
    buffer, from which they are gathered (by `where`, if the rows of this routing were found
    before: on a GPU, finding them again would wait for the counts again)."""
    if op.packed:
        rows, counts = op.dispatch(x, indices, stage=True, exact=True)
        return rows, counts, _Where(counts, op.rows, True, indices.shape[1])
    landing, counts = op.dispatch(x, indices, out=op.landing(), stage=True)
    if where is None:
        where = _Where(counts, op.rows, False, indices.shape[1])
    return where.gather(landing), counts, where


class _DispatchPacked(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, indices, a2a):
        rows, counts, where = _land(a2a.forward_exchange, x.detach(), indices)
        ctx.a2a, ctx.indices, ctx.where = a2a, indices, where
        ctx.mark_non_differentiable(counts)
        return rows, counts

    @staticmethod
    def backward(ctx, grad_rows, _grad_counts):
        op = ctx.a2a.backward_exchange
        op.ready_for_combine(ctx.indices)
        padded = ctx.where.scatter(op.outgoing(), grad_rows.to(ctx.a2a.dtype))
        ones = torch.ones(ctx.indices.shape, dtype=torch.float32, device=ctx.a2a.device)
        return op.combine(padded, ctx.indices, ones), None, None


class _DispatchPackedWeighted(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weights, indices, a2a):
        op, H, k = a2a.forward_exchange, a2a.hidden_dim, a2a.top_k
        info = torch.cat([weights.detach().float(), indices.float()], dim=1)  # [m, 2k] f32
        carried = info if a2a.dtype == torch.float32 else info.view(a2a.dtype)
        arrived, counts, where = _land(op, [x.detach(), carried], indices)  # [n, H + carried]
        info = arrived[:, H:].contiguous()
        info = info if a2a.dtype == torch.float32 else info.view(torch.float32)
        expert_of_row = a2a.logical_experts(where.experts())
        is_slot = info[:, k:] == expert_of_row.unsqueeze(1).float()  # [n, k]: the row's slot
        row_weights = (info[:, :k] * is_slot).sum(-1)
        ctx.a2a, ctx.indices, ctx.where, ctx.is_slot = a2a, indices, where, is_slot
        ctx.weights_dtype = weights.dtype
        ctx.mark_non_differentiable(counts)
        return arrived[:, :H], counts, row_weights.to(weights.dtype)

    @staticmethod
    def backward(ctx, grad_rows, _grad_counts, grad_row_weights):
        a2a, H = ctx.a2a, ctx.a2a.hidden_dim
        op = a2a.backward_exchange
        op.ready_for_combine(ctx.indices)
        n = ctx.is_slot.shape[0]
        if grad_rows is None:
            grad_rows = torch.zeros(n, H, dtype=a2a.dtype, device=a2a.device)
        if grad_row_weights is None:
            grad_row_weights = torch.zeros(n, dtype=torch.float32, device=a2a.device)
        # Each row's weight gradient in the column of its slot: the combine's sum over a
        # token's rows then gives every slot its own.
        slot_grads = ctx.is_slot * grad_row_weights.float().unsqueeze(1)
        where = ctx.where  # the ops of one AllToAll lay rows out alike
        padded = where.scatter(op.outgoing(), grad_rows.to(a2a.dtype))
        where.scatter(padded, slot_grads.to(a2a.dtype), column=H)
        ones = torch.ones(ctx.indices.shape, dtype=torch.float32, device=a2a.device)
        both = op.combine(padded, ctx.indices, ones)
        return both[:, :H], both[:, H:].to(ctx.weights_dtype), None, None


class _CombinePackedSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, rows, counts, indices, a2a):
        op, H = a2a.forward_exchange, a2a.hidden_dim
        op.ready_for_combine(indices)
        where = _Where(counts, op.rows, op.packed, indices.shape[1])
        if where.n != rows.shape[0]:
            raise _error(f"combine_packed: {rows.shape[0]} rows, but counts say {where.n} arrived "
                         f"(pass dispatch_packed's rows and counts)")
        # The rows' H columns of the op's buffer; the carried columns after them are summed too
        # (what they hold does not matter) and dropped.
        outgoing = where.scatter(op.outgoing(), rows.detach())
        ones = torch.ones(indices.shape, dtype=torch.float32, device=a2a.device)
        y = op.combine(outgoing, indices, ones)[:, :H].contiguous()
        ctx.a2a, ctx.indices, ctx.where = a2a, indices, where
        return y

    @staticmethod
    def backward(ctx, grad_y):
        a2a = ctx.a2a
        rows, _, _ = _land(a2a.backward_exchange, [grad_y.to(a2a.dtype)], ctx.indices, ctx.where)
        return rows[:, :a2a.hidden_dim], None, None, None


class _CombinePacked(torch.autograd.Function):
    @staticmethod
    def forward(ctx, rows, weights, counts, indices, a2a):
        op = a2a.forward_exchange
        op.ready_for_combine(indices)
        where = _Where(counts, op.rows, op.packed, indices.shape[1])
        if where.n != rows.shape[0]:
            raise _error(f"combine_packed: {rows.shape[0]} rows, but counts say {where.n} arrived "
                         f"(pass dispatch_packed's rows and counts)")
        padded = where.scatter(op.outgoing(), rows.detach())
        y = op.combine(padded, indices, weights.detach().float().contiguous())
        ctx.a2a, ctx.indices, ctx.where = a2a, indices, where
        ctx.weights_dtype = weights.dtype
        ctx.save_for_backward(rows, weights)
        return y

    @staticmethod
    def backward(ctx, grad_y):
        a2a, indices, where = ctx.a2a, ctx.indices, ctx.where
        rows, weights = ctx.saved_tensors
        k = a2a.top_k
        back, slots = a2a.backward_exchange, a2a.slot_exchange
        grad_y = grad_y.to(a2a.dtype).contiguous()
        grads, _, _ = _land(back, grad_y, indices, where)
        # Which slot of its token each row serves, and that slot's weight.
        slot_info = torch.cat([weights.detach().float(), indices.float()], dim=1).contiguous()
        info, _, _ = _land(slots, slot_info, indices, where)
        expert_of_row = a2a.logical_experts(where.experts())
        grad_rows, back_rows = slot_gradients(grads.float(), info, rows.detach(), expert_of_row,
                                              k)
        grad_rows = grad_rows.to(rows.dtype)
        slots.ready_for_combine(indices)
        padded = where.scatter(slots.outgoing(), back_rows)
        ones = torch.ones(indices.shape, dtype=torch.float32, device=a2a.device)
        grad_w = slots.combine(padded, indices, ones)[:, :k]
        return grad_rows, grad_w.to(ctx.weights_dtype), None, None, None


def _check_weights(a2a, weights, m):
    if not isinstance(weights, torch.Tensor):
        raise _error(f"weights: expected a torch.Tensor, got {type(weights).__name__}")
    a2a.check_device("weights", weights)
    if (not weights.is_floating_point() or weights.dim() != 2 or weights.shape[1] != a2a.top_k
            or (m is not None and weights.shape[0] != m)):
        raise _error(f"weights: {weights.dtype} of shape {tuple(weights.shape)}, expected a "
                     f"floating-point [{'m' if m is None else m}, {a2a.top_k}]")


def dispatch_packed(a2a, x, indices, weights=None):
    """Sends each token of x to its experts and returns the rows that arrived, packed;
    differentiable in x (and weights).

    a2a      pmoe.torch.AllToAll (in_place_buffers=True on the CPU saves a copy per token)
    x        [m, H] a2a.dtype, contiguous, on a2a.device; m <= max_tokens
    indices  [m, k] int32 or int64 expert ids in [0, E), or -1 for a slot to skip; no expert
             twice in a row
    weights  [m, k] floating point: only, and always, with an AllToAll made with
             weighted_dispatch=True, whose dispatch carries them
    returns  (rows [n, H], counts [E_local] int32), and with weights also row_weights [n] of
             weights' dtype, the weight w[t, j] of the slot each row serves: local expert e's
             rows are the counts[e] rows after those of experts 0..e-1, ordered by (source
             rank, source token). n = counts.sum() on the CPU; on a GPU, the most rows that can
             arrive, the rows past counts.sum() zero (module docstring): no host wait.
    Each call must be followed by combine_packed with the same indices (as dispatch by combine).
    """
    a2a.check_tokens("x", x, a2a.hidden_dim, a2a.dtype)
    routing = a2a.routing(indices, x.shape[0])
    if a2a.weighted_dispatch:
        if weights is None:
            raise _error("dispatch_packed: this AllToAll was made with weighted_dispatch=True; "
                         "pass the router weights: dispatch_packed(a2a, x, indices, weights)")
        _check_weights(a2a, weights, x.shape[0])
        return _DispatchPackedWeighted.apply(x, weights, routing, a2a)
    if weights is not None:
        raise _error("dispatch_packed: weights given, but this AllToAll's dispatch does not "
                     "carry them (make it with weighted_dispatch=True, or pass the weights to "
                     "combine_packed)")
    return _DispatchPacked.apply(x, routing, a2a)


def combine_packed(a2a, rows, counts, indices, weights=None):
    """Brings packed expert rows back: y[t] = sum_j weights[t, j] * rows[row of (t, j)], in
    f32, skipping -1 slots. Differentiable in rows and weights.

    rows     [n, H] a2a.dtype, in dispatch_packed's order and number (its tail, on a GPU,
             is read by no one)
    counts   [E_local] int32, as dispatch_packed returned them
    indices  [m, k], the same as given to dispatch_packed
    weights  [m, k] floating point (used in f32); None with an AllToAll made with
             weighted_dispatch=True, whose rows carry their weights already: y[t] is then the
             plain sum of its rows
    returns  y [m, H] a2a.dtype
    """
    if not isinstance(rows, torch.Tensor):
        raise _error(f"combine_packed: rows must be a torch.Tensor, got {type(rows).__name__}")
    if a2a.weighted_dispatch and weights is not None:
        raise _error("combine_packed: this AllToAll's dispatch carried the weights "
                     "(weighted_dispatch=True), so combine only sums: apply the row_weights "
                     "dispatch_packed returned to the rows and pass no weights")
    if not a2a.weighted_dispatch and weights is None:
        raise _error("combine_packed: weights missing (only an AllToAll made with "
                     "weighted_dispatch=True sums without them)")
    a2a.check_device("rows", rows)
    if rows.dtype != a2a.dtype or rows.dim() != 2 or rows.shape[1] != a2a.hidden_dim:
        raise _error(f"rows: {rows.dtype} of shape {tuple(rows.shape)}, expected {a2a.dtype} "
                     f"[n, {a2a.hidden_dim}]")
    if counts.shape != (a2a.num_local_experts,) or counts.device != rows.device:
        raise _error(f"counts: shape {tuple(counts.shape)} on {counts.device}, expected "
                     f"[{a2a.num_local_experts}] on {rows.device} (dispatch_packed's counts)")
    if weights is None:
        m = indices.shape[0] if isinstance(indices, torch.Tensor) and indices.dim() == 2 else -1
        return _CombinePackedSum.apply(rows, counts, a2a.routing(indices, m), a2a)
    _check_weights(a2a, weights, None)
    m = weights.shape[0]
    return _CombinePacked.apply(rows, weights, counts, a2a.routing(indices, m), a2a)
