"""pmoe.transformers: pmoe's dispatch and combine as an expert-parallel implementation of Hugging
Face transformers (>= 5.23, whose ``EPImplementationInterface`` is the registry for this).

    import pmoe.transformers                     # registers ep_implementation="pmoe"
    model = AutoModelForCausalLM.from_pretrained(path, distributed_config=DistributedConfig(
        fsdp_size=W, ep_size=W, ep_implementation="pmoe"))

Token flow of one MoE block on rank r of an EP group of W ranks (E experts, E_local = E / W):

    hidden_states [m, H], top_k_index [m, k] (global ids), top_k_weights [m, k]
      | (tp_size > 1: the ranks of a TP group share the batch; each keeps its slice of rows)
      | pmoe dispatch_packed: each token crosses once to each rank owning one of its experts
      | (f32 layers: with its k weights and expert ids, as DeepEP's dispatch carries them)
      v
    rows [n, H]: the rows that arrived, by local expert, then (source, token); counts [E_local]
    (f32: row_weights [n], w[t, j] of the slot j each row serves)
      | experts_forward(rows, local expert ids, row_weights, or unit weights for 16-bit layers)
      v
    expert rows [n, H], the same order
      | pmoe combine_packed: y[t] = sum_j w[t, j] * row of (t, j), in f32, in j order (f32
      | layers: the rows carry their w[t, j] already, and combine sums them)
      v
    y [m, H] (tp_size > 1: the slices gathered back over the TP group)

Gradients flow through all of it (pmoe.torch's dispatch and combine have exact backward passes,
the routing weights included), so training runs on pmoe too.

One pmoe communicator per process and EP group (``pmoe.torch.communicator``, or the one given to
``use_communicator``), shared by every layer. Layers of the same shape (hidden size, top-k,
experts, dtype) share one pmoe.torch.AllToAll, sized for ``capacity`` tokens per rank: every
forward agrees on the largest batch of the group (one 8-byte all-gather), and the exchange grows,
to the next power of two, only when a batch needs it. Its padded buffers [E_local, W * capacity,
H] stay inside it and are reused by every call (on the CPU, pmoe's in-place buffers, where the
node's peers read tokens and expert rows without a copy). The exchanges made so far are
released at interpreter exit.
"""
import atexit
import struct
from importlib.metadata import PackageNotFoundError, version

import torch
import torch.distributed as dist

from . import _pmoe
from .torch._grouped import layout_experts
from .torch import AllToAll, combine_packed, communicator, dispatch_packed

#: The first transformers with EPImplementationInterface, the registry this module extends.
MIN_TRANSFORMERS_VERSION = "5.23.0"
#: The name this module registers, for DistributedConfig(ep_implementation=...).
NAME = "pmoe"
#: Tokens per rank an exchange is first sized for; it grows by powers of two from there.
INITIAL_CAPACITY = 64


def _version_tuple(text):
    return tuple(int(part) for part in text.split("+")[0].split(".")[:3] if part.isdigit())


try:
    from transformers.distributed.expert_parallel import EPImplementation, EPImplementationInterface
except ImportError as missing:
    try:
        found = version("transformers")
    except PackageNotFoundError:
        found = "not installed"
    raise ImportError(
        f"pmoe.transformers needs transformers >= {MIN_TRANSFORMERS_VERSION} (the first with "
        f"transformers.distributed.expert_parallel.EPImplementationInterface); found {found}. "
        f"pip install 'transformers>={MIN_TRANSFORMERS_VERSION}'") from missing


class _State:
    """What the process shares between layers: communicators by EP group, exchanges by shape."""

    def __init__(self):
        self.communicators = {}   # EP group's ranks -> pmoe communicator
        self.given = None         # a communicator from use_communicator(), for any EP group
        self.exchanges = {}       # (id(comm), H, k, E, dtype) -> _Exchange

    def release(self):
        # The exchanges first: their pmoe ops hold the communicator's symmetric memory.
        self.exchanges.clear()
        self.communicators.clear()
        self.given = None


_state = _State()
atexit.register(_state.release)


def use_communicator(comm):
    """Makes every pmoe EP layer built from now on use `comm` (a pmoe communicator, e.g. from
    pmoe.torch.communicator() or pmoe.mpi_world()) instead of one made from the EP group. Its
    size must be the EP group's; a layer of another EP size raises pmoe.Error. None: back to the
    default."""
    _state.given = comm


