"""Dispatch and combine as autograd functions, on pmoe's own AllToAll ops.

Forward: dispatch sends each token to the rows of its top-k experts; combine sums the expert
rows back with the router weights. Backward, with t a token, j one of its k slots and row(t, j)
the expert row it went to:

    dispatch:  grad_x[t]        = sum_j grad_expert_x[row(t, j)]        a combine, unit weights
    combine:   grad_expert_y[r] = w[t, j] * grad_y[t]   for r = row(t, j)  a dispatch of grad_y,
                                                                            scaled where it lands
               grad_w[t, j]     = <grad_y[t], expert_y[row(t, j)]>     computed where the row is,
                                                                            sent back by a combine

Masked slots (index -1) are skipped by pmoe's ops, so they get zero gradient. A row does not
know which slot j of its token it serves, so combine's backward first dispatches each token's
(weights, expert ids) in f32 (2k numbers per token) and the row finds its slot by its expert id.

On CUDA tensors (a communicator made with device="cuda:N") every pmoe op is ordered on torch's
current stream by events, with no host synchronisation: pmoe's stream (comm.stream) waits for
torch's current stream before the op, and torch's current stream waits for pmoe's after it. So
a tensor freed and reused on torch's stream is never overwritten before pmoe has read it, and
everything pmoe enqueues is captured with the rest when torch captures a CUDA graph. Backward
on CUDA works over every row of the padded buffer, masked, instead of gathering the rows that
arrived (which would need their count on the host).

Each pmoe AllToAll op must alternate dispatch -> combine. One op carries the forward pair,
another the backward pair (combine's backward dispatches, dispatch's backward combines), a third
the (weights, ids) exchange and grad_w's return, both inside combine's backward. An AllToAll made
with weighted_dispatch=True has no third op: its dispatch carries the (weights, ids) with the
tokens and dispatch_packed's backward returns grad_w with grad_x (_packed.py). When autograd
runs only one half of a pair (x needs no gradient, so dispatch's backward never runs), the op is
settled by an empty counterpart call at its next use; every rank takes the same path, so these
calls stay collective.
"""
import contextlib
import warnings

import torch

from ._exchange import (_PMOE_DTYPE, Exchange, _StreamOrder, _error, _renamed, _served_device,
                        _torch_sees_pmoe_device)

