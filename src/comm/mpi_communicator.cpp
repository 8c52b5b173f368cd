// MpiCommunicator: host-side collectives through non-blocking MPI calls completed by a bounded
// wait; symmetric memory through POSIX shared memory on the node and MPI messages off it.
#include "pmoe/mpi_communicator.hpp"

#include <sched.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>

#include "comm/agree_on_step.hpp"
#include "comm/device_segments.hpp"
#include "comm/group.hpp"
#include "comm/routed_memory.hpp"
#include "comm/peer_watch.hpp"
#include "core/device_runtime.hpp"
#include "comm/mpi_transport.hpp"
#include "comm/node_occupancy.hpp"
#include "comm/node_segments.hpp"
#include "comm/shm_segment.hpp"
#include "comm/wait.hpp"
#include "pmoe/error.hpp"

namespace pmoe {
namespace {

void check_mpi(int code, const char* call) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw Error(detail::cat(call, " failed: ", std::string(text, size_t(length))));
}

bool shm_allowed() {
  const char* text = std::getenv("PMOE_MPI_SHM");
  return !(text && std::string(text) == "0");
}

// Everything a symmetric allocation owns: the mappings of this rank's and its node peers'
// segments (or, on a GPU, its device memory and the peers' CUDA IPC mappings), and its
// registration with the transport to off-node peers.
struct MpiRegions {
  std::vector<detail::ShmSegment> segments;
  detail::DeviceSegments device_segments;
  std::shared_ptr<detail::MpiTransport> transport;
  uint64_t serial = 0;
  ~MpiRegions() {
    if (transport) transport->remove_region(serial);
  }
};

using MpiSymmetricMemory = detail::RoutedSymmetricMemory<detail::MpiTransport, MpiRegions>;

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm, Device device)
    : Communicator(std::make_shared<detail::Group>(), device) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  PMOE_CHECK(initialized, "MpiCommunicator: MPI is not initialised; call MPI_Init first");
  if (device.kind == Device::Kind::cuda) set_stream(detail::create_stream(device));
  check_mpi(MPI_Comm_dup(comm, &comm_), "MPI_Comm_dup");
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  transport_ = std::make_shared<detail::MpiTransport>(comm_, rank_, timeout_s());

  // Node-local peers: the ranks MPI places in this rank's shared-memory domain.
  MPI_Comm node_comm;
  check_mpi(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node_comm),
            "MPI_Comm_split_type");
  int node_size = 0;
  MPI_Comm_size(node_comm, &node_size);
  std::vector<int> ranks_in_node(size_t(node_size), 0);
  MPI_Group world_group, node_group;
  MPI_Comm_group(comm_, &world_group);
  MPI_Comm_group(node_comm, &node_group);
  std::vector<int> local_ids(static_cast<size_t>(node_size));
  for (int i = 0; i < node_size; ++i) local_ids[size_t(i)] = i;
  MPI_Group_translate_ranks(node_group, node_size, local_ids.data(), world_group,
                            ranks_in_node.data());
  MPI_Group_free(&world_group);
  MPI_Group_free(&node_group);
  MPI_Comm_free(&node_comm);
  if (shm_allowed()) {
    node_ranks_ = ranks_in_node;
    std::sort(node_ranks_.begin(), node_ranks_.end());
  } else {
    node_ranks_ = {rank_};
  }

  // Segment names: PMOE_SHM_PREFIX (default "pmoe"), then 128 random bits drawn by rank 0 and
  // shared by all, so that no other process can guess a name and create or open it first.
  char id[33] = {};
  if (rank_ == 0) {
    unsigned char random[16] = {};
    PMOE_CHECK(getrandom(random, sizeof random, 0) == ssize_t(sizeof random),
               "MpiCommunicator: getrandom failed: ", std::strerror(errno));
    for (size_t i = 0; i < sizeof random; ++i)
      std::snprintf(id + 2 * i, 3, "%02x", unsigned(random[i]));
  }
  broadcast(std::as_writable_bytes(std::span(id)), 0);
  job_id_ = detail::cat(detail::shm_prefix(), ".", std::string(id, 32));

  // Node-local peers are watched whatever the transport: a dead one fails every wait at once.
  const auto self = detail::PeerWatch::self();
  const auto all = all_gather(std::as_bytes(std::span(&self, 1)));
  std::vector<detail::PeerWatch::Identity> identities(static_cast<size_t>(size_));
  std::memcpy(identities.data(), all.data(), all.size());
  group()->set_peer_watch(std::make_shared<detail::PeerWatch>(rank_, ranks_in_node, identities));

  // Waits block early where this node's ranks outnumber its CPUs.
  detail::note_node_occupancy(*this, ranks_in_node);

  // The rejection board: a slot per rank in node-shared memory, one small segment each.
  auto board = std::make_shared<MpiRegions>();
  std::vector<std::byte*> slots(size_t(size_), nullptr);
  auto name_of = [&](int r) { return detail::cat("/", job_id_, ".board.", r); };
  auto agree = [&](const std::string& my_error, const char* step) {
    detail::agree_on_step(*this, my_error,
                          detail::cat("MpiCommunicator: the rejection board (", step, ")"));
  };
  detail::map_node_segments(board->segments, slots, sizeof(detail::RejectionSlot), rank_,
                            node_ranks_, name_of, agree);
  std::vector<detail::RejectionSlot*> board_slots(size_t(size_), nullptr);
  for (int r = 0; r < size_; ++r)
    board_slots[size_t(r)] = reinterpret_cast<detail::RejectionSlot*>(slots[size_t(r)]);
  group()->set_rejection_slots(std::move(board_slots), board);
}

