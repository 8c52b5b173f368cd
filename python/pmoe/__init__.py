"""pmoe: communication for Mixture-of-Experts layers split over ranks.

Ranks are threads of this process (``run_ranks``), MPI processes (``mpi_world`` under
mpirun) or torchrun processes (``pmoe.torch.communicator()``; ``pmoe.torch`` needs PyTorch,
``pmoe`` alone does not). Ops take any DLPack array (NumPy on CPU; PyTorch, CuPy or JAX where
installed) and release the GIL while they run. NumPy has no bf16 or f8 types: uint16 and uint8
arrays carry bf16 and f8e4m3 bit patterns. Errors are raised as ``pmoe.Error`` with the C++ message;
in ``run_ranks``, the first rank's exception reaches the caller as it was raised.
``device="cuda:N"`` runs on a GPU, or on pmoe's emulated CUDA device where none is visible
(``cuda_emulated()``); ``zeros`` and ``copy`` give arrays in pmoe's memory on either, and on the
emulated device they are the only arrays an op takes (torch has no CUDA there).
"""

from ._pmoe import (AllGatherGemm, AllToAll, Communicator, EpMoe, Error, GemmReduceScatter,
                    MoeConfig, MoeShape, PeerLost, SimpleMoe, SocketCommunicator, SocketListener,
                    TpMoe,
                    copy, cuda_available, cuda_emulated, has_mpi, moe_weights, mpi_world,
                    run_ranks, zeros)
from ._pmoe import __version__  # CMakeLists.txt's project(VERSION), which pyproject.toml reads

__all__ = ["AllGatherGemm", "AllToAll", "Communicator", "EpMoe", "Error", "GemmReduceScatter",
           "MoeConfig", "MoeShape", "PeerLost", "SimpleMoe", "SocketCommunicator",
           "SocketListener", "TpMoe",
           "copy",
           "cuda_available", "cuda_emulated", "has_mpi", "moe_weights", "mpi_world", "run_ranks",
           "zeros"]
# A build without MPI (PMOE_MPI=OFF, or none found: what torchrun needs) has no MpiCommunicator,
# and its mpi_world() raises pmoe.Error saying so.
if has_mpi:
    from ._pmoe import MpiCommunicator  # noqa: F401
    __all__.append("MpiCommunicator")
