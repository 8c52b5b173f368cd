"""pmoe.torch: pmoe inside PyTorch jobs started by torchrun (CPU or CUDA tensors, gloo for set-up).

    import torch.distributed as dist, pmoe.torch
    dist.init_process_group("gloo")
    comm = pmoe.torch.communicator()           # pmoe's own shm + TCP paths, no MPI
    # or pmoe.torch.communicator(device="cuda"): CUDA tensors on torch's current GPU
    layer = pmoe.torch.EpMoE(comm, hidden_dim=..., ffn_dim=..., num_experts=..., top_k=...,
                             max_tokens=...)
    y = layer(x); y.sum().backward()

communicator()  a pmoe Communicator over a torch.distributed group, on the CPU or a GPU
AllToAll        the exchange one layer uses (three pmoe.AllToAll ops)
dispatch        differentiable dispatch of tokens to experts
combine         differentiable combine of expert rows with router weights
dispatch_packed, combine_packed
                the same on the rows that arrived, packed [n, H] (what an EP layer's experts
                take); the padded buffer stays inside the AllToAll
EpMoE           router + stacked experts + dispatch/combine, an nn.Module
"""
from ._autograd import AllToAll, combine, dispatch
from ._comm import communicator
from ._packed import combine_packed, dispatch_packed
from ._moe import EpMoE, expert_forward, route

__all__ = ["AllToAll", "EpMoE", "combine", "combine_packed", "communicator", "dispatch",
           "dispatch_packed", "expert_forward", "route"]
