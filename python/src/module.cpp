// pmoe's Python module. Errors from C++ arrive as pmoe.Error (a RuntimeError) with the C++
// message; ops release the GIL, so thread ranks run in parallel.
#include <nanobind/nanobind.h>
#include <nanobind/stl/vector.h>

#include "bindings.hpp"
#include "pmoe/error.hpp"

namespace nb = nanobind;

NB_MODULE(_pmoe, m) {
  m.doc() = "pmoe: communication for Mixture-of-Experts layers split over ranks";
  // PMOE_VERSION is CMake's project(VERSION), the one version pyproject.toml reads too.
  m.attr("__version__") = PMOE_VERSION;
  // Users meet the type as pmoe.Error (tracebacks print __module__.__qualname__).
  nb::exception<pmoe::Error> error(m, "Error", PyExc_RuntimeError);
  error.attr("__module__") = "pmoe";
  // pmoe.PeerLost, a pmoe.Error that also carries the lost ranks and calls as attributes. Its
  // translator is registered after Error's, so it is tried first.
  nb::exception<pmoe::PeerLost> peer_lost(m, "PeerLost", error);
  peer_lost.attr("__module__") = "pmoe";
  nb::register_exception_translator(
      [](const std::exception_ptr& thrown, void* type) {
        try {
          std::rethrow_exception(thrown);
        } catch (const pmoe::PeerLost& e) {
          nb::object instance = nb::handle(static_cast<PyObject*>(type))(e.what());
          instance.attr("ranks") = nb::cast(e.ranks());
          instance.attr("first_call") = e.first_call();
          instance.attr("last_call") = e.last_call();
          PyErr_SetObject(static_cast<PyObject*>(type), instance.ptr());
        }
      },
      peer_lost.ptr());
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
