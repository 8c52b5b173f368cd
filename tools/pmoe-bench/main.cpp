// pmoe-bench: one command for pmoe's measurements. Ranks are threads of this process by default
// (--ranks); under mpirun they are the MPI processes. Every configuration is checked against the
// plain reference before it is timed, and a wrong result exits non-zero.
#include <mpi.h>

#include <cstdio>
#include <exception>

#include "bench_common.hpp"
#include "subcommands.hpp"

int main(int argc, char** argv) {
  const bool mpi = pmoe::bench::launched_by_mpi();
  if (mpi) {
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  }
  CLI::App app{"pmoe-bench: MoE communication benchmarks (see README.md)"};
  app.require_subcommand(1);
  pmoe::bench::add_all_to_all_command(app);
  pmoe::bench::add_moe_command(app);
  pmoe::bench::add_all_command(app);
  pmoe::bench::add_overlap_commands(app);
  pmoe::bench::add_model_command(app);
  int code = 0;
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    code = app.exit(e);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pmoe-bench: %s\n", e.what());
    code = 1;
  }
  if (mpi) {
    int any = 0;
    MPI_Allreduce(&code, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    MPI_Finalize();
    code = any;
  }
  return code;
}
