// pmoe's Python module. Errors from C++ arrive as pmoe.Error (a RuntimeError) with the C++
// message; ops release the GIL, so thread ranks run in parallel.
#include <nanobind/nanobind.h>

#include "bindings.hpp"
#include "pmoe/error.hpp"

namespace nb = nanobind;

NB_MODULE(_pmoe, m) {
  m.doc() = "pmoe: communication for Mixture-of-Experts layers split over ranks";
  // PMOE_VERSION is CMake's project(VERSION), the one version pyproject.toml reads too.
  m.attr("__version__") = PMOE_VERSION;
  // Users meet the type as pmoe.Error (tracebacks print __module__.__qualname__).
  nb::exception<pmoe::Error>(m, "Error", PyExc_RuntimeError).attr("__module__") = "pmoe";
  // Objects still alive when the interpreter exits (kept in globals, or in cycles through
  // torch's autograd graph that Python's last collections leave) are not leaks a user can fix,
  // yet nanobind would print about 25 lines per process for them. What they hold goes back to
  // the system at exit: file descriptors, mappings and thread stacks, and shared-memory names
  // are unlinked as soon as the peers have mapped them. The flag is this module's own: _pmoe is
  // built in its own nanobind domain (python/CMakeLists.txt).
  nb::set_leak_warnings(false);
  pmoe::python::bind_comm(m);
  pmoe::python::bind_buffers(m);
  pmoe::python::bind_all_to_all(m);
  pmoe::python::bind_moe(m);
  pmoe::python::bind_overlap(m);
  pmoe::python::bind_socket(m);
}
