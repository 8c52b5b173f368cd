"""EpMoE: an expert-parallel MoE layer as a torch.nn.Module, trained end to end.

    router:  probs = softmax(x @ router.weight.T) in f32; top-k; weights renormalised to sum 1
    experts: rank r holds experts [r * E_local, (r + 1) * E_local) as stacked parameters
             w1 [E_local, H, F], w2 [E_local, F, H] and, with swiglu, w3 [E_local, H, F]:
             expert(x) = act(x @ w1) @ w2, act = gelu; swiglu: (silu(x @ w3) * (x @ w1)) @ w2
    forward: dispatch -> the rows that arrived, packed -> grouped GEMMs -> combine (pmoe's ops
             carry the traffic)

The experts compute on the rows that arrived only (_grouped.py draws the layout): each expert's
first counts[e] rows of dispatch's padded buffer are gathered into one packed tensor, and
torch._grouped_mm runs every expert's GEMM over its own rows (offs = cumsum(counts)), instead of
every expert over the whole padded buffer, E_local * W * max_tokens rows (E / k times the
rows that arrived). On a GPU (a communicator made with device="cuda:N") the parameters live on
that GPU and the packing index is computed on the device, into a buffer sized for the most rows
that can arrive, so nothing waits for the counts on the host and a forward can be captured into
a CUDA graph. Where torch's grouped GEMM would wait on the host (on CUDA: any dtype but bf16, a
GPU other than sm90/sm100), the experts run batched over the padded buffer, as they did before
(_grouped.padded_experts); on the CPU, where no grouped GEMM runs (widths not a multiple of 16
bytes), one GEMM chain per expert on its packed rows.

The router is replicated: each rank's router gradient covers its own tokens only, so sum it
over the ranks before the optimizer step (replicated_parameters() lists it; DDP does it too).
The expert parameters are this rank's own and need no reduction.
"""
import torch
import torch.nn.functional as F
from torch import nn

from .. import _pmoe
from . import _grouped
from ._autograd import AllToAll, combine, dispatch
from ._exchange import _renamed, _served_device, _torch_sees_pmoe_device

#: Tests set it to run the experts the GPU's way on the CPU: packed rows found without reading
#: the counts (a buffer sized for the most rows that can arrive, a zero tail).
_BATCHED_ON_CPU = False


def route(x, router_weight, top_k):
    """(indices [m, k] int64, weights [m, k] f32): the top-k experts of each token and their
    softmax probabilities renormalised over the k."""
    probs = torch.softmax((x @ router_weight.t()).float(), dim=-1)
    top, indices = torch.topk(probs, top_k, dim=-1)
    return indices, top / top.sum(-1, keepdim=True)


def expert_forward(x, w1, w2, w3=None):
    """One expert on its rows x [n, H]."""
    h = x @ w1
    h = F.silu(x @ w3) * h if w3 is not None else F.gelu(h)
    return h @ w2


