// One function per concept adds its classes and functions to the module.
#pragma once

#include <nanobind/nanobind.h>

namespace pmoe::python {

void bind_comm(nanobind::module_& m);
void bind_buffers(nanobind::module_& m);
void bind_all_to_all(nanobind::module_& m);
void bind_moe(nanobind::module_& m);
void bind_overlap(nanobind::module_& m);
void bind_socket(nanobind::module_& m);

}  // namespace pmoe::python
