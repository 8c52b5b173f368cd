#include "tensor_interop.hpp"

#include <nanobind/stl/string.h>

#include <array>
#include <string>

#include "pmoe/error.hpp"

namespace pmoe::python {
namespace {

// "float64", "uint32", "bool": what NumPy and PyTorch would call a DLPack dtype.
std::string array_dtype_words(nb::dlpack::dtype t) {
  using Code = nb::dlpack::dtype_code;
  const char* kind = "";
  switch (Code(t.code)) {
    case Code::Int: kind = "int"; break;
    case Code::UInt: kind = "uint"; break;
    case Code::Float: kind = "float"; break;
    case Code::Bfloat: kind = "bfloat"; break;
    case Code::Complex: kind = "complex"; break;
    case Code::Bool: return "bool";
    default: return detail::cat("dtype code ", int(t.code), " (", int(t.bits), " bits)");
  }
  return detail::cat(kind, int(t.bits));
}

DType to_dtype(nb::dlpack::dtype t, const char* name) {
  using Code = nb::dlpack::dtype_code;
  const auto code = Code(t.code);
  PMOE_CHECK(t.lanes == 1, "`", name, "`: vector dtypes are not supported");
  if (code == Code::Float && t.bits == 32) return DType::f32;
  if (code == Code::Float && t.bits == 16) return DType::f16;
  if (code == Code::Bfloat && t.bits == 16) return DType::bf16;
  if (code == Code::Float8_E4M3FN && t.bits == 8) return DType::f8e4m3;
  if (code == Code::Int && t.bits == 32) return DType::i32;
  if (code == Code::Int && t.bits == 64) return DType::i64;
  if (code == Code::UInt && t.bits == 16) return DType::bf16;   // bf16 bits (NumPy)
  if (code == Code::UInt && t.bits == 8) return DType::f8e4m3;  // f8e4m3 bits (NumPy)
  throw Error(detail::cat("`", name, "`: pmoe takes no ", array_dtype_words(t),
                          " arrays; pass float32, float16, bfloat16 (or uint16 bits), "
                          "float8_e4m3fn (or uint8 bits), or int32 / int64 for indices"));
}

Device to_device(int type, int id, const char* name) {
  if (type == nb::device::cpu::value) return Device::cpu();
  if (type == nb::device::cuda::value) return Device::cuda(id);
  throw Error(detail::cat("`", name, "`: arrays on DLPack device type ", type,
                          " are not supported; use CPU or CUDA arrays"));
}

}  // namespace

Device parse_device(const std::string& text) {
  if (text == "cpu") return Device::cpu();
  if (text == "cuda") return Device::cuda(0);
  if (text.rfind("cuda:", 0) == 0 && text.size() > 5 &&
      text.find_first_not_of("0123456789", 5) == std::string::npos)
    return Device::cuda(std::stoi(text.substr(5)));
  throw Error("device must be 'cpu' or 'cuda:N', got '" + text + "'");
}

Tensor to_tensor(const nb::ndarray<>& array, const char* name) {
  const int ndim = int(array.ndim());
  PMOE_CHECK(ndim <= Tensor::kMaxDims, "`", name, "`: at most ", Tensor::kMaxDims,
             " dimensions, got ", ndim);
  std::array<int64_t, Tensor::kMaxDims> shape{}, strides{};
  for (int d = 0; d < ndim; ++d) {
    shape[size_t(d)] = int64_t(array.shape(size_t(d)));
    strides[size_t(d)] = array.stride(size_t(d));
  }
  return Tensor(const_cast<void*>(array.data()), to_dtype(array.dtype(), name), ndim,
                shape.data(), strides.data(),
                to_device(array.device_type(), array.device_id(), name));
}

Tensor to_tensor(nb::handle object, const char* name) {
  PMOE_CHECK(!nb::hasattr(object, "requires_grad") || !nb::cast<bool>(object.attr("requires_grad")),
             "`", name, "` requires grad: pmoe's ops record no gradients; pass ", name,
             ".detach(), or use pmoe.torch.dispatch / combine, which do");
  nb::ndarray<> array;
  bool is_array = false;
  try {
    is_array = nb::try_cast(object, array);
  } catch (const std::exception&) {
  }
  if (is_array) return to_tensor(array, name);
  // __dlpack__ itself may have refused (a torch tensor on "meta") and left its Python exception
  // set; the pmoe::Error below replaces it.
  PyErr_Clear();
  const std::string type = nb::str(object.type().attr("__name__")).c_str();
  PMOE_CHECK(!nb::hasattr(object, "__dlpack__"), "`", name, "`: this ", type,
             " refused to export itself through DLPack (a torch tensor on the meta device does); ",
             "pass a CPU or CUDA array");
  throw Error(detail::cat("`", name, "` must be an array (a torch tensor, a NumPy array or ",
                          "anything with __dlpack__), got ", type));
}

Tensor to_tensor_or_empty(const nb::handle& maybe_array, const char* name) {
  if (maybe_array.is_none()) return Tensor();
  return to_tensor(maybe_array, name);
}

nb::object to_numpy(const Tensor& t, nb::handle owner) {
  PMOE_CHECK(t.device() == Device::cpu(), "only CPU buffers can be viewed from NumPy");
  std::array<size_t, Tensor::kMaxDims> shape{};
  std::array<int64_t, Tensor::kMaxDims> strides{};
  for (int d = 0; d < t.dim(); ++d) {
    shape[size_t(d)] = size_t(t.size(d));
    strides[size_t(d)] = t.stride(d);
  }
  nb::dlpack::dtype dtype;
  switch (t.dtype()) {
    case DType::f32: dtype = nb::dtype<float>(); break;
    case DType::f16: dtype = {uint8_t(nb::dlpack::dtype_code::Float), 16, 1}; break;
    case DType::bf16: dtype = nb::dtype<uint16_t>(); break;
    case DType::f8e4m3: dtype = nb::dtype<uint8_t>(); break;
    case DType::i32: dtype = nb::dtype<int32_t>(); break;
    case DType::i64: dtype = nb::dtype<int64_t>(); break;
  }
  nb::ndarray<nb::numpy> view(t.data(), size_t(t.dim()), shape.data(), owner, strides.data(),
                              dtype);
  return nb::cast(view, nb::rv_policy::reference);
}

}  // namespace pmoe::python
