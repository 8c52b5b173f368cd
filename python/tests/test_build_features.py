"""What this build of the module holds (no ranks): MPI is optional (PMOE_MPI), and a build
without it says so where MPI would be used, instead of failing to import."""
import pytest

import pmoe


def test_mpi_world_matches_the_build():
    if pmoe.has_mpi:
        assert "MpiCommunicator" in pmoe.__all__ and hasattr(pmoe, "MpiCommunicator")
        pytest.skip("built with MPI: python.mpi runs mpi_world() under mpiexec")
    assert not hasattr(pmoe, "MpiCommunicator") and "MpiCommunicator" not in pmoe.__all__
    with pytest.raises(pmoe.Error, match="built without MPI.*pmoe.torch.communicator"):
        pmoe.mpi_world()
