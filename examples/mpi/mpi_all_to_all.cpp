// Dispatch and combine with ranks as MPI processes: `mpirun -n 2 ./mpi_all_to_all`.
//
// The order that matters: MPI_Init, then the MpiCommunicator (collective), then every pmoe object
// built on it; they are destroyed before the communicator, and the communicator before
// MPI_Finalize (here: the scope closes first). pmoe throws pmoe::Error on bad input and on a peer
// that does not arrive in time; nothing in it calls exit or abort.
#include <mpi.h>
#include <pmoe/mpi_communicator.hpp>
#include <pmoe/pmoe.hpp>

#include <cstdio>
#include <cstring>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int status = 0;
  {
    pmoe::MpiCommunicator comm(MPI_COMM_WORLD);
    const int W = comm.size(), m = 16, H = 256, k = 2, E = 4 * W, E_local = E / W;

    pmoe::AllToAllConfig cfg;
    cfg.max_tokens = m;
    cfg.num_experts = E;
    cfg.top_k = k;
    cfg.hidden_dim = H;
    cfg.in_dtype = pmoe::DType::f32;
    cfg.out_dtype = pmoe::DType::f32;
    pmoe::AllToAll a2a(comm, cfg);  // every rank passes the same config, or every rank throws

    pmoe::Buffer x(pmoe::DType::f32, {m, H}), y(pmoe::DType::f32, {m, H});
    pmoe::Buffer indices(pmoe::DType::i32, {m, k}), weights(pmoe::DType::f32, {m, k});
    pmoe::Buffer counts(pmoe::DType::i32, {E_local});
    pmoe::Buffer expert_x(pmoe::DType::f32, {E_local, int64_t(W) * m, H});
    pmoe::Buffer expert_y(pmoe::DType::f32, {E_local, int64_t(W) * m, H});
    for (int t = 0; t < m; ++t) {
      for (int h = 0; h < H; ++h) x.data<float>()[t * H + h] = float(comm.rank() * 1000 + t);
      for (int j = 0; j < k; ++j) {  // token t goes to experts t and t + E/2 (two ranks apart)
        indices.data<int32_t>()[t * k + j] = (t + j * E / 2) % E;
        weights.data<float>()[t * k + j] = 0.5f;
      }
    }

    a2a.dispatch(x, pmoe::Tensor(), indices, counts, expert_x, pmoe::Tensor());
    // Identity "experts": expert_y = expert_x, so combine gives back 0.5 x + 0.5 x = x.
    std::memcpy(expert_y.data<void>(), expert_x.data<void>(), expert_x.nbytes());
    a2a.combine(expert_y, indices, weights, y);

    for (int i = 0; i < m * H; ++i)
      if (y.data<float>()[i] != x.data<float>()[i]) status = 1;
    int received = 0;
    for (int e = 0; e < E_local; ++e) received += counts.data<int32_t>()[e];
    std::printf("rank %d of %d: %d expert rows received, round trip %s\n", comm.rank(), W,
                received, status ? "WRONG" : "ok");
  }
  MPI_Finalize();
  return status;
}
