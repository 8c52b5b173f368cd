// Do a node's ranks outnumber the CPUs they may run on together? Each rank's own affinity says
// too little (Open MPI binds each rank to one core when they fit; torchrun binds none), so the
// ranks gather their masks and take the union over the node. If they do, the communicator's
// waits block early instead of spinning (comm/wait.hpp: note_ranks_on_node).
#pragma once

#include <vector>

#include "pmoe/comm.hpp"

namespace pmoe::detail {

// Collective over `comm`: ranks_in_node is this rank's node, this rank included.
void note_node_occupancy(Communicator& comm, const std::vector<int>& ranks_in_node);

}  // namespace pmoe::detail