def _communicator_for(group, ranks):
    """The pmoe communicator of the EP group `group`, whose ranks are `ranks` (made on first
    use; kept by ranks, so that every model loaded over the same ranks shares it)."""
    size = len(ranks)
    if _state.given is not None:
        if _state.given.size != size:
            raise _pmoe.Error(
                f"pmoe.transformers: the communicator given to use_communicator() has "
                f"{_state.given.size} ranks, but the expert-parallel group has {size} "
                f"(DistributedConfig.ep_size); give one of the EP group's ranks, or None")
        return _state.given
    if ranks not in _state.communicators:
        _state.communicators[ranks] = communicator(group)  # collective over the EP group
    return _state.communicators[ranks]


def _largest_batch(comm, group, m):
    """The largest m of the EP group: pmoe's own all-gather where the communicator has one (one
    round over its TCP mesh, no torch.distributed call), else torch.distributed's all-reduce."""
    if hasattr(comm, "all_gather"):
        return max(struct.unpack("<q", b)[0] for b in comm.all_gather(struct.pack("<q", m)))
    largest = torch.tensor([m], dtype=torch.int64)
    dist.all_reduce(largest, op=dist.ReduceOp.MAX, group=group)
    return int(largest.item())


class _Exchange:
    """One pmoe.torch.AllToAll for every layer of one shape, grown when a batch needs it."""

    def __init__(self, comm, group, *, num_experts, top_k, hidden_dim, dtype):
        self.comm, self.group = comm, group
        self.shape = dict(num_experts=num_experts, top_k=top_k, hidden_dim=hidden_dim,
                          dtype=dtype)
        self.a2a = None
        self.capacity = 0
        self.grown = 0  # how many times it was (re)built; tests read it

    def fit(self, m):
        """The AllToAll for a batch of m tokens on this rank. Collective over the EP group."""
        largest = _largest_batch(self.comm, self.group, m)
        if largest > self.capacity:
            capacity = max(INITIAL_CAPACITY, self.capacity)
            while capacity < largest:
                capacity *= 2
            # Every rank saw the same largest batch, so every rank builds the same one.
            self.a2a = None  # the old workspace goes before the new one is made
            # f32 layers: the weights travel with dispatch and the experts apply them (two
            # exchanges fewer a forward and backward, the same sums). 16-bit layers keep them at
            # combine, which weights the rows in f32: weighted rows rounded to bf16 before the
            # sum would drift from the single-process model (by 1.5x its bf16 tolerance, on
            # DeepSeek-V3's top-8).
            self.a2a = AllToAll(self.comm, max_tokens=capacity, in_place_buffers=True,
                                weighted_dispatch=self.shape["dtype"] == torch.float32,
                                **self.shape)
            self.capacity = capacity
            self.grown += 1
        return self.a2a


def _exchange_for(comm, group, num_experts, top_k, hidden_dim, dtype):
    key = (id(comm), hidden_dim, top_k, num_experts, dtype)
    if key not in _state.exchanges:
        _state.exchanges[key] = _Exchange(comm, group, num_experts=num_experts, top_k=top_k,
                                          hidden_dim=hidden_dim, dtype=dtype)
    return _state.exchanges[key]


def _tp_slice(tensors, tp_mesh):
    """This TP rank's rows of a batch its TP group shares (backward: the row gradients
    all-gathered), as transformers' own "all_to_all" slices it, so both keep the same tokens."""
    from torch.distributed.tensor import DTensor, Replicate, Shard
    return [DTensor.from_local(t, tp_mesh, [Replicate()], run_check=False)
            .redistribute(tp_mesh, [Shard(0)]).to_local() for t in tensors]


def _tp_gather(y, tp_mesh, num_tokens):
    """The TP group's slices of the output, gathered back into the whole batch."""
    from torch.distributed.tensor import DTensor, Shard
    hidden = y.shape[-1]
    return DTensor.from_local(y.contiguous(), tp_mesh, [Shard(0)], shape=(num_tokens, hidden),
                              stride=(hidden, 1)).full_tensor()


