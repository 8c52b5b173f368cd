"""The README's torchrun example as a new user runs it (2 processes, gloo, CPU): a communicator,
an EpMoE (three pmoe.AllToAll ops) and a loss whose graph refers to them, all left as globals
when the script ends. ctest fails the run if the process does not exit 0 or anything prints
"leaked" (nanobind's reports of objects alive at interpreter exit, once 25 lines per rank)."""
import torch
import torch.distributed as dist

import pmoe.torch as pt

torch.set_num_threads(1)  # 2 processes on a 2-core machine
dist.init_process_group("gloo")
comm = pt.communicator()
layer = pt.EpMoE(comm, hidden_dim=16, ffn_dim=32, num_experts=4, top_k=2, max_tokens=8,
                 swiglu=True)
x, target = torch.randn(8, 16), torch.randn(8, 16)
loss = torch.nn.functional.mse_loss(layer(x), target)
loss.backward()
for p in layer.replicated_parameters():
    dist.all_reduce(p.grad)
print(f"rank {comm.rank}: one step done; comm, layer and loss left alive for exit", flush=True)
