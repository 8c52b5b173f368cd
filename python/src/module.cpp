// pmoe's Python module. Errors from C++ arrive as pmoe.Error (a RuntimeError) with the C++
// message; ops release the GIL, so thread ranks run in parallel.
#include <nanobind/nanobind.h>

#include "bindings.hpp"
#include "pmoe/error.hpp"

namespace nb = nanobind;

NB_MODULE(_pmoe, m) {
  m.doc() = "pmoe: communication for Mixture-of-Experts layers split over ranks";
  nb::exception<pmoe::Error>(m, "Error", PyExc_RuntimeError);
  pmoe::python::bind_comm(m);
  pmoe::python::bind_buffers(m);
  pmoe::python::bind_all_to_all(m);
  pmoe::python::bind_moe(m);
  pmoe::python::bind_overlap(m);
  pmoe::python::bind_socket(m);
}
