#include "byte_all_to_all.hpp"

#include <mpi.h>

#include <climits>
#include <cstring>

#include "pmoe/error.hpp"
#include "pmoe/mpi_communicator.hpp"

namespace pmoe::bench {

struct ByteAllToAllV::Impl {
  Communicator& comm;
  MpiCommunicator* mpi;                      // set when the ranks are MPI processes
  std::vector<std::byte> mpi_send;           // MPI: the send buffer
  std::unique_ptr<SymmetricMemory> memory;   // threads: [W send displacements | send buffer]
  size_t header_bytes = 0;
};

ByteAllToAllV::ByteAllToAllV(Communicator& comm, size_t max_send_bytes)
    : impl_(new Impl{comm, dynamic_cast<MpiCommunicator*>(&comm), {}, nullptr, 0}) {
  if (impl_->mpi) {
    impl_->mpi_send.resize(max_send_bytes);
  } else {
    impl_->header_bytes = (sizeof(size_t) * size_t(comm.size()) + 63) / 64 * 64;
    impl_->memory = comm.alloc_symmetric(impl_->header_bytes + max_send_bytes, 0);
  }
}

ByteAllToAllV::~ByteAllToAllV() = default;

std::byte* ByteAllToAllV::send_buffer() const {
  return impl_->mpi ? const_cast<std::byte*>(impl_->mpi_send.data())
                    : impl_->memory->local() + impl_->header_bytes;
}

void ByteAllToAllV::exchange(const std::vector<size_t>& send_counts,
                             const std::vector<size_t>& send_displs, std::byte* recv,
                             const std::vector<size_t>& recv_counts,
                             const std::vector<size_t>& recv_displs) {
  Communicator& comm = impl_->comm;
  const int W = comm.size(), me = comm.rank();
  if (impl_->mpi) {
    auto to_int = [](const std::vector<size_t>& v) {
      std::vector<int> out(v.size());
      for (size_t i = 0; i < v.size(); ++i) {
        PMOE_CHECK(v[i] <= size_t(INT_MAX), "MPI_Alltoallv: ", v[i], " bytes exceeds an int");
        out[i] = int(v[i]);
      }
      return out;
    };
    const auto sc = to_int(send_counts), sd = to_int(send_displs), rc = to_int(recv_counts),
               rd = to_int(recv_displs);
    MPI_Alltoallv(impl_->mpi_send.data(), sc.data(), sd.data(), MPI_BYTE, recv, rc.data(),
                  rd.data(), MPI_BYTE, impl_->mpi->comm());
    return;
  }
  // Threads: publish where each block starts, wait until every rank has packed, copy this rank's
  // blocks out of every peer's buffer, and wait until every rank has copied before returning
  // (the caller may repack right after).
  std::memcpy(impl_->memory->local(), send_displs.data(), sizeof(size_t) * size_t(W));
  comm.barrier();
  for (int s = 0; s < W; ++s) {
    const std::byte* peer = impl_->memory->peer(s);
    size_t displ;
    std::memcpy(&displ, peer + sizeof(size_t) * size_t(me), sizeof displ);
    std::memcpy(recv + recv_displs[size_t(s)], peer + impl_->header_bytes + displ,
                recv_counts[size_t(s)]);
  }
  comm.barrier();
}

std::vector<int64_t> exchange_counts(Communicator& comm, const std::vector<int64_t>& counts,
                                     int n) {
  const int W = comm.size();
  std::vector<int64_t> received(counts.size());
  if (auto* mpi = dynamic_cast<MpiCommunicator*>(&comm)) {
    MPI_Alltoall(counts.data(), n, MPI_INT64_T, received.data(), n, MPI_INT64_T, mpi->comm());
    return received;
  }
  const auto all = comm.all_gather(std::as_bytes(std::span(counts)));
  const auto* table = reinterpret_cast<const int64_t*>(all.data());  // [source][dest][n]
  for (int s = 0; s < W; ++s)
    std::memcpy(&received[size_t(s) * n], table + (size_t(s) * W + comm.rank()) * n,
                sizeof(int64_t) * size_t(n));
  return received;
}

}  // namespace pmoe::bench
