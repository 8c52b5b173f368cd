"""pmoe: communication for Mixture-of-Experts layers split over ranks.

Ranks are threads of this process (``run_ranks``) or MPI processes (``mpi_world`` under
mpirun). Ops take any DLPack array (NumPy on CPU; PyTorch, CuPy or JAX where installed) and
release the GIL while they run. NumPy has no bf16 or f8 types: uint16 and uint8 arrays carry
bf16 and f8e4m3 bit patterns. Errors are raised as ``pmoe.Error`` with the C++ message.
"""

from ._pmoe import (AllGatherGemm, AllToAll, Communicator, EpMoe, Error, GemmReduceScatter,
                    MoeConfig, MpiCommunicator, SimpleMoe, TpMoe, cuda_available, moe_weights,
                    mpi_world, run_ranks)

__all__ = ["AllGatherGemm", "AllToAll", "Communicator", "EpMoe", "Error", "GemmReduceScatter",
           "MoeConfig", "MpiCommunicator", "SimpleMoe", "TpMoe", "cuda_available", "moe_weights",
           "mpi_world", "run_ranks"]
