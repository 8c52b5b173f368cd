// Umbrella header: the whole public API except MpiCommunicator (pmoe/mpi_communicator.hpp) and
// the diagnostics (pmoe/diagnostics/: what the emulated device counts of each kernel).
#pragma once

#include "pmoe/all_to_all.hpp"
#include "pmoe/comm.hpp"
#include "pmoe/dtype.hpp"
#include "pmoe/error.hpp"
#include "pmoe/graph.hpp"
#include "pmoe/memory.hpp"
#include "pmoe/moe.hpp"
#include "pmoe/overlap.hpp"
#include "pmoe/tensor.hpp"