class PmoeEP(EPImplementation):
    """The experts reached through pmoe's dispatch and combine (module docstring: token flow)."""

    def __init__(self, experts, ep_mesh, tp_mesh):
        super().__init__(experts, ep_mesh, tp_mesh)
        self.group = ep_mesh.get_group()
        self.ranks = tuple(dist.get_process_group_ranks(self.group))
        # Made now, collectively, while every rank builds its layers.
        _communicator_for(self.group, self.ranks)
        self.num_experts = self.num_local_experts * len(self.ranks)

    def _exchange(self, top_k, hidden_dim, dtype):
        # Looked up per call rather than held, so that the module's exit hook, not the model's
        # lifetime, decides when pmoe's objects go.
        return _exchange_for(_communicator_for(self.group, self.ranks), self.group,
                             self.num_experts, top_k, hidden_dim, dtype)

    def __call__(self, hidden_states, top_k_index, top_k_weights):
        num_tokens = hidden_states.shape[0]
        if self.tp_mesh.size() > 1:
            hidden_states, top_k_index, top_k_weights = _tp_slice(
                (hidden_states, top_k_index, top_k_weights), self.tp_mesh)
        if hidden_states.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise _pmoe.Error(f"pmoe.transformers: hidden states of {hidden_states.dtype}; pmoe "
                              f"exchanges float32, bfloat16 and float16 (load the model in one)")
        exchange = self._exchange(top_k_index.shape[-1], hidden_states.shape[-1],
                                  hidden_states.dtype)
        a2a = exchange.fit(hidden_states.shape[0])
        indices, top_k_weights = _merge_repeated_experts(top_k_index.detach(), top_k_weights)
        if a2a.weighted_dispatch:
            rows, counts, row_weights = dispatch_packed(a2a, hidden_states.contiguous(), indices,
                                                        top_k_weights)
            y = combine_packed(a2a, self._run_experts(rows, counts, row_weights), counts, indices)
        else:
            rows, counts = dispatch_packed(a2a, hidden_states.contiguous(), indices)
            y = combine_packed(a2a, self._run_experts(rows, counts), counts, indices,
                               top_k_weights)
        if self.tp_mesh.size() > 1:
            y = _tp_gather(y, self.tp_mesh, num_tokens)
        return y

    def _run_experts(self, rows, counts, row_weights=None):
        """This rank's experts on the rows that arrived, packed by expert, run top-1 with the
        routing weight of the slot each row serves where dispatch brought them (combine then
        only sums), else with unit weights (combine applies the routing weights).

        The experts are transformers' own, in the model's experts implementation: "grouped_mm"
        by default, torch._grouped_mm over the packed rows with offsets from their expert ids,
        so each expert's GEMMs cost the rows that arrived. On a GPU, dispatch_packed's rows are
        a buffer sized for the most that can arrive, the rows past counts.sum() zero (found
        with no host wait): they get expert id E_local, transformers' mark of a row for no
        local expert, which its experts implementations skip (their output rows are zero), and
        weight 0."""
        ids = layout_experts(counts, rows.shape[0]).unsqueeze(1)
        if rows.shape[0] == 0:
            # Run the experts on one zero row all the same, so that their parameters stay in the
            # backward graph and FSDP's gradient reduction over the expert group runs here too.
            out = self.experts_forward(rows.sum(0, keepdim=True), ids.new_zeros(1, 1),
                                       rows.new_ones(1, 1))[:0]
        else:
            weights = ((ids < counts.shape[0]).to(rows.dtype) if row_weights is None
                       else row_weights.unsqueeze(1))
            out = self.experts_forward(rows, ids, weights)
        return out.to(rows.dtype)


def _merge_repeated_experts(indices, weights):
    """Routes that name an expert twice for one token (some routers can: hash routing, capacity
    re-routes) as pmoe's dispatch takes them, each expert at most once a row: a repeat's weight
    is added to the expert's first slot, and the repeat becomes -1 (skipped). The sum y is the
    same, and so are the gradients of the weights (the merge is a scatter-add)."""
    k = indices.shape[-1]
    same = indices.unsqueeze(2) == indices.unsqueeze(1)       # [m, k, k]
    first = same.to(torch.int8).argmax(dim=2)                  # each slot's first equal slot
    repeat = first != torch.arange(k, device=indices.device)
    merged = torch.zeros_like(weights).scatter_add(1, first.long(), weights)
    return indices.masked_fill(repeat, -1), merged


EPImplementationInterface.register(NAME, PmoeEP)

__all__ = ["MIN_TRANSFORMERS_VERSION", "NAME", "PmoeEP", "use_communicator"]
