"""pmoe.torch.communicator(): a pmoe Communicator for the ranks of a torch.distributed group.

The group is used once, to exchange what pmoe's own TCP mesh needs (each rank's listening
address and node name, and a job id); from then on pmoe's ops never call torch.distributed,
so their waits stay in C++ with the GIL released.
"""
import os
import socket
import time

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


def communicator(group=None):
    """A pmoe.SocketCommunicator over the ranks of `group` (the default group when None).

    Collective over the group: every rank of it must call it. torch.distributed must be
    initialised (torchrun + dist.init_process_group("gloo")). Ranks whose node names agree
    (PMOE_NODE, else the hostname) share symmetric memory through POSIX shared memory; the
    others reach each other through pmoe's TCP frames. Raises pmoe.Error on every rank when
    the ranks disagree, or a peer does not connect within PMOE_TIMEOUT_S.
    """
    if not dist.is_available() or not dist.is_initialized():
        raise _pmoe.Error("pmoe.torch.communicator: torch.distributed is not initialised; "
                          "call torch.distributed.init_process_group first (under torchrun)")
    rank = dist.get_rank(group)
    size = dist.get_world_size(group)
    if rank < 0:
        raise _pmoe.Error("pmoe.torch.communicator: this process is not in the group")
    node = os.environ.get(NODE_ENV) or socket.gethostname()
    listener = _pmoe.SocketListener()
    mine = {"address": f"{_own_address()}:{listener.port}", "node": node,
            "job": f"{os.getpid()}.{time.monotonic_ns() & 0xffffffffff:x}"}
    everyone = [None] * size
    dist.all_gather_object(everyone, mine, group=group)
    nodes = [e["node"] for e in everyone]
    addresses = [e["address"] for e in everyone]
    if len(set(nodes)) == 1 and not os.environ.get(ADDRESS_ENV):
        # One node: loopback works whatever the hostname resolves to.
        addresses = [f"127.0.0.1:{a.rsplit(':', 1)[1]}" for a in addresses]
    job = "torch." + everyone[0]["job"]
    return _pmoe.SocketCommunicator(listener, rank, addresses, nodes, job)
