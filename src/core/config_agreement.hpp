// Every rank of a collective object (AllToAll, the MoE layers, the overlap ops) must build it from
// the same configuration: a rank with another num_experts or hidden_dim sizes its buffers and
// offsets differently and would write past its peers' memory, or wait for messages that never
// come. ConfigAgreement checks that once, at construction, before anything is allocated:
//
//   detail::ConfigAgreement agree("AllToAll");
//   agree.field("num_experts", config.num_experts);
//   ...
//   agree.check(comm, [&] { config.validate(comm.size()); });
//
// check() runs the local validation, then exchanges every rank's field values and validation
// verdict in one all_gather. If any rank rejected its config, or any field differs, every rank
// throws the same pmoe::Error (naming the rank and its reason, or the field and each rank's
// value), so that no rank goes on to wait for a peer that has given up.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "pmoe/comm.hpp"

namespace pmoe::detail {

class ConfigAgreement {
 public:
  // How a field's value reads in an error ("bf16" rather than 2); plain integers by default.
  using Show = std::string (*)(int64_t value);

  explicit ConfigAgreement(std::string object) : object_(std::move(object)) {}

  // Fields must be declared in the same order on every rank (the same code declares them).
  void field(std::string_view name, int64_t value, Show show = nullptr);

  // `validate` throws pmoe::Error when this rank's config is unusable. Collective.
  void check(Communicator& comm, const std::function<void()>& validate) const;

  // The longest validation message sent to peers; longer ones are cut.
  static constexpr size_t kMessageBytes = 480;

 private:
  struct Field {
    std::string name;
    int64_t value;
    Show show;
  };
  std::string object_;
  std::vector<Field> fields_;
};

// Show functions for enum fields.
std::string show_dtype(int64_t value);
std::string show_bool(int64_t value);
std::string show_cross_node(int64_t value);  // CrossNode

}  // namespace pmoe::detail
