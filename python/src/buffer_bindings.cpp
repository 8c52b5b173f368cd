// Arrays in pmoe's own memory, for callers without a framework that allocates on the device (and
// for the emulated CUDA device, whose memory no framework knows): pmoe.zeros and pmoe.copy.
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>
#include <nanobind/stl/shared_ptr.h>

#include <array>
#include <memory>

#include "bindings.hpp"
#include "pmoe/error.hpp"
#include "tensor_interop.hpp"

namespace pmoe::python {

namespace {

nb::dlpack::dtype dlpack_dtype(DType t) {
  using Code = nb::dlpack::dtype_code;
  switch (t) {
    case DType::f32: return {uint8_t(Code::Float), 32, 1};
    case DType::f16: return {uint8_t(Code::Float), 16, 1};
    case DType::bf16: return {uint8_t(Code::Bfloat), 16, 1};
    case DType::f8e4m3: return {uint8_t(Code::Float8_E4M3FN), 8, 1};
    case DType::i32: return {uint8_t(Code::Int), 32, 1};
    case DType::i64: return {uint8_t(Code::Int), 64, 1};
  }
  return {};
}

// A pmoe Buffer seen from Python through DLPack (__dlpack__, __dlpack_device__), so that every
// pmoe op, and NumPy or torch where the device allows, can take it.
class Array {
 public:
  Array(const std::vector<int64_t>& shape, const std::string& dtype, const std::string& device) {
    PMOE_CHECK(shape.size() <= size_t(Tensor::kMaxDims), "zeros: at most ", Tensor::kMaxDims,
               " dimensions, got ", shape.size());
    for (int64_t n : shape) PMOE_CHECK(n >= 0, "zeros: a negative size in the shape (", n, ")");
    std::array<int64_t, Tensor::kMaxDims> strides{};
    const Tensor probe(nullptr, parse_dtype(dtype), int(shape.size()), shape.data(), strides.data());
    buffer_ = std::make_shared<Buffer>(Buffer::like(probe, parse_device(device)));
  }

  nb::ndarray<> dlpack() const {
    const Tensor t = buffer_->tensor();
    std::array<size_t, Tensor::kMaxDims> sizes{};
    std::array<int64_t, Tensor::kMaxDims> strides{};
    for (int d = 0; d < t.dim(); ++d) {
      sizes[size_t(d)] = size_t(t.size(d));
      strides[size_t(d)] = t.stride(d);
    }
    // The capsule keeps the memory alive as long as any consumer holds it.
    auto* keep = new std::shared_ptr<Buffer>(buffer_);
    nb::capsule owner(keep, [](void* p) noexcept { delete static_cast<std::shared_ptr<Buffer>*>(p); });
    return nb::ndarray<>(t.data(), size_t(t.dim()), sizes.data(), owner, strides.data(),
                         dlpack_dtype(t.dtype()), device_type(), t.device().index);
  }
  int device_type() const {
    return buffer_->tensor().device().kind == Device::Kind::cuda ? int(nb::device::cuda::value)
                                                                 : int(nb::device::cpu::value);
  }
  int device_index() const { return buffer_->tensor().device().index; }
  std::vector<int64_t> shape() const {
    const Tensor t = buffer_->tensor();
    std::vector<int64_t> out;
    for (int d = 0; d < t.dim(); ++d) out.push_back(t.size(d));
    return out;
  }
  std::string dtype() const { return std::string(dtype_name(buffer_->tensor().dtype())); }
  std::string device() const { return buffer_->tensor().device().str(); }

 private:
  std::shared_ptr<Buffer> buffer_;
};

}  // namespace

void bind_buffers(nb::module_& m) {
  nb::class_<Array>(m, "Array",
                    "An array in pmoe's own memory (pmoe.zeros), passed to ops through DLPack.")
      .def("__dlpack__", [](const Array& a, nb::handle /*stream*/) { return a.dlpack(); },
           nb::arg("stream") = nb::none())
      .def("__dlpack_device__", [](const Array& a) {
        return nb::make_tuple(a.device_type(), a.device_index());
      })
      .def_prop_ro("shape", &Array::shape)
      .def_prop_ro("dtype", &Array::dtype)
      .def_prop_ro("device", &Array::device);
  m.def(
      "zeros",
      [](const std::vector<int64_t>& shape, const std::string& dtype, const std::string& device) {
        return Array(shape, dtype, device);
      },
      nb::arg("shape"), nb::arg("dtype") = "f32", nb::arg("device") = "cpu",
      "A zero-filled pmoe.Array on `device` ('cpu' or 'cuda:N'), usable wherever pmoe takes an "
      "array. dtype: f32, f16, bf16, f8e4m3 or i32.");
  m.def(
      "copy",
      [](const nb::ndarray<>& dst, const nb::ndarray<>& src) {
        const Tensor d = to_tensor(dst, "dst"), s = to_tensor(src, "src");
        nb::gil_scoped_release release;
        copy(d, s);
      },
      nb::arg("dst"), nb::arg("src"),
      "Copies src into dst (same dtype and shape, contiguous), between the CPU and a CUDA "
      "device in either direction. Returns when the copy is done.");
}

}  // namespace pmoe::python
