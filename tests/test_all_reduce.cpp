// The all-reduce TpMoe uses (src/cpu/all_reduce.hpp): sums in rank order with the same bits on
// every rank, at W in {1, 2, 3, 4, 8}, for lengths below, at and above W, many calls in a row.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "cpu/all_reduce.hpp"
#include "pmoe/error.hpp"
#include "reference/workload.hpp"

namespace pmoe {
namespace {

float value(int rank, int call, int64_t i) {
  return 2.0f * reference::uniform(99, uint64_t(rank), uint64_t(call), uint64_t(i)) - 1.0f;
}

TEST(AllReduce, SumsInRankOrderWithTheSameBitsEverywhere) {
  for (int W : {1, 2, 3, 4, 8}) {
    std::vector<std::string> errors(static_cast<size_t>(W));
    run_ranks(W, [&](Communicator& comm) {
      cpu::AllReduceSum reduce(comm, 1000);
      int call = 0;
      for (int64_t n : {int64_t(0), int64_t(1), int64_t(W - 1), int64_t(W), int64_t(37),
                        int64_t(1000), int64_t(5)}) {
        for (int repeat = 0; repeat < 3; ++repeat, ++call) {
          std::vector<float> data(static_cast<size_t>(n));
          for (int64_t i = 0; i < n; ++i) data[size_t(i)] = value(comm.rank(), call, i);
          reduce.run(data.data(), n, "test");
          for (int64_t i = 0; i < n; ++i) {
            float want = 0.0f;
            for (int r = 0; r < W; ++r) want += value(r, call, i);
            if (std::memcmp(&want, &data[size_t(i)], sizeof want) != 0 &&
                errors[size_t(comm.rank())].empty())
              errors[size_t(comm.rank())] = detail::cat("W=", W, " n=", n, " element ", i, ": got ",
                                                        data[size_t(i)], ", want ", want);
          }
        }
      }
    });
    for (const auto& e : errors) EXPECT_EQ(e, "");
  }
}

TEST(AllReduce, BytesSentAreTwiceTheOtherRanksShare) {
  run_ranks(4, [](Communicator& comm) {
    cpu::AllReduceSum reduce(comm, 400);
    // 400 floats over 4 ranks: 3 chunks of 100 out in the reduce-scatter, mine 3 times out.
    EXPECT_EQ(reduce.bytes_sent(400), 2 * 3 * 100 * 4);
  });
}

TEST(AllReduce, RejectsMoreThanItWasBuiltFor) {
  run_ranks(2, [](Communicator& comm) {
    cpu::AllReduceSum reduce(comm, 10);
    std::vector<float> data(11);
    try {
      reduce.run(data.data(), 11, "test op");
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("all-reduce of 11 elements, outside the 0..10"),
                std::string::npos)
          << e.what();
    }
    reduce.run(data.data(), 10, "test op");  // still usable
  });
}

TEST(AllReduce, RanksWithDifferentLengthsAreNamed) {
  std::string message;
  try {
    run_ranks(2, [](Communicator& comm) {
      cpu::AllReduceSum reduce(comm, 10);
      std::vector<float> data(10);
      reduce.run(data.data(), comm.rank() == 0 ? 10 : 8, "test op");
    });
  } catch (const Error& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("all-reduces"), std::string::npos) << message;
  EXPECT_NE(message.find("every rank must pass the same number of tokens"), std::string::npos)
      << message;
}

}  // namespace
}  // namespace pmoe
