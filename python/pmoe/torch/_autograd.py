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

Each pmoe AllToAll op must alternate dispatch -> combine. One op carries the forward pair,
another the backward pair (combine's backward dispatches, dispatch's backward combines), a third
the (weights, ids) exchange and grad_w's return, both inside combine's backward. When autograd
runs only one half of a pair (x needs no gradient, so dispatch's backward never runs), the op is
settled by an empty counterpart call at its next use; every rank takes the same path, so these
calls stay collective.
"""
import json

import torch

from .. import _pmoe

_PMOE_DTYPE = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}


def _error(message):
    return _pmoe.Error(message)


def _same(a, b):
    """Whether two routings are equal (the same values, if not the same tensor)."""
    return a is b or (a.shape == b.shape and torch.equal(a, b))


class _Op:
    """One pmoe.AllToAll and where it stands in its dispatch -> combine alternation."""

    def __init__(self, comm, config, dtype):
        self.op = _pmoe.AllToAll(comm, in_dtype=dtype, out_dtype=dtype, **config)
        self.dtype = dtype
        self.hidden = config["hidden_dim"]
        self.local = self.op.num_local_experts
        self.rows = self.op.world_size * config["max_num_tokens"]
        self.pending = None  # the indices of a dispatch not yet followed by its combine
        self.settles = 0  # empty calls made to complete a half-run pair (tests read it)

    def _torch_dtype(self):
        return {v: k for k, v in _PMOE_DTYPE.items()}[self.dtype]

    def _settle(self):
        """Completes a pending dispatch with an empty combine (zero rows, zero weights)."""
        idx, self.pending = self.pending, None
        self.settles += 1
        y = torch.empty(idx.shape[0], self.hidden, dtype=self._torch_dtype())
        self.op.combine(torch.zeros(self.local, self.rows, self.hidden, dtype=self._torch_dtype()),
                        idx, torch.zeros(idx.shape, dtype=torch.float32), y)

    def dispatch(self, x, indices, zero_padding=True):
        """(expert_x, counts); rows past an expert's count are zero, or, without zero_padding,
        whatever the memory held (no pass over the whole padded buffer)."""
        if self.pending is not None:
            self._settle()
        counts = torch.zeros(self.local, dtype=torch.int32)
        make = torch.zeros if zero_padding else torch.empty
        expert_x = make(self.local, self.rows, self.hidden, dtype=x.dtype)
        self.op.dispatch(x, indices, counts, expert_x)
        self.pending = indices
        return expert_x, counts

    def combine(self, expert_y, indices, weights):
        if self.pending is not None and not _same(self.pending, indices):
            self._settle()
        if self.pending is None:  # the rows' content does not matter to a combine: zeros
            self.dispatch(torch.zeros(indices.shape[0], self.hidden, dtype=self._torch_dtype()),
                          indices)
        y = torch.empty(indices.shape[0], self.hidden, dtype=self._torch_dtype())
        self.op.combine(expert_y, indices, weights, y)
        self.pending = None
        return y


def _agree(comm, config):
    """Raises pmoe.Error on every rank, naming the fields, unless every rank passed `config`."""
    if not hasattr(comm, "all_gather"):  # thread or MPI ranks: pmoe's own size check only
        return
    text = json.dumps(config, sort_keys=True).encode()
    if len(text) > 1024:
        raise _error("pmoe.torch.AllToAll: config too long to compare")
    everyone = [json.loads(b.rstrip(b"\0")) for b in comm.all_gather(text.ljust(1024, b"\0"))]
    for r, theirs in enumerate(everyone):
        differ = [f"{key} = {theirs[key]} on rank {r}, {config[key]} on rank {comm.rank}"
                  for key in config if theirs.get(key) != config[key]]
        if differ:
            raise _error("pmoe.torch.AllToAll: the ranks disagree on the config: " +
                         "; ".join(differ))


class AllToAll:
    """The exchange of one MoE layer for pmoe.torch.dispatch and pmoe.torch.combine.

    Collective over `comm` (pmoe.torch.communicator()). W = comm.size ranks, E = num_experts
    (divisible by W); rank r owns experts [r * E / W, (r + 1) * E / W). Tokens per call and rank
    at most max_num_tokens. dtype: torch.float32, torch.bfloat16 or torch.float16 (pmoe's ops
    have no float64 path). Builds three pmoe.AllToAll ops (forward, backward, and the small f32
    exchange of combine's backward); workspace_bytes() says what they hold.
    """

    def __init__(self, comm, *, max_num_tokens, num_experts, experts_per_token, hidden_dim,
                 dtype=torch.float32):
        if dtype not in _PMOE_DTYPE:
            raise _error(f"pmoe.torch.AllToAll: dtype must be torch.float32, torch.bfloat16 or "
                         f"torch.float16, got {dtype} (pmoe's ops have no float64 path)")
        config = dict(max_num_tokens=max_num_tokens, num_experts=num_experts,
                      experts_per_token=experts_per_token)
        _agree(comm, dict(config, hidden_dim=hidden_dim, dtype=str(dtype)))
        self.comm = comm
        self.dtype = dtype
        self.max_num_tokens = max_num_tokens
        self.num_experts = num_experts
        self.top_k = experts_per_token
        self.hidden_dim = hidden_dim
        self._forward = _Op(comm, dict(config, hidden_dim=hidden_dim), _PMOE_DTYPE[dtype])
        self._backward = _Op(comm, dict(config, hidden_dim=hidden_dim), _PMOE_DTYPE[dtype])
        self._slots = _Op(comm, dict(config, hidden_dim=2 * experts_per_token), "f32")
        self.num_local_experts = self._forward.local
        self.world_size = comm.size
        self.first_expert = comm.rank * self.num_local_experts

    def settles(self):
        """Empty calls made so far to complete dispatch/combine pairs autograd ran half of."""
        return sum(op.settles for op in (self._forward, self._backward, self._slots))

    def workspace_bytes(self):
        return sum(op.op.workspace_bytes() for op in (self._forward, self._backward, self._slots))

    def check_tokens(self, name, x, width, dtype):
        """Raises pmoe.Error unless x is a contiguous CPU [m, width] tensor of dtype."""
        if not isinstance(x, torch.Tensor):
            raise _error(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
        if x.device.type != "cpu":
            raise _error(f"{name}: tensor on {x.device}, but this communicator's ranks run on "
                         f"the CPU")
        if x.dtype != dtype:
            raise _error(f"{name}: dtype {x.dtype}, expected {dtype} (the AllToAll's dtype)")
        if x.dim() != 2 or x.shape[1] != width:
            raise _error(f"{name}: shape {tuple(x.shape)}, expected [m, {width}]")
        if x.shape[0] > self.max_num_tokens:
            raise _error(f"{name}: {x.shape[0]} tokens, more than max_num_tokens = "
                         f"{self.max_num_tokens}")
        if not x.is_contiguous():
            raise _error(f"{name}: tensor is not contiguous (call .contiguous())")

    def routing(self, indices, m):
        """indices as pmoe's ops take them: contiguous int32 or int64 [m, k] on the CPU."""
        if not isinstance(indices, torch.Tensor):
            raise _error(f"indices: expected a torch.Tensor, got {type(indices).__name__}")
        if indices.requires_grad:
            raise _error("indices: the tensor requires grad; routing is not differentiable "
                         "(pass indices.detach() of an integer tensor)")
        if indices.device.type != "cpu":
            raise _error(f"indices: tensor on {indices.device}, expected the CPU")
        if indices.dtype not in (torch.int32, torch.int64):
            raise _error(f"indices: dtype {indices.dtype}, expected torch.int32 or torch.int64")
        if indices.dim() != 2 or indices.shape[0] != m or indices.shape[1] != self.top_k:
            raise _error(f"indices: shape {tuple(indices.shape)}, expected [{m}, {self.top_k}]")
        # As given (torch.topk's int64 included): pmoe's ops take int32 and int64 alike.
        return indices.contiguous()


class _Dispatch(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, indices, a2a, zero_padding):
        expert_x, counts = a2a._forward.dispatch(x.detach(), indices, zero_padding)
        ctx.a2a, ctx.indices, ctx.m = a2a, indices, x.shape[0]
        ctx.mark_non_differentiable(counts)
        return expert_x, counts

    @staticmethod
    def backward(ctx, grad_expert_x, _grad_counts):
        a2a = ctx.a2a
        grad = grad_expert_x.to(a2a.dtype).contiguous()
        ones = torch.ones(ctx.indices.shape, dtype=torch.float32)
        grad_x = a2a._backward.combine(grad, ctx.indices, ones)
        return grad_x, None, None, None


class _Combine(torch.autograd.Function):
    @staticmethod
    def forward(ctx, expert_y, weights, indices, a2a, zero_padding):
        y = a2a._forward.combine(expert_y.detach(), indices, weights.detach().float().contiguous())
        ctx.a2a, ctx.indices, ctx.zero_padding = a2a, indices, zero_padding
        ctx.weights_dtype = weights.dtype
        ctx.save_for_backward(expert_y, weights)
        return y

    @staticmethod
    def backward(ctx, grad_y):
        a2a, indices = ctx.a2a, ctx.indices
        expert_y, weights = ctx.saved_tensors
        k, local, hidden = a2a.top_k, a2a.num_local_experts, a2a.hidden_dim
        grad_rows, counts = a2a._backward.dispatch(grad_y.to(a2a.dtype).contiguous(), indices,
                                                   zero_padding=False)
        # Which slot of its token each row serves, and that slot's weight.
        slot_info = torch.cat([weights.detach().float(), indices.float()], dim=1).contiguous()
        info_rows, _ = a2a._slots.dispatch(slot_info, indices, zero_padding=False)
        rows = info_rows.shape[1]
        # Only the rows that arrived are read: the padding is never computed on.
        live = arrived_rows(counts, rows)
        grads = grad_rows.view(-1, hidden).index_select(0, live).float()
        info = info_rows.view(-1, 2 * k).index_select(0, live)
        expert_of_row = (live // rows + a2a.first_expert).unsqueeze(1).float()
        is_slot = info[:, k:] == expert_of_row  # [rows that arrived, k]
        row_weight = (info[:, :k] * is_slot).sum(-1, keepdim=True)
        make = torch.zeros if ctx.zero_padding else torch.empty
        grad_expert_y = make(local * rows, hidden, dtype=expert_y.dtype)
        grad_expert_y.index_copy_(0, live, (grads * row_weight).to(expert_y.dtype))
        # <grad_y[t], expert_y[row]> in the row's slot column; zero in the others. Combine reads
        # only the rows that arrived, so the padding of `back` is left as it is.
        dots = (grads * expert_y.detach().reshape(-1, hidden).index_select(0, live).float())
        back = torch.empty(local * rows, 2 * k)
        back.index_copy_(0, live, torch.cat([is_slot * dots.sum(-1, keepdim=True),
                                             torch.zeros_like(info[:, k:])], dim=1))
        ones = torch.ones(indices.shape, dtype=torch.float32)
        grad_w = a2a._slots.combine(back.view(local, rows, 2 * k), indices, ones)[:, :k]
        return (grad_expert_y.view(local, rows, hidden), grad_w.to(ctx.weights_dtype), None, None,
                None)


def arrived_rows(counts, rows):
    """The flat indices, into an [E_local * rows] view of dispatch's expert rows, of the rows
    that hold tokens: rows [0, counts[e]) of each local expert e, in that order."""
    arrived = torch.arange(rows).unsqueeze(0) < counts.unsqueeze(1)
    return arrived.view(-1).nonzero().squeeze(1)


def dispatch(a2a, x, indices, *, zero_padding=True):
    """Sends each token of x to its experts; differentiable in x.

    a2a      pmoe.torch.AllToAll
    x        [m, H] a2a.dtype, contiguous, CPU; m <= max_num_tokens (may differ between ranks)
    indices  [m, k] int32 or int64: expert ids in [0, E), or -1 for a slot to skip; no expert
             twice in a row
    returns  (expert_x [E_local, W * max_num_tokens, H], expert_num_tokens [E_local] int32):
             rows of local expert e are expert_x[e, :expert_num_tokens[e]], ordered by (source
             rank, source token); the rest are zero, or, with zero_padding=False, left as the
             memory was (for callers that read only the rows that arrived, as combine does;
             it saves a pass over the whole padded buffer). Raises pmoe.Error on bad input.
    """
    a2a.check_tokens("x", x, a2a.hidden_dim, a2a.dtype)
    return _Dispatch.apply(x, a2a.routing(indices, x.shape[0]), a2a, zero_padding)


def combine(a2a, expert_y, indices, weights, *, zero_padding=True):
    """Brings expert rows back: y[t] = sum_j weights[t, j] * expert_y[row of (t, j)], skipping
    -1 slots, summed in f32. Differentiable in expert_y and weights.

    expert_y [E_local, W * max_num_tokens, H] a2a.dtype, rows in dispatch's order
    indices  [m, k], the same as given to the matching dispatch
    weights  [m, k] floating point (used in f32)
    returns  y [m, H] a2a.dtype
    The gradient of expert_y is zero in the rows no token sent, or, with zero_padding=False,
    left as the memory was there (for callers whose backward reads only the rows that arrived).
    """
    if not isinstance(expert_y, torch.Tensor) or not isinstance(weights, torch.Tensor):
        raise _error("combine: expert_y and weights must be torch.Tensors")
    want = (a2a.num_local_experts, a2a.world_size * a2a.max_num_tokens, a2a.hidden_dim)
    if expert_y.device.type != "cpu" or weights.device.type != "cpu":
        raise _error(f"combine: tensors on {expert_y.device} / {weights.device}, expected the CPU")
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