MpiCommunicator::~MpiCommunicator() {
  detail::destroy_stream(stream());
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void MpiCommunicator::wait(MPI_Request& request, const char* what) {
  int done = 0;
  detail::wait_until(
      timeout_s(),
      [&] {
        check_mpi(MPI_Test(&request, &done, MPI_STATUS_IGNORE), what);
        return done != 0;
      },
      [&] {
        group()->check(rank_);   // a node peer that died
        transport_->progress();  // a peer may be sending to this rank meanwhile
      },
      [&] {
        throw Error(detail::cat(what, " on rank ", rank_, ": not every rank arrived within ",
                                timeout_s(), " s"));
      });
}

void MpiCommunicator::barrier() {
  MPI_Request request;
  check_mpi(MPI_Ibarrier(comm_, &request), "MPI_Ibarrier");
  wait(request, "barrier");
}

std::vector<std::byte> MpiCommunicator::all_gather(std::span<const std::byte> mine) {
  PMOE_CHECK(mine.size() <= size_t(INT_MAX), "all_gather: ", mine.size(), " bytes is too many");
  std::vector<std::byte> all(mine.size() * size_t(size_));
  MPI_Request request;
  check_mpi(MPI_Iallgather(mine.data(), int(mine.size()), MPI_BYTE, all.data(),
                           int(mine.size()), MPI_BYTE, comm_, &request),
            "MPI_Iallgather");
  wait(request, "all_gather");
  return all;
}

void MpiCommunicator::broadcast(std::span<std::byte> data, int root) {
  PMOE_CHECK(root >= 0 && root < size_, "broadcast: root ", root, " outside [0, ", size_, ")");
  PMOE_CHECK(data.size() <= size_t(INT_MAX), "broadcast: ", data.size(), " bytes is too many");
  MPI_Request request;
  check_mpi(MPI_Ibcast(data.data(), int(data.size()), MPI_BYTE, root, comm_, &request),
            "MPI_Ibcast");
  wait(request, "broadcast");
}

std::unique_ptr<SymmetricMemory> MpiCommunicator::alloc_symmetric(size_t bytes,
                                                                  int signal_slots) {
  return alloc_symmetric_in(device(), bytes, signal_slots);
}

std::unique_ptr<SymmetricMemory> MpiCommunicator::alloc_host_symmetric(size_t bytes) {
  return alloc_symmetric_in(Device::cpu(), bytes, 0);
}

std::unique_ptr<SymmetricMemory> MpiCommunicator::alloc_symmetric_in(Device where,
                                                                     size_t bytes,
                                                                     int signal_slots) {
  PMOE_CHECK(signal_slots >= 0, "alloc_symmetric: negative signal count ", signal_slots);
  const size_t data_bytes = (bytes + 63) / 64 * 64;
  const size_t total = data_bytes + size_t(signal_slots) * SymmetricMemory::kSignalBytes;
  const uint64_t serial = allocations_++;
  auto name_of = [&](int r) { return detail::cat("/", job_id_, ".", serial, ".", r); };

  auto agree = [&](const std::string& my_error, const char* step) {
    detail::agree_on_step(*this, my_error, detail::cat("alloc_symmetric (", step, ")"));
  };

  auto regions = std::make_shared<MpiRegions>();
  std::vector<std::byte*> data(size_t(size_), nullptr);
  std::vector<uint64_t*> signals(size_t(size_), nullptr);
  auto find_signals = [&] {
    for (int r = 0; r < size_; ++r)
      if (data[size_t(r)])
        signals[size_t(r)] = reinterpret_cast<uint64_t*>(data[size_t(r)] + data_bytes);
    regions->transport = transport_;
    regions->serial = serial;
  };
  if (where.kind == Device::Kind::cuda) {
    detail::map_device_segments(regions->device_segments, data, total, *this, node_ranks_, agree);
    find_signals();
  } else {
    // Off-node messages land in host memory only. Registered before the last exchange: a peer
    // puts only after that exchange, and the transport drops a message whose region it does not
    // know (mpi.moe.offnode once lost a dispatch signal so, under load).
    detail::map_node_segments(regions->segments, data, total, rank_, node_ranks_, name_of, agree,
                              [&] {
                                find_signals();
                                transport_->add_region(serial, data[size_t(rank_)],
                                                       signals[size_t(rank_)]);
                              });
  }
  return std::make_unique<MpiSymmetricMemory>(rank_, bytes, signal_slots, std::move(data),
                                              std::move(signals), regions, group(), timeout_s(),
                                              where);
}

}  // namespace pmoe
