"""pmoe.torch.communicator(): a pmoe Communicator for the ranks of a torch.distributed group.

The group is used once, to exchange what pmoe's own TCP mesh needs (each rank's listening
address and node name, and a job id); from then on pmoe's ops never call torch.distributed,
so their waits stay in C++ with the GIL released.
"""
import os
import socket
import time

import torch
import torch.distributed as dist

from .. import _pmoe

#: Environment variable naming this process's node; ranks with equal names share memory.
#: Unset, the hostname. Tests set it to place the ranks of one machine on two "nodes".
NODE_ENV = "PMOE_NODE"
#: Environment variable naming the host or address peers connect to. Unset: the address of
#: the interface that reaches torchrun's MASTER_ADDR, else the hostname's; 127.0.0.1 when every
#: rank is on one node.
ADDRESS_ENV = "PMOE_ADDRESS"


def _own_address():
    if os.environ.get(ADDRESS_ENV):
        return os.environ[ADDRESS_ENV]
    master = os.environ.get("MASTER_ADDR")
    if master:
        # The hostname often resolves to 127.0.1.1 (Debian's /etc/hosts); the interface the
        # kernel would route to the master is one the other nodes can reach. A UDP "connect"
        # sends nothing.
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
                probe.connect((master, int(os.environ.get("MASTER_PORT", "29500"))))
                return probe.getsockname()[0]
        except OSError:
            pass
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def resolve_device(device):
    """pmoe's name ("cpu" or "cuda:N") for what communicator(device=...) accepts: None or "cpu"
    (the CPU); "cuda" (torch's current GPU, or GPU 0 where torch has no CUDA: pmoe's emulated
    device); "cuda:N", torch.device("cuda", N) or an int N (GPU N)."""
    if device is None:
        return "cpu"
    if isinstance(device, int) and not isinstance(device, bool):
        device = torch.device("cuda", device)
    if isinstance(device, str):
        try:
            device = torch.device(device)
        except RuntimeError:
            raise _pmoe.Error(f"pmoe.torch.communicator: device must be None, 'cpu', 'cuda', "
                              f"'cuda:N', a torch.device or an int, got {device!r}") from None
    if not isinstance(device, torch.device):
        raise _pmoe.Error(f"pmoe.torch.communicator: device must be None, 'cpu', 'cuda', "
                          f"'cuda:N', a torch.device or an int, got {type(device).__name__}")
    if device.type == "cpu":
        return "cpu"
    if device.type != "cuda":
        raise _pmoe.Error(f"pmoe.torch.communicator: device {device}; pmoe serves the CPU or a "
                          f"CUDA GPU")
    index = device.index
    if index is None:
        index = torch.cuda.current_device() if torch.cuda.is_available() else 0
    if not _pmoe.cuda_available():
        raise _pmoe.Error(f"pmoe.torch.communicator: device cuda:{index}, but this pmoe has no "
                          f"CUDA device to run on (pmoe.cuda_available() is False); use "
                          f"device=None for the CPU")
    return f"cuda:{index}"


def communicator(group=None, device=None):
    """A pmoe.SocketCommunicator over the ranks of `group` (the default group when None).

    Collective over the group: every rank of it must call it. torch.distributed must be
    initialised (torchrun + dist.init_process_group("gloo")). Ranks whose node names agree
    (PMOE_NODE, else the hostname) share symmetric memory; the others reach each other through
    pmoe's TCP frames (CPU) or the GIN path (GPU).

    device: None or "cpu": the communicator serves CPU tensors, its memory POSIX shared memory.
    "cuda", "cuda:N", torch.device("cuda", N) or an int: this process's GPU ("cuda": torch's
    current device); pmoe.torch's ops then take tensors on that GPU only, ordered on torch's
    current stream, and the node's ranks share device memory through CUDA IPC. Every rank must
    pick the same kind (each its own GPU, or GPUs shared). Where torch has no CUDA but pmoe runs
    its emulated CUDA device, "cuda:N" makes a communicator for pmoe's own arrays (pmoe.zeros,
    pmoe.copy).

    Raises pmoe.Error on every rank when the ranks disagree (kind of device included), or a peer
    does not connect within PMOE_TIMEOUT_S, or the device is not one pmoe can serve.
    """
    if not dist.is_available() or not dist.is_initialized():
        raise _pmoe.Error("pmoe.torch.communicator: torch.distributed is not initialised; "
                          "call torch.distributed.init_process_group first (under torchrun)")
    rank = dist.get_rank(group)
    size = dist.get_world_size(group)
    if rank < 0:
        raise _pmoe.Error("pmoe.torch.communicator: this process is not in the group")
    try:
        where, refused = resolve_device(device), ""
    except _pmoe.Error as e:  # told to every rank below, so that none waits for this one
        where, refused = "cpu", str(e)
    node = os.environ.get(NODE_ENV) or socket.gethostname()
    listener = _pmoe.SocketListener()
    mine = {"address": f"{_own_address()}:{listener.port}", "node": node,
            "job": f"{os.getpid()}.{time.monotonic_ns() & 0xffffffffff:x}",
            "device": where, "refused": refused}
    everyone = [None] * size
    dist.all_gather_object(everyone, mine, group=group)
    for r, theirs in enumerate(everyone):
        if theirs["refused"]:
            raise _pmoe.Error(theirs["refused"] if r == rank else
                              f"pmoe.torch.communicator: rank {r} refused its device: "
                              f"{theirs['refused']}")
    kinds = [e["device"].split(":")[0] for e in everyone]
    if len(set(kinds)) > 1:
        listing = ", ".join(f"rank {r}: {e['device']}" for r, e in enumerate(everyone))
        raise _pmoe.Error(f"pmoe.torch.communicator: the ranks asked for different kinds of "
                          f"device ({listing}); pass the same device= kind on every rank")
    nodes = [e["node"] for e in everyone]
    addresses = [e["address"] for e in everyone]
    if len(set(nodes)) == 1 and not os.environ.get(ADDRESS_ENV):
        # One node: loopback works whatever the hostname resolves to.
        addresses = [f"127.0.0.1:{a.rsplit(':', 1)[1]}" for a in addresses]
    job = "torch." + everyone[0]["job"]
    return _pmoe.SocketCommunicator(listener, rank, addresses, nodes, job, where)