class EpMoE(nn.Module):
    """Collective at construction over `comm` (pmoe.torch.communicator()).

    hidden_dim H, ffn_dim F, num_experts E (divisible by comm.size), top_k, max_tokens (per
    rank and call), swiglu (adds w3), dtype of activations and parameters (float32, bfloat16,
    float16). Parameters live on the communicator's device (the CPU or its GPU) and start random
    from torch's CPU generator (the same values on either device); load_dense() sets them from
    full tensors (the same on every rank), e.g. to match a single-process model.
    on_peer_loss, peer_timeout_s: as pmoe.torch.AllToAll's. With "mask" a forward in which the
    survivors find a rank lost raises pmoe.PeerLost, and later forwards go on without that rank's
    experts (self.a2a.live_ranks says which). For serving: run the lost forward's tokens again;
    on CUDA, check_errors() after synchronizing tells a lost forward before its output is used.
    For training a lost rank takes its experts' weights and optimizer state with it: the
    backward's exchanges raise pmoe.PeerLost too, and the way on is a restart from a checkpoint
    (docs/robustness.md).
    placement: for each expert slot (a multiple of comm.size of them; rank r holds slots
    [r * S_local, (r + 1) * S_local)), the expert in [0, num_experts) it serves: replicas of an
    expert on several ranks, as EPLB deploys them. Each token goes to one of its experts' slots
    by a fixed rule, a live one where a rank is masked, so with a live replica of every expert
    no token is lost and the output is the whole model's. The stacked parameters are then this
    rank's slots' ([S_local, ...]), and load_dense() gives each slot its expert's weights. In
    training, a replica's gradient covers the tokens it served only: sum an expert's replicas'
    gradients before the step (or use replicas for serving).
    """

    def __init__(self, comm, *, hidden_dim, ffn_dim, num_experts, top_k, max_tokens=None,
                 swiglu=False, dtype=torch.float32, on_peer_loss="fail", peer_timeout_s=0.0,
                 placement=None, max_num_tokens=None):
        super().__init__()
        max_tokens = _renamed("pmoe.torch.EpMoE", "max_tokens", max_tokens, "max_num_tokens",
                              max_num_tokens)
        self.comm = comm
        self.top_k = top_k
        device = _served_device(comm)
        if device.type == "cuda" and not _torch_sees_pmoe_device():
            raise _pmoe.Error(f"EpMoE: the communicator serves {device}, but torch cannot make "
                              f"tensors there (torch has no CUDA, or pmoe's CUDA ops run on its "
                              f"emulated device); use a communicator on the CPU "
                              f"(pmoe.torch.communicator(device=None)), or a GPU with CUDA torch "
                              f"and pmoe's CUDA backend")
        slots = dict(num_experts=num_experts)
        if placement is not None:
            slots = dict(num_experts=len(placement), placement=placement,
                         num_logical_experts=num_experts)
        self.a2a = AllToAll(comm, max_tokens=max_tokens, top_k=top_k,
                            hidden_dim=hidden_dim, dtype=dtype, on_peer_loss=on_peer_loss,
                            peer_timeout_s=peer_timeout_s, **slots)
        local = self.a2a.num_local_experts
        self.first_expert = self.a2a.first_expert
        self.router = nn.Linear(hidden_dim, num_experts, bias=False, dtype=dtype)
        self.router.to(device)

        def stacked(rows, cols):
            return nn.Parameter((torch.randn(local, rows, cols) / rows ** 0.5).to(device, dtype))

        self.w1 = stacked(hidden_dim, ffn_dim)
        self.w2 = stacked(ffn_dim, hidden_dim)
        self.w3 = stacked(hidden_dim, ffn_dim) if swiglu else None
        # True: every expert over the whole padded buffer (the reference the tests compare the
        # packed, grouped path with; what a GPU ran before torch._grouped_mm).
        self._padded_experts = False

    def replicated_parameters(self):
        """Parameters every rank holds a copy of (sum their gradients over the ranks)."""
        return list(self.router.parameters())

    def check_errors(self):
        """As pmoe.torch.AllToAll.check_errors, for this layer's exchanges."""
        self.a2a.check_errors()

    @torch.no_grad()
    def load_dense(self, router_weight, w1, w2, w3=None):
        """Sets the router [E, H] and, from the full expert tensors [E, ...], this rank's slots'
        experts (its slice of them without a placement)."""
        local = self.a2a.logical_experts(torch.arange(self.a2a.num_local_experts,
                                                      device=self.router.weight.device))
        local = local.to(w1.device)
        self.router.weight.copy_(router_weight)
        self.w1.copy_(w1[local])
        self.w2.copy_(w2[local])
        if (w3 is None) != (self.w3 is None):
            raise ValueError("load_dense: w3 must be given exactly when the layer is swiglu")
        if w3 is not None:
            self.w3.copy_(w3[local])

    def forward(self, x):
        """x [m, H] -> y [m, H], m <= max_tokens (may differ between ranks, 0 included).

        x must have the layer's dtype; anything else raises pmoe.Error before any work."""
        # Checked here, not left to dispatch: the router's matmul runs first and would fail
        # inside torch ("expected m1 and m2 to have the same dtype") without naming pmoe's rule.
        if isinstance(x, torch.Tensor) and x.dtype != self.a2a.dtype:
            raise _pmoe.Error(
                f"EpMoE: x is {x.dtype}, but this layer was built with dtype={self.a2a.dtype}; "
                f"pass x.to({self.a2a.dtype}), or build the layer with x's dtype "
                f"(torch.float32, torch.bfloat16 or torch.float16: pmoe's ops have no float64 "
                f"path)")
        self.a2a.check_tokens("EpMoE: x", x, self.a2a.hidden_dim, self.a2a.dtype)
        indices, weights = route(x, self.router.weight, self.top_k)
        on_device = x.is_cuda or _BATCHED_ON_CPU  # no read of the counts on the host
        hidden, ffn = self.w1.shape[1], self.w1.shape[2]
        grouped = _grouped.grouped_mm_runs(x.dtype, x.device, hidden, ffn)
        padded = self._padded_experts or (x.is_cuda and not grouped)
        # The packed path reads no padding row (the padded one multiplies them: zeros needed).
        expert_x, counts = dispatch(self.a2a, x, indices, zero_padding=padded)
        if padded:
            expert_y = _grouped.padded_experts(expert_x, self.w1, self.w2, self.w3)
            return combine(self.a2a, expert_y.to(expert_x.dtype), indices, weights)
        local, rows = expert_x.shape[0], expert_x.shape[1]
        # The most rows that can arrive where the counts stay on the device; else their sum.
        bound = rows * min(self.top_k, local) if on_device else int(counts.sum())
        where = _grouped.layout(counts, rows, bound)
        packed = _grouped.packed_experts(_grouped.pack(expert_x, where), where, self.w1, self.w2,
                                         self.w3, grouped=grouped)
        expert_y = _grouped.unpack(packed.to(expert_x.dtype), where, local)
        return combine(self.a2a, expert_y, indices, weights, zero_padding=False)
