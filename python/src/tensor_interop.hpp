// The boundary between Python arrays and pmoe: any DLPack array (NumPy, PyTorch, CuPy, JAX)
// becomes a non-owning pmoe::Tensor, and the op's own buffers go back out as NumPy views.
// NumPy has no bf16 or f8 types, so uint16 and uint8 arrays carry bf16 and f8e4m3 bit patterns.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <string>

#include "pmoe/tensor.hpp"

namespace pmoe::python {

namespace nb = nanobind;

// A view of `array`; throws pmoe::Error naming `name` for a dtype or device pmoe has no use for.
Tensor to_tensor(const nb::ndarray<>& array, const char* name);

// Any Python object: a DLPack array as above; anything else (a list, a torch tensor that requires
// grad, which torch refuses to export) raises pmoe::Error saying what to pass instead.
Tensor to_tensor(nb::handle object, const char* name);

// The same for an optional argument: None becomes the empty Tensor.
Tensor to_tensor_or_empty(const nb::handle& maybe_array, const char* name);

// "cpu" or "cuda:N" (or "cuda", meaning cuda:0); throws pmoe::Error otherwise.
Device parse_device(const std::string& text);

// A NumPy array viewing `t` (CPU memory), kept alive by `owner`.
nb::object to_numpy(const Tensor& t, nb::handle owner);

}  // namespace pmoe::python
