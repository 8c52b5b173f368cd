// The plain consumer (tests/consumer/run.sh): two thread ranks sum a value through pmoe, built
// against an installed pmoe by a project that asks for nothing but find_package(pmoe).
#include <pmoe/pmoe.hpp>

#include <atomic>
#include <cstdio>

int main() {
  std::atomic<int> ranks_seen{0};
  pmoe::run_ranks(2, [&](pmoe::Communicator& comm) {
    comm.barrier();
    ranks_seen += comm.rank() + 1;
  });
  if (ranks_seen != 3) {
    std::fprintf(stderr, "consumer: expected ranks 0 and 1, saw a sum of %d\n", ranks_seen.load());
    return 1;
  }
  std::printf("consumer: pmoe::run_ranks ran 2 ranks\n");
  return 0;
}
