// Tensor: a non-owning view (pointer, dtype, device, up to 4 dims, strides in elements).
// Buffer: owning memory for tools and tests, 64-byte aligned on the CPU, handing out Tensors.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>

#include "pmoe/dtype.hpp"

namespace pmoe {

struct Device {
  enum class Kind : uint8_t { cpu, cuda };
  Kind kind = Kind::cpu;
  int index = 0;

  static constexpr Device cpu() { return {Kind::cpu, 0}; }
  static constexpr Device cuda(int index = 0) { return {Kind::cuda, index}; }
  bool operator==(const Device&) const = default;
  std::string str() const;  // "cpu" or "cuda:N"
};

class Tensor {
 public:
  static constexpr int kMaxDims = 4;

  Tensor() = default;  // the empty tensor: no data, no dims; stands for an absent argument
  // A row-major contiguous view of `shape` at `data`.
  Tensor(void* data, DType dtype, std::initializer_list<int64_t> shape, Device device = Device::cpu());
  // A view with explicit strides (in elements), for callers that hold strided data.
  Tensor(void* data, DType dtype, int ndim, const int64_t* shape, const int64_t* strides,
         Device device = Device::cpu());

  void* data() const { return data_; }
  template <typename T> T* data() const { return static_cast<T*>(data_); }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  int dim() const { return ndim_; }
  int64_t size(int d) const { return shape_[d]; }
  int64_t stride(int d) const { return strides_[d]; }
  int64_t numel() const;
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype_); }
  bool empty() const { return ndim_ == 0 && data_ == nullptr; }
  bool is_contiguous() const;  // row-major, no gaps
  std::string shape_str() const;  // "[4, 7168]"

 private:
  void* data_ = nullptr;
  DType dtype_ = DType::f32;
  Device device_ = Device::cpu();
  int ndim_ = 0;
  std::array<int64_t, kMaxDims> shape_{};
  std::array<int64_t, kMaxDims> strides_{};
};

// Owning memory, zero-filled, for tools, tests and examples: 64-byte aligned on the CPU,
// cudaMalloc'd on a CUDA device (throws pmoe::Error where the build or machine has no CUDA).
class Buffer {
 public:
  Buffer() = default;
  Buffer(DType dtype, std::initializer_list<int64_t> shape, Device device = Device::cpu());
  // A zeroed buffer of t's dtype and shape on `device`.
  static Buffer like(const Tensor& t, Device device);

  Tensor tensor() const { return tensor_; }
  operator Tensor() const { return tensor_; }  // NOLINT: a Buffer is used where a view is wanted
  template <typename T> T* data() const { return tensor_.data<T>(); }
  size_t nbytes() const { return tensor_.nbytes(); }

 private:
  struct Free {
    Device device;
    void operator()(void* p) const;
  };
  void allocate(DType dtype, int ndim, const int64_t* shape, Device device);

  std::unique_ptr<void, Free> storage_{nullptr, Free{Device::cpu()}};
  Tensor tensor_;
};

// Copies src into dst, which must have the same dtype and shape and both be contiguous; either
// may be on the CPU or a CUDA device. Blocking. Throws pmoe::Error on a mismatch.
void copy(const Tensor& dst, const Tensor& src);

// Allocates `bytes` (rounded up to 64) zero-filled and 64-byte aligned; never returns null.
void* aligned_alloc_zeroed(size_t bytes);
void aligned_free(void* p);

}  // namespace pmoe
