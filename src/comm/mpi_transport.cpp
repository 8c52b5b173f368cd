#include "comm/mpi_transport.hpp"

#include <algorithm>
#include <atomic>
#include <climits>

#include "comm/wait.hpp"
#include "pmoe/comm.hpp"
#include "pmoe/error.hpp"

namespace pmoe::detail {
namespace {

constexpr int kHeaderTag = 1;
constexpr int kPayloadTag = 2;
constexpr size_t kMaxMessage = size_t(1) << 30;  // MPI counts are ints

}  // namespace

MpiTransport::MpiTransport(MPI_Comm comm, int rank, double timeout_s)
    : rank_(rank), timeout_s_(timeout_s) {
  MPI_Comm_dup(comm, &comm_);
}

MpiTransport::~MpiTransport() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void MpiTransport::add_region(uint64_t serial, std::byte* base, uint64_t* signals) {
  regions_[serial] = {base, signals};
}

void MpiTransport::remove_region(uint64_t serial) { regions_.erase(serial); }

// Completes `requests` within the timeout; `poll_side` runs between tests, and a timeout throws
// "MPI transport on rank R: <late>".
template <typename PollSide>
void MpiTransport::wait_all(std::vector<MPI_Request>& requests, PollSide&& poll_side,
                            const std::string& late) {
  wait_until(
      timeout_s_,
      [&] {
        int done = 0;
        MPI_Testall(int(requests.size()), requests.data(), &done, MPI_STATUSES_IGNORE);
        return done != 0;
      },
      poll_side,
      [&] {
        throw Error(cat("MPI transport on rank ", rank_, ": ", late, " within ", timeout_s_, " s"));
      });
}

void MpiTransport::complete(std::vector<MPI_Request>& requests, int peer, const char* what) {
  wait_all(requests, [&] { progress(); }, cat("rank ", peer, " did not take ", what));
}

void MpiTransport::send(int peer, const Header& header, const void* payload) {
  std::vector<MPI_Request> requests(1);
  MPI_Isend(&header, sizeof header, MPI_BYTE, peer, kHeaderTag, comm_, &requests[0]);
  const auto* from = static_cast<const std::byte*>(payload);
  for (size_t done = 0; done < header.bytes; done += kMaxMessage) {
    const int chunk = int(std::min(kMaxMessage, size_t(header.bytes) - done));
    requests.emplace_back();
    MPI_Isend(from + done, chunk, MPI_BYTE, peer, kPayloadTag, comm_, &requests.back());
  }
  complete(requests, peer, header.is_signal ? "a signal" : "a put");
}

void MpiTransport::put(int peer, uint64_t serial, size_t offset, const void* src, size_t bytes) {
  send(peer, Header{serial, offset, bytes, 0, 0, 0}, src);
}

void MpiTransport::signal(int peer, uint64_t serial, int slot, uint64_t value) {
  send(peer, Header{serial, 0, 0, uint64_t(slot), value, 1}, nullptr);
}

void MpiTransport::progress() {
  for (;;) {
    int arrived = 0;
    MPI_Status status;
    MPI_Iprobe(MPI_ANY_SOURCE, kHeaderTag, comm_, &arrived, &status);
    if (!arrived) return;
    Header header;
    MPI_Recv(&header, sizeof header, MPI_BYTE, status.MPI_SOURCE, kHeaderTag, comm_,
             MPI_STATUS_IGNORE);
    const auto region = regions_.find(header.serial);
    if (header.is_signal) {
      if (region != regions_.end())
        std::atomic_ref<uint64_t>(region->second.signals[header.slot * (SymmetricMemory::kSignalBytes / sizeof(uint64_t))])
            .store(header.value, std::memory_order_release);
      continue;
    }
    std::byte* into;
    if (region != regions_.end()) {
      into = region->second.base + header.offset;
    } else {
      discard_.resize(std::min<size_t>(header.bytes, kMaxMessage));
      into = discard_.data();
    }
    std::vector<MPI_Request> requests;
    for (size_t done = 0; done < header.bytes; done += kMaxMessage) {
      const int chunk = int(std::min(kMaxMessage, size_t(header.bytes) - done));
      requests.emplace_back();
      MPI_Irecv(region != regions_.end() ? into + done : into, chunk, MPI_BYTE, status.MPI_SOURCE,
                kPayloadTag, comm_, &requests.back());
    }
    // The payload was sent right behind its header; wait for it without polling further
    // headers (that would recurse), but with the same deadline.
    wait_all(requests, [] {},
             cat("the payload of a put from rank ", status.MPI_SOURCE, " did not arrive"));
  }
}

}  // namespace pmoe::detail
