"""One pmoe.AllToAll inside pmoe.torch (Exchange): its tensors, its place in the dispatch ->
combine alternation, and its order on torch's CUDA stream; with the small functions that the
differentiable functions share (_autograd.py, _packed.py, _moe.py)."""
import contextlib
import functools
import warnings

import torch

from .. import _pmoe

_PMOE_DTYPE = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}


def _renamed(op, name, value, old_name, old_value):
    """A dimension given as `name` or, for one release, as `old_name`, its name before
    pmoe.MoeShape (with a DeprecationWarning)."""
    if old_value is not None:
        warnings.warn(f"{op}: {old_name} is deprecated; pass {name} instead", DeprecationWarning,
                      stacklevel=3)
        if value is not None and value != old_value:
            raise _error(f"{op}: {name} = {value} and {old_name} = {old_value} (its deprecated "
                         f"name) disagree; pass {name} only")
        return old_value
    if value is None:
        raise TypeError(f"{op}: missing the keyword argument {name}")
    return value


def _error(message):
    return _pmoe.Error(message)


@functools.cache
def _torch_sees_pmoe_device():
    """Whether torch's CUDA tensors and pmoe's CUDA device are one memory: a GPU that both run
    on (not pmoe's emulated device, which torch cannot see)."""
    return torch.cuda.is_available() and _pmoe.cuda_available() and not _pmoe.cuda_emulated()


def _same(a, b):
    """Whether two routings are equal (the same values, if not the same tensor). The same
    memory in the same shape counts as equal without reading it (on a GPU, reading would wait)."""
    if a is b:
        return True
    if a.shape != b.shape or a.device != b.device:
        return False
    if a.data_ptr() == b.data_ptr() and a.stride() == b.stride() and a.dtype == b.dtype:
        return True
    return torch.equal(a, b)


def _served_device(comm):
    """The torch.device whose tensors `comm`'s ops take: the CPU, or its GPU."""
    return torch.device(getattr(comm, "device", "cpu"))


class _StreamOrder:
    """Orders pmoe's ops on a CUDA communicator's stream after, and before, torch's current
    stream: events only, no host synchronisation, and capturable into a CUDA graph."""

    def __init__(self, comm, device):
        self.device = device
        self.pmoe_stream = torch.cuda.ExternalStream(comm.stream, device=device)

    @contextlib.contextmanager
    def __call__(self):
        torch_stream = torch.cuda.current_stream(self.device)  # autograd's threads set their own
        self.pmoe_stream.wait_stream(torch_stream)
        try:
            yield
        finally:
            torch_stream.wait_stream(self.pmoe_stream)


