// One name per dimension (pmoe/shape.hpp), and the names they had before, which stay accepted for
// one release: a config that uses them builds the same op or layer as one that uses the new
// names, and one that gives both with different values is refused, naming both.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "pmoe/all_to_all.hpp"
#include "pmoe/comm.hpp"
#include "pmoe/error.hpp"
#include "pmoe/moe.hpp"
#include "reference/moe_reference.hpp"

// The point of this file is the deprecated names: their uses here must not warn.
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

namespace pmoe {
namespace {

AllToAllConfig with_new_names() {
  AllToAllConfig c;
  c.shape() = {6, 4, 2, 16};
  c.in_dtype = c.out_dtype = DType::f32;
  return c;
}

AllToAllConfig with_old_names() {
  AllToAllConfig c = with_new_names();
  c.max_tokens = c.top_k = 0;
  c.max_num_tokens = 6;
  c.experts_per_token = 2;
  return c;
}

TEST(MoeShape, AnAllToAllConfigIsItsShape) {
  const AllToAllConfig c = with_new_names();
  EXPECT_EQ(c.shape(), (MoeShape{6, 4, 2, 16}));
  MoeConfig layer;
  layer.hidden_dim = 16, layer.ffn_dim = 8, layer.num_experts = 4, layer.top_k = 2;
  EXPECT_EQ(layer.shape(6), c.shape());  // what an EpMoe of this layer hands its exchange
}

TEST(MoeShape, TheOldAllToAllNamesBuildTheSameOp) {
  std::vector<MoeShape> kept(2);
  std::vector<size_t> workspace(2), workspace_new(2);
  run_ranks(2, [&](Communicator& comm) {
    AllToAll old_names(comm, with_old_names());
    AllToAll new_names(comm, with_new_names());
    const auto r = size_t(comm.rank());
    kept[r] = old_names.config().shape();
    EXPECT_EQ(old_names.config().max_num_tokens, 0);  // moved to max_tokens, not kept twice
    EXPECT_EQ(old_names.config().experts_per_token, 0);
    workspace[r] = old_names.workspace_bytes();
    workspace_new[r] = new_names.workspace_bytes();
  });
  for (size_t r = 0; r < 2; ++r) {
    EXPECT_EQ(kept[r], with_new_names().shape()) << "rank " << r;
    EXPECT_EQ(workspace[r], workspace_new[r]) << "rank " << r;
  }
  EXPECT_NO_THROW(with_old_names().validate(2));
  EXPECT_EQ(with_old_names().with_current_names().shape(), with_new_names().shape());
}

// A rank that gives an old name and one that gives the new name with the same value agree.
TEST(MoeShape, RanksMayMixOldAndNewNames) {
  std::vector<std::string> errors(2);
  run_ranks(2, [&](Communicator& comm) {
    try {
      AllToAll a2a(comm, comm.rank() == 0 ? with_old_names() : with_new_names());
    } catch (const Error& e) {
      errors[size_t(comm.rank())] = e.what();
    }
  });
  EXPECT_EQ(errors, std::vector<std::string>(2));
}

TEST(MoeShape, AnOldNameThatDisagreesIsRefused) {
  AllToAllConfig c = with_new_names();
  c.max_num_tokens = 7;
  try {
    c.validate(2);
    ADD_FAILURE() << "max_tokens 6 with max_num_tokens 7 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("max_tokens = 6 and its deprecated alias max_num_tokens "
                                         "= 7 disagree"), std::string::npos) << e.what();
  }
  c = with_new_names();
  c.experts_per_token = 3;
  EXPECT_THROW(c.validate(2), Error);
  // Through the op, on every rank, before anything is allocated.
  std::vector<std::string> errors(2);
  run_ranks(2, [&](Communicator& comm) {
    try {
      AllToAll a2a(comm, c);
    } catch (const Error& e) {
      errors[size_t(comm.rank())] = e.what();
    }
  });
  for (const std::string& e : errors) EXPECT_NE(e.find("experts_per_token = 3"), std::string::npos) << e;
}

// feature_dim, hidden_dim's old name, builds the same layer: the same weights, the same output.
TEST(MoeShape, TheOldMoeNameBuildsTheSameLayer) {
  MoeConfig now;
  now.hidden_dim = 12, now.ffn_dim = 16, now.num_experts = 4, now.top_k = 2, now.seed = 3;
  MoeConfig old = now;
  old.hidden_dim = 0;
  old.feature_dim = 12;
  const int tokens = 5;
  EXPECT_EQ(old.out_dim(), 12);  // what a caller sizes y by, before any layer folds the names
  EXPECT_EQ(old.shape(tokens), now.shape(tokens));
  const Buffer x = reference::make_moe_input(now, tokens, 1);
  Buffer y_now(DType::f32, {tokens, now.out_dim()}), y_old(DType::f32, {tokens, now.out_dim()});
  SimpleMoe(now, tokens).forward(x, y_now);
  SimpleMoe layer(old, tokens);
  EXPECT_EQ(layer.config().hidden_dim, 12);
  layer.forward(x, y_old);
  EXPECT_EQ(std::memcmp(y_now.data<float>(), y_old.data<float>(), y_now.nbytes()), 0);
  EXPECT_EQ(moe_weight(old, MoeTensor::w1, 1, 11, 3), moe_weight(now, MoeTensor::w1, 1, 11, 3));
  old.hidden_dim = 13;
  EXPECT_THROW(old.validate(), Error);
  EXPECT_THROW(SimpleMoe layer_of_both(old, tokens), Error);
}

}  // namespace
}  // namespace pmoe
