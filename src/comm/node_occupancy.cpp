#include "comm/node_occupancy.hpp"

#include <sched.h>

#include <cstring>
#include <span>

#include "comm/wait.hpp"

namespace pmoe::detail {

void note_node_occupancy(Communicator& comm, const std::vector<int>& ranks_in_node) {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(0, sizeof mask, &mask) != 0) CPU_SET(0, &mask);
  const auto masks = comm.all_gather(std::as_bytes(std::span(&mask, 1)));
  cpu_set_t node_cpus;
  CPU_ZERO(&node_cpus);
  for (int r : ranks_in_node) {
    cpu_set_t theirs;
    std::memcpy(&theirs, masks.data() + size_t(r) * sizeof theirs, sizeof theirs);
    CPU_OR(&node_cpus, &node_cpus, &theirs);
  }
  note_ranks_on_node(int(ranks_in_node.size()), CPU_COUNT(&node_cpus));
}

}  // namespace pmoe::detail