class Exchange:
    """One pmoe.AllToAll and where it stands in its dispatch -> combine alternation: what a
    pmoe.torch.AllToAll is made of (its forward_exchange, backward_exchange and slot_exchange),
    and what the differentiable functions here and in _packed.py call. `op` is the
    pmoe.AllToAll; dispatch(), combine() and landing() run it with torch tensors."""

    def __init__(self, comm, config, dtype, device, order, in_place):
        # With in-place buffers (the CPU only: pmoe hands them to Python as host arrays), the
        # packed functions (_packed.py) stage tokens in the op's input buffer and write expert rows
        # to its output buffer, where the node's peers read them: neither takes an extra copy.
        self.in_place = in_place and device.type == "cpu"
        # Those ops also lay the rows out packed (dispatch(exact=True)): the padded functions refuse
        # such an AllToAll (check_padded).
        self.packed = self.in_place
        self.op = _pmoe.AllToAll(comm, in_dtype=dtype, out_dtype=dtype,
                                 in_place_buffers=self.in_place, packed_expert_rows=self.packed,
                                 **config)
        self.dtype = dtype
        self.device = device
        self.order = order  # order() brackets each pmoe call: _StreamOrder on a GPU
        self.hidden_dim = config["hidden_dim"]
        self.local = self.op.num_local_experts
        self.rows = self.op.world_size * config["max_tokens"]
        self.pending = None  # the indices of a dispatch not yet followed by its combine
        self.settles = 0  # empty calls made to complete a half-run pair (tests read it)
        self._landing = self._outgoing = self._input = None  # made on first use, then kept

    def _own_buffer(self, numpy_view):
        view = torch.from_numpy(numpy_view)
        return view.view(torch.bfloat16) if self.dtype == "bf16" else view

    def landing(self):
        """A padded [E_local, rows, hidden] buffer kept for the op's life, for dispatches whose
        rows are copied out at once (the packed functions): no fresh pages per call."""
        if self._landing is None:
            self._landing = torch.empty(self.local, self.rows, self.hidden_dim,
                                        dtype=self._torch_dtype(), device=self.device)
        return self._landing

    def outgoing(self):
        """The padded buffer the packed functions' combines read: the op's own expert output
        buffer on the CPU (peers read its rows in place), else a buffer kept like landing()."""
        if self._outgoing is None:
            if self.in_place:
                self._outgoing = self._own_buffer(self.op.expert_output_buffer())
            else:  # zeros: columns a caller leaves unwritten are summed too (and dropped)
                self._outgoing = torch.zeros(self.local, self.rows, self.hidden_dim,
                                             dtype=self._torch_dtype(), device=self.device)
        return self._outgoing

    def _stage(self, x):
        """x as dispatch should read it: copied into the op's input buffer where it has one
        (peers read it there: one copy of m rows instead of one per destination), else x. x may
        be a list of [m, w_i] column blocks, set side by side (the columns after them, if any,
        are read by no one). Called with no dispatch pending: the op's last combine waited
        until every peer had read the buffer's last tokens."""
        blocks = x if isinstance(x, (list, tuple)) else None
        if blocks is None and not self.in_place:
            return x
        m = (blocks[0] if blocks else x).shape[0]
        if self.in_place:
            if self._input is None:
                self._input = self._own_buffer(self.op.input_buffer())
            staged = self._input[:m]
        else:
            staged = torch.zeros(m, self.hidden_dim, dtype=self._torch_dtype(), device=self.device)
        if blocks is None:
            staged.copy_(x)
            return staged
        start = 0
        for block in blocks:
            staged[:, start:start + block.shape[1]].copy_(block)
            start += block.shape[1]
        return staged

    def _torch_dtype(self):
        return {v: k for k, v in _PMOE_DTYPE.items()}[self.dtype]

    def _settle(self):
        """Completes a pending dispatch with an empty combine (zero rows, zero weights)."""
        idx, self.pending = self.pending, None
        self.settles += 1
        dtype, device = self._torch_dtype(), self.device
        y = torch.empty(idx.shape[0], self.hidden_dim, dtype=dtype, device=device)
        rows = torch.zeros(self.local, self.rows, self.hidden_dim, dtype=dtype, device=device)
        weights = torch.zeros(idx.shape, dtype=torch.float32, device=device)
        with self.order():
            self.op.combine(rows, idx, weights, y)

    def dispatch(self, x, indices, zero_padding=True, out=None, stage=False, exact=False):
        """(expert_x, counts); rows past an expert's count are zero, or, without zero_padding,
        whatever the memory held (no pass over the whole padded buffer). out: the padded
        buffer to land in (its padding is left as it is). stage: x may go through the op's
        input buffer. exact (a packed op: the CPU's in-place one): expert_x is instead a new
        [n, hidden] tensor of exactly the rows that arrived, in packed order (pmoe's
        arriving_rows between the send and the recv)."""
        if self.pending is not None:
            self._settle()
        if stage:
            x = self._stage(x)
        counts = torch.zeros(self.local, dtype=torch.int32, device=self.device)
        dtype = self._torch_dtype()
        if out is not None:
            expert_x = out
        elif not exact:
            make = torch.zeros if zero_padding else torch.empty
            expert_x = make(self.local, self.rows, self.hidden_dim, dtype=dtype, device=self.device)
        with self.order():
            if exact:
                self.op.dispatch(x, indices, counts, torch.empty(0, self.hidden_dim, dtype=dtype),
                                 phase="send")
                expert_x = torch.empty(self.op.arriving_rows(), self.hidden_dim, dtype=dtype)
                self.op.dispatch(x, indices, counts, expert_x, phase="recv")
            else:
                self.op.dispatch(x, indices, counts, expert_x)
        self.pending = indices
        return expert_x, counts

    def ready_for_combine(self, indices):
        """Makes the pending dispatch the one of `indices`, by empty calls if it is not; after
        this, the op's own expert output buffer (outgoing()) may be written: every peer's
        reads of its last rows are done once this op's dispatch has heard from every peer."""
        if self.pending is not None and not _same(self.pending, indices):
            self._settle()
        if self.pending is None:  # the rows' content does not matter to a combine: zeros
            self.dispatch(torch.zeros(indices.shape[0], self.hidden_dim, dtype=self._torch_dtype(),
                                      device=self.device), indices)

    def combine(self, expert_y, indices, weights):
        self.ready_for_combine(indices)
        y = torch.empty(indices.shape[0], self.hidden_dim, dtype=self._torch_dtype(),
                        device=self.device)
        try:
            with self.order():
                self.op.combine(expert_y, indices, weights, y)
        except _pmoe.PeerLost:
            self.pending = None  # the op is between calls again, its call lost
            raise
        self.pending = None
        return y

    def check_errors(self):
        try:
            self.op.check_errors()
        except _pmoe.PeerLost:
            self.pending = None  # as in combine: the op restarted between calls
            raise
