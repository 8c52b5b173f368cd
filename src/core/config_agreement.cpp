#include "core/config_agreement.hpp"

#include <algorithm>
#include <cstring>
#include <map>

#include "pmoe/dtype.hpp"
#include "pmoe/error.hpp"

namespace pmoe::detail {
namespace {

// One rank's record on the wire: [verdict int64][fields int64 x n][message bytes].
size_t record_bytes(size_t fields) {
  return sizeof(int64_t) * (1 + fields) + ConfigAgreement::kMessageBytes;
}

// "16 on ranks 0, 2; 32 on rank 1": each distinct value once, with the ranks that gave it.
std::string who_has_what(const std::vector<int64_t>& values, ConfigAgreement::Show show) {
  std::map<int64_t, std::vector<int>> ranks_of;
  for (int r = 0; r < int(values.size()); ++r) ranks_of[values[size_t(r)]].push_back(r);
  std::string text;
  for (const auto& [value, ranks] : ranks_of) {
    if (!text.empty()) text += "; ";
    text += show ? show(value) : std::to_string(value);
    text += ranks.size() == 1 ? " on rank " : " on ranks ";
    for (size_t i = 0; i < ranks.size(); ++i) text += (i ? ", " : "") + std::to_string(ranks[i]);
  }
  return text;
}

}  // namespace

void ConfigAgreement::field(std::string_view name, int64_t value, Show show) {
  fields_.push_back({std::string(name), value, show});
}

void ConfigAgreement::check(Communicator& comm, const std::function<void()>& validate) const {
  std::string rejection;
  try {
    validate();
  } catch (const Error& e) {
    rejection = e.what();
  }

  const size_t n = fields_.size(), bytes = record_bytes(n);
  std::vector<std::byte> mine(bytes);
  const int64_t verdict = rejection.empty() ? 0 : 1;
  std::memcpy(mine.data(), &verdict, sizeof verdict);
  for (size_t i = 0; i < n; ++i)
    std::memcpy(mine.data() + sizeof(int64_t) * (1 + i), &fields_[i].value, sizeof(int64_t));
  std::memcpy(mine.data() + sizeof(int64_t) * (1 + n), rejection.data(),
              std::min(rejection.size(), kMessageBytes));

  // A rank that rejected its config still takes part, so that its peers hear why instead of
  // waiting for it.
  const std::vector<std::byte> all = comm.all_gather(mine);
  const int W = comm.size(), rank = comm.rank();
  auto record = [&](int r) { return all.data() + size_t(r) * bytes; };

  if (!rejection.empty()) throw Error(rejection);
  for (int r = 0; r < W; ++r) {
    int64_t theirs;
    std::memcpy(&theirs, record(r), sizeof theirs);
    if (theirs == 0) continue;
    const char* text = reinterpret_cast<const char*>(record(r) + sizeof(int64_t) * (1 + n));
    throw Error(cat(object_, " on rank ", rank, ": rank ", r, " rejected its config (",
                    std::string(text, strnlen(text, kMessageBytes)),
                    "), so no rank can build this ", object_));
  }

  for (size_t i = 0; i < n; ++i) {
    std::vector<int64_t> values(static_cast<size_t>(W));
    for (int r = 0; r < W; ++r)
      std::memcpy(&values[size_t(r)], record(r) + sizeof(int64_t) * (1 + i), sizeof(int64_t));
    if (std::all_of(values.begin(), values.end(), [&](int64_t v) { return v == values[0]; }))
      continue;
    throw Error(cat(object_, " on rank ", rank, ": the ranks' configs differ in ",
                    fields_[i].name, " (", who_has_what(values, fields_[i].show),
                    "); every rank must build it with the same config"));
  }
}

std::string show_dtype(int64_t value) { return std::string(dtype_name(DType(value))); }
std::string show_bool(int64_t value) { return value ? "true" : "false"; }
std::string show_cross_node(int64_t value) {
  return value == 0 ? "direct" : value == 1 ? "hierarchical" : std::to_string(value);
}

}  // namespace pmoe::detail
