"""One process, one rank, seconds (scripts/device_checks.sh's python part runs it first): torch and
pmoe imported together, pmoe.torch.communicator() made over a 1-rank gloo group (rank 0 formats
its first numbers there: where the H200 lease's module crashed), and which C++ runtime the
process loaded, from /proc/self/maps. Exits non-zero if the communicator fails."""
import os
import tempfile

import torch
import torch.distributed as dist

import pmoe
import pmoe.torch as pt


def loaded(name):
    with open("/proc/self/maps") as maps:
        return sorted({line.split()[-1] for line in maps if name in line.split()[-1]})


def main():
    print(f"torch {torch.__version__} (CUDA {torch.version.cuda}, GPU "
          f"{torch.cuda.is_available()}), pmoe {pmoe.__version__} at {pmoe.__file__}, "
          f"MPI in this build: {pmoe.has_mpi}", flush=True)
    store = os.path.join(tempfile.mkdtemp(prefix="pmoe-probe-"), "store")
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    comm = pt.communicator()
    print(f"pmoe.torch.communicator(): rank {comm.rank} of {comm.size}", flush=True)
    for name in ("libstdc++", "libgcc_s", "libopenblas", "libmpi"):
        print(f"loaded {name}: {', '.join(loaded(name)) or 'none'}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
