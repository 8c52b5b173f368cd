// One function per concept adds its classes and functions to the module.
#pragma once

#include <nanobind/nanobind.h>

#include <optional>
#include <string>
#include <vector>

#include "pmoe/error.hpp"
#include "pmoe/placement.hpp"

namespace pmoe::python {

// A RankMask's live ranks as Python booleans (AllToAll's and EpMoe's live_ranks).
inline std::vector<bool> live_flags(const RankMask& mask) {
  return std::vector<bool>(mask.live.begin(), mask.live.end());
}

// The keyword arguments AllToAll and EpMoe share: masked_experts ('drop', 'renormalize') and
// on_peer_loss ('fail', 'mask'); `op` names the class in the error.
inline MaskedExperts parse_masked_experts(const char* op, const std::string& name) {
  if (name == "drop") return MaskedExperts::drop;
  if (name == "renormalize") return MaskedExperts::renormalize;
  throw Error(std::string(op) + ": masked_experts must be 'drop' or 'renormalize', got '" + name +
              "'");
}
inline OnPeerLoss parse_on_peer_loss(const char* op, const std::string& name) {
  if (name == "fail") return OnPeerLoss::fail;
  if (name == "mask") return OnPeerLoss::mask;
  throw Error(std::string(op) + ": on_peer_loss must be 'fail' or 'mask', got '" + name + "'");
}

// A dimension given under its MoeShape name or, for one release, under the name it had before
// (which warns with a DeprecationWarning naming the new one). One of the two must be given, and
// both only with the same value (TypeError where neither is, as Python's own). `op` names the
// class in the error.
inline int renamed_arg(const char* op, const char* name, std::optional<int> value,
                       const char* old_name, std::optional<int> old_value) {
  if (old_value) {
    const std::string warning =
        std::string(op) + ": " + old_name + " is deprecated; pass " + name + " instead";
    if (PyErr_WarnEx(PyExc_DeprecationWarning, warning.c_str(), 1) != 0)
      throw nanobind::python_error();
    PMOE_CHECK(!value || *value == *old_value, op, ": ", name, " = ", *value, " and ", old_name,
               " = ", *old_value, " (its deprecated name) disagree; pass ", name, " only");
    return *old_value;
  }
  if (!value)  // as Python reports a missing keyword-only argument
    throw nanobind::type_error((std::string(op) + ": missing the argument " + name).c_str());
  return *value;
}

// What a deprecated attribute says when it is read: a DeprecationWarning naming the new one.
inline void warn_renamed(const char* op, const char* old_name, const char* name) {
  const std::string warning =
      std::string(op) + "." + old_name + " is deprecated; read " + op + "." + name + " instead";
  if (PyErr_WarnEx(PyExc_DeprecationWarning, warning.c_str(), 1) != 0)
    throw nanobind::python_error();
}

void bind_comm(nanobind::module_& m);
void bind_buffers(nanobind::module_& m);
void bind_all_to_all(nanobind::module_& m);
void bind_moe(nanobind::module_& m);
void bind_overlap(nanobind::module_& m);
void bind_socket(nanobind::module_& m);

}  // namespace pmoe::python