class AllToAll:
    """The exchange of one MoE layer for pmoe.torch.dispatch and pmoe.torch.combine.

    Collective over `comm` (pmoe.torch.communicator()). W = comm.size ranks, E = num_experts
    (divisible by W); rank r owns experts [r * E / W, (r + 1) * E / W). Tokens per call and rank
    at most max_tokens. dtype: torch.float32, torch.bfloat16 or torch.float16 (pmoe's ops
    have no float64 path). Tensors must be on the device the communicator serves (self.device:
    the CPU, or its GPU). Builds three pmoe.AllToAll ops (forward, backward, and the small f32
    exchange of combine's backward; two with weighted_dispatch); workspace_bytes() says what
    they hold. Ranks that differ in the config get pmoe.Error on every rank from the ops' own
    agreement, naming the field (hidden_dim is the forward exchange's row width: H, plus the
    carried weights with weighted_dispatch).
    in_place_buffers: on the CPU, give each op pmoe's in-place input and expert output buffers
    (one padded [E_local, W * max_tokens, H] buffer more per op, in shared memory), which
    dispatch_packed and combine_packed use to skip a copy of every token and every expert row;
    its ops also land the rows packed, in a tensor of exactly their number, so dispatch_packed
    gathers nothing. For those two functions only: dispatch and combine refuse it.
    weighted_dispatch: dispatch carries the router weights with the tokens, as DeepEP's does
    (dispatch_packed(a2a, x, indices, weights) returns each row's weight, for the experts to
    apply; combine_packed then only sums): two ops instead of three, and a forward and backward
    exchange two rounds fewer. The padded dispatch/combine refuse such an AllToAll.
    on_peer_loss: "fail" (the default) or "mask" (every rank on one node): a rank whose
    process ends, or that does not answer for peer_timeout_s seconds (0: PMOE_TIMEOUT_S), is
    masked by the survivors, and the call in which they find it raises pmoe.PeerLost (run its
    tokens again); later calls go on without its experts (their slots add nothing).
    live_ranks and mask_reasons say who is masked and why (docs/robustness.md).
    placement: for each of the num_experts slots (rank r holds slots [r * E / W, (r + 1) * E /
    W)), the logical expert it serves; several slots may serve one (replicas, as EPLB deploys
    them). indices then name logical experts in [0, num_logical_experts) (default: the largest in
    placement, plus one), and each token's row goes to one of its expert's slots by a fixed rule,
    a live one where a rank is masked (no token is lost while every expert has a live replica).
    logical_experts(local) says which logical expert each local slot serves.
    The exchanges behind it are public: forward_exchange (dispatch's tokens, combine's rows),
    backward_exchange (their gradients) and slot_exchange (the slots combine's weight gradient
    needs; None with weighted_dispatch), each an Exchange over one pmoe.AllToAll.
    """

    def __init__(self, comm, *, max_tokens=None, num_experts, top_k=None, hidden_dim,
                 dtype=torch.float32, in_place_buffers=False, weighted_dispatch=False,
                 on_peer_loss="fail", peer_timeout_s=0.0, placement=None,
                 num_logical_experts=0, max_num_tokens=None, experts_per_token=None):
        max_tokens = _renamed("pmoe.torch.AllToAll", "max_tokens", max_tokens, "max_num_tokens",
                              max_num_tokens)
        top_k = _renamed("pmoe.torch.AllToAll", "top_k", top_k, "experts_per_token",
                         experts_per_token)
        if dtype not in _PMOE_DTYPE:
            raise _error(f"pmoe.torch.AllToAll: dtype must be torch.float32, torch.bfloat16 or "
                         f"torch.float16, got {dtype} (pmoe's ops have no float64 path)")
        config = dict(max_tokens=max_tokens, num_experts=num_experts, top_k=top_k,
                      on_peer_loss=on_peer_loss,
                      peer_timeout_s=float(peer_timeout_s))
        slot_expert = list(range(num_experts))
        if placement is not None:
            slot_expert = [int(e) for e in placement]
            if not slot_expert or min(slot_expert) < 0:
                raise _error(f"pmoe.torch.AllToAll: placement must name a logical expert >= 0 "
                             f"for each slot, got {slot_expert}")
            num_logical_experts = num_logical_experts or 1 + max(slot_expert)
            config.update(placement=slot_expert, num_logical_experts=num_logical_experts)
        self.num_logical_experts = num_logical_experts or num_experts
        self.comm = comm
        self.dtype = dtype
        self.max_tokens = max_tokens
        self.num_experts = num_experts
        self.top_k = top_k
        self.hidden_dim = hidden_dim
        self.device = _served_device(comm)
        order = contextlib.nullcontext  # the CPU: pmoe's ops run in this thread, in order
        if self.device.type == "cuda" and _torch_sees_pmoe_device():
            order = _StreamOrder(comm, self.device)
        ops = dict(device=self.device, order=order, in_place=in_place_buffers)
        self.weighted_dispatch = bool(weighted_dispatch)
        forward_width = backward_width = hidden_dim
        self.slot_exchange = None
        if self.weighted_dispatch:
            # Dispatch carries each token's k weights and k expert ids after its H elements, as
            # the bits of 2k f32 (two elements each in a 16-bit dtype); the backward combine
            # brings each row's weight gradient back in the column of its slot.
            self.carried = 2 * top_k * (4 // dtype.itemsize)
            forward_width = hidden_dim + self.carried
            backward_width = hidden_dim + top_k
        else:
            self.slot_exchange = Exchange(comm, dict(config, hidden_dim=2 * top_k), "f32", **ops)
        self.forward_exchange = Exchange(comm, dict(config, hidden_dim=forward_width),
                                         _PMOE_DTYPE[dtype], **ops)
        self.backward_exchange = Exchange(comm, dict(config, hidden_dim=backward_width),
                                          _PMOE_DTYPE[dtype], **ops)
        self.num_local_experts = self.forward_exchange.local
        self.world_size = comm.size
        self.first_expert = comm.rank * self.num_local_experts  # this rank's first slot
        # Each local slot's expert, and -2 one past them (a GPU layout's tail rows serve no
        # expert; -1 is a skipped slot's id). Made on the device now, so that no copy happens
        # inside a captured graph; on the CPU where torch cannot make tensors there (pmoe's
        # emulated device), and then copied by the first call that asks.
        mine = slot_expert[self.first_expert:self.first_expert + self.num_local_experts] + [-2]
        where = self.device if _torch_sees_pmoe_device() else torch.device("cpu")
        self._local_expert = torch.tensor(mine, dtype=torch.int64, device=where)

    @property
    def max_num_tokens(self):
        """Deprecated: max_tokens' name before pmoe.MoeShape."""
        warnings.warn("pmoe.torch.AllToAll.max_num_tokens is deprecated; read max_tokens "
                      "instead", DeprecationWarning, stacklevel=2)
        return self.max_tokens

    def logical_experts(self, local):
        """The logical expert each of this rank's slots `local` (int64, in [0, E_local]) serves:
        the slot's own global index without a placement, -2 for E_local (no slot)."""
        if self._local_expert.device != local.device:
            self._local_expert = self._local_expert.to(local.device)
        return self._local_expert[local]

    def _ops(self):
        exchanges = (self.forward_exchange, self.backward_exchange, self.slot_exchange)
        return [op for op in exchanges if op is not None]

    @property
    def live_ranks(self):
        """For each rank, True unless the forward exchange masked it (on_peer_loss="mask")."""
        return self.forward_exchange.op.live_ranks

    @property
    def mask_reasons(self):
        """For each rank, why the forward exchange masked it ("" for a live rank)."""
        return self.forward_exchange.op.mask_reasons

    def settles(self):
        """Empty calls made so far to complete dispatch/combine pairs autograd ran half of."""
        return sum(op.settles for op in self._ops())

    def workspace_bytes(self):
        return sum(op.op.workspace_bytes() for op in self._ops())

    def check_errors(self):
        """On CUDA, after synchronizing the stream: raises what the exchanges' kernels recorded,
        pmoe.PeerLost included (a call's kernels run after it returned, so a loss they meet is
        known here or at the next call). A no-op on the CPU, whose calls raise everything."""
        for op in self._ops():
            op.check_errors()

    def check_padded(self, name):
        """Raises pmoe.Error if this AllToAll carries weights with dispatch (the padded
        functions exchange H-wide rows and the router weights at combine) or has in-place
        buffers (its ops lay rows out packed)."""
        if self.weighted_dispatch:
            raise _error(f"{name}: this AllToAll was made with weighted_dispatch=True, whose "
                         f"dispatch carries the router weights; use dispatch_packed(a2a, x, "
                         f"indices, weights) and combine_packed(a2a, rows, counts, indices)")
        if self.forward_exchange.packed:
            raise _error(f"{name}: this AllToAll was made with in_place_buffers=True, whose ops "
                         f"lay the rows out packed for dispatch_packed and combine_packed; use "
                         f"those, or an AllToAll without in_place_buffers")

    def check_device(self, name, x):
        """Raises pmoe.Error, naming both devices and what to do, unless tensor x is on the
        device this AllToAll's communicator serves."""
        if x.device == self.device:
            if x.device.type == "cuda" and not _torch_sees_pmoe_device():
                raise _error(f"{name}: tensor on {x.device}, a GPU torch runs on, but this pmoe "
                             f"runs its CUDA ops on its emulated device (pmoe.cuda_emulated()), "
                             f"whose memory is not the GPU's; build pmoe with its CUDA backend "
                             f"(nvcc) to use torch's CUDA tensors")
            return
        served = "the CPU" if self.device.type == "cpu" else str(self.device)
        if self.device.type == "cpu":
            hint = (f"move it there (.cpu()), or make the communicator with "
                    f"pmoe.torch.communicator(device='{x.device}')" if x.device.type == "cuda"
                    else "move it there (.cpu())")
        elif x.device.type == "cpu" and not torch.cuda.is_available():
            hint = (f"torch has no CUDA here, so {self.device} is pmoe's emulated device, which "
                    f"torch tensors cannot reach: use pmoe's own arrays there (pmoe.zeros, "
                    f"pmoe.copy) with pmoe.AllToAll, a GPU with CUDA torch, or a communicator "
                    f"on the CPU (pmoe.torch.communicator(device=None))")
        else:
            hint = f"move it there (.to('{self.device}'))"
        raise _error(f"{name}: tensor on {x.device}, but this communicator serves {served}; "
                     f"{hint}")

    def check_tokens(self, name, x, width, dtype):
        """Raises pmoe.Error unless x is a contiguous [m, width] tensor of dtype on the
        communicator's device."""
        if not isinstance(x, torch.Tensor):
            raise _error(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
        self.check_device(name, x)
        if x.dtype != dtype:
            raise _error(f"{name}: dtype {x.dtype}, expected {dtype} (the AllToAll's dtype)")
        if x.dim() != 2 or x.shape[1] != width:
            raise _error(f"{name}: shape {tuple(x.shape)}, expected [m, {width}]")
        if x.shape[0] > self.max_tokens:
            raise _error(f"{name}: {x.shape[0]} tokens, more than max_tokens = "
                         f"{self.max_tokens}")
        if not x.is_contiguous():
            raise _error(f"{name}: tensor is not contiguous (call .contiguous())")

    def routing(self, indices, m):
        """indices as pmoe's ops take them: contiguous int32 or int64 [m, k] on the
        communicator's device."""
        if not isinstance(indices, torch.Tensor):
            raise _error(f"indices: expected a torch.Tensor, got {type(indices).__name__}")
        if indices.requires_grad:
            raise _error("indices: the tensor requires grad; routing is not differentiable "
                         "(pass indices.detach() of an integer tensor)")
        self.check_device("indices", indices)
        if indices.dtype not in (torch.int32, torch.int64):
            raise _error(f"indices: dtype {indices.dtype}, expected torch.int32 or torch.int64")
        if indices.dim() != 2 or indices.shape[0] != m or indices.shape[1] != self.top_k:
            raise _error(f"indices: shape {tuple(indices.shape)}, expected [{m}, {self.top_k}]")
        # As given (torch.topk's int64 included): pmoe's ops take int32 and int64 alike.
        return indices.contiguous()


class _Dispatch(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, indices, a2a, zero_padding):
        expert_x, counts = a2a.forward_exchange.dispatch(x.detach(), indices, zero_padding)
        ctx.a2a, ctx.indices, ctx.m = a2a, indices, x.shape[0]
        ctx.mark_non_differentiable(counts)
        return expert_x, counts

    @staticmethod
    def backward(ctx, grad_expert_x, _grad_counts):
        a2a = ctx.a2a
        grad = grad_expert_x.to(a2a.dtype).contiguous()
        ones = torch.ones(ctx.indices.shape, dtype=torch.float32, device=a2a.device)
        grad_x = a2a.backward_exchange.combine(grad, ctx.indices, ones)
        return grad_x, None, None, None


class _Combine(torch.autograd.Function):
    @staticmethod
    def forward(ctx, expert_y, weights, indices, a2a, zero_padding):
        y = a2a.forward_exchange.combine(expert_y.detach(), indices,
                                         weights.detach().float().contiguous())
        ctx.a2a, ctx.indices, ctx.zero_padding = a2a, indices, zero_padding
        ctx.weights_dtype = weights.dtype
        ctx.save_for_backward(expert_y, weights)
        return y

    @staticmethod
    def backward(ctx, grad_y):
        a2a, indices = ctx.a2a, ctx.indices
        expert_y, weights = ctx.saved_tensors
        k, local, hidden = a2a.top_k, a2a.num_local_experts, a2a.hidden_dim
        grad_rows, counts = a2a.backward_exchange.dispatch(grad_y.to(a2a.dtype).contiguous(),
                                                           indices, zero_padding=False)
        # Which slot of its token each row serves, and that slot's weight.
        slot_info = torch.cat([weights.detach().float(), indices.float()], dim=1).contiguous()
        info_rows, _ = a2a.slot_exchange.dispatch(slot_info, indices, zero_padding=False)
        rows = info_rows.shape[1]
        arrived = _Arrived(counts, rows)
        grads, back = slot_gradients(
            arrived.pick(grad_rows.view(-1, hidden)).float(),
            arrived.pick(info_rows.view(-1, 2 * k)),
            arrived.pick(expert_y.detach().reshape(-1, hidden)),
            a2a.logical_experts(arrived.index // rows), k)
        grad_expert_y = arrived.place(grads, expert_y.dtype, ctx.zero_padding)
        # Combine reads only the rows that arrived, so the padding of `back` may be left as is.
        back = arrived.place(back, torch.float32, False)
        ones = torch.ones(indices.shape, dtype=torch.float32, device=a2a.device)
        grad_w = a2a.slot_exchange.combine(back.view(local, rows, 2 * k), indices, ones)[:, :k]
        return (grad_expert_y.view(local, rows, hidden), grad_w.to(ctx.weights_dtype), None, None,
                None)


def slot_gradients(grads, info, expert_rows, expert_of_row, k):
    """Combine's backward where the rows are, for each row that arrived (gathered or masked):

    grads          [n, H] f32: grad_y of the row's token (a dispatch of grad_y brought it)
    info           [n, 2k]: the token's k weights, then its k expert ids, as floats
    expert_rows    [n, H]: what the row sent in the forward combine
    expert_of_row  [n]: the row's global expert id (its slot j is where the ids equal it)
    returns        (w[t, j] * grads [n, H] f32: the rows' gradient,
                    [n, 2k] f32: <grad_y[t], row> in column j, zeros elsewhere, for a combine
                    with unit weights to sum back into grad_w[t, j])"""
    is_slot = info[:, k:] == expert_of_row.unsqueeze(1).float()  # [n, k]
    row_weight = (info[:, :k] * is_slot).sum(-1, keepdim=True)
    dots = (grads * expert_rows.float()).sum(-1, keepdim=True)
    back = torch.cat([is_slot * dots, torch.zeros_like(info[:, k:])], dim=1)
    return grads * row_weight, back


def _arrived_mask(counts, rows):
    """[E_local, rows] bool: True in rows [0, counts[e]) of each local expert e."""
    return torch.arange(rows, device=counts.device).unsqueeze(0) < counts.unsqueeze(1)


class _Arrived:
    """The rows of dispatch's padded buffer [E_local * rows, ...] that combine's backward
    computes on. On the CPU, the rows that arrived, gathered (the padding is never computed on).
    On a GPU, every row, the padding masked to zero: the count of arrived rows stays on the
    device, so nothing waits for it and a CUDA graph can hold it."""

    masked_on_cpu = False  # tests set it to run the GPU's way on the CPU

    def __init__(self, counts, rows):
        mask = _arrived_mask(counts, rows).view(-1)
        self.size = mask.shape[0]
        self.device = counts.device
        if counts.device.type == "cpu" and not _Arrived.masked_on_cpu:
            self.index = mask.nonzero().squeeze(1)
            self.keep = None
        else:
            self.index = torch.arange(self.size, device=counts.device)
            self.keep = mask.unsqueeze(1)

    def pick(self, flat):
        """flat [E_local * rows, w] -> the rows computed on (padding may hold anything: NaN
        included, which where(), unlike a product with zero, clears)."""
        if self.keep is None:
            return flat.index_select(0, self.index)
        return torch.where(self.keep, flat, torch.zeros((), dtype=flat.dtype, device=self.device))

    def place(self, values, dtype, zero_padding):
        """values for the picked rows -> [E_local * rows, w] of dtype; the padding zero where
        zero_padding (always, on a GPU, where values are zero there already)."""
        if self.keep is not None:
            return values.to(dtype)
        make = torch.zeros if zero_padding else torch.empty
        out = make(self.size, values.shape[1], dtype=dtype, device=self.device)
        out.index_copy_(0, self.index, values.to(dtype))
        return out


def dispatch(a2a, x, indices, *, zero_padding=True):
    """Sends each token of x to its experts; differentiable in x.

    a2a      pmoe.torch.AllToAll
    x        [m, H] a2a.dtype, contiguous, on a2a.device; m <= max_tokens (may differ
             between ranks)
    indices  [m, k] int32 or int64: expert ids in [0, E), or -1 for a slot to skip; no expert
             twice in a row
    returns  (expert_x [E_local, W * max_tokens, H], expert_num_tokens [E_local] int32):
             rows of local expert e are expert_x[e, :expert_num_tokens[e]], ordered by (source
             rank, source token); the rest are zero, or, with zero_padding=False, left as the
             memory was (for callers that read only the rows that arrived, as combine does;
             it saves a pass over the whole padded buffer). Raises pmoe.Error on bad input.
    """
    a2a.check_padded("dispatch")
    a2a.check_tokens("x", x, a2a.hidden_dim, a2a.dtype)
    return _Dispatch.apply(x, a2a.routing(indices, x.shape[0]), a2a, zero_padding)


def combine(a2a, expert_y, indices, weights, *, zero_padding=True):
    """Brings expert rows back: y[t] = sum_j weights[t, j] * expert_y[row of (t, j)], skipping
    -1 slots, summed in f32. Differentiable in expert_y and weights.

    expert_y [E_local, W * max_tokens, H] a2a.dtype, rows in dispatch's order
    indices  [m, k], the same as given to the matching dispatch
    weights  [m, k] floating point (used in f32)
    returns  y [m, H] a2a.dtype
    The gradient of expert_y is zero in the rows no token sent, or, with zero_padding=False,
    left as the memory was there (for callers whose backward reads only the rows that arrived).
    """
    a2a.check_padded("combine")
    if not isinstance(expert_y, torch.Tensor) or not isinstance(weights, torch.Tensor):
        raise _error("combine: expert_y and weights must be torch.Tensors")
    want = (a2a.num_local_experts, a2a.world_size * a2a.max_tokens, a2a.hidden_dim)
    a2a.check_device("expert_y", expert_y)
    a2a.check_device("weights", weights)
    if tuple(expert_y.shape) != want:
        raise _error(f"expert_y: shape {tuple(expert_y.shape)}, expected {list(want)}")
    if expert_y.dtype != a2a.dtype:
        raise _error(f"expert_y: dtype {expert_y.dtype}, expected {a2a.dtype}")
    if not expert_y.is_contiguous():
        raise _error("expert_y: tensor is not contiguous (call .contiguous())")
    m = weights.shape[0] if weights.dim() == 2 else -1
    if not weights.is_floating_point() or weights.dim() != 2 or weights.shape[1] != a2a.top_k:
        raise _error(f"weights: {weights.dtype} of shape {tuple(weights.shape)}, expected a "
                     f"floating-point [m, {a2a.top_k}]")
    return _Combine.apply(expert_y, weights, a2a.routing(indices, m), a2a, zero_padding)
