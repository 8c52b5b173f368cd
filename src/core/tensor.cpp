#include "pmoe/tensor.hpp"

#include <cstdlib>
#include <cstring>
#include <new>

#include "core/memory_counters.hpp"
#include "pmoe/error.hpp"

namespace pmoe {

std::string Device::str() const {
  return kind == Kind::cpu ? std::string("cpu") : detail::cat("cuda:", index);
}

Tensor::Tensor(void* data, DType dtype, std::initializer_list<int64_t> shape, Device device)
    : data_(data), dtype_(dtype), device_(device), ndim_(int(shape.size())) {
  PMOE_CHECK(ndim_ <= kMaxDims, "Tensor: at most ", kMaxDims, " dims, got ", ndim_);
  int d = 0;
  for (int64_t extent : shape) {
    PMOE_CHECK(extent >= 0, "Tensor: negative extent ", extent, " in dim ", d);
    shape_[d++] = extent;
  }
  int64_t stride = 1;
  for (d = ndim_ - 1; d >= 0; --d) {
    strides_[d] = stride;
    stride *= shape_[d];
  }
}

Tensor::Tensor(void* data, DType dtype, int ndim, const int64_t* shape, const int64_t* strides,
               Device device)
    : data_(data), dtype_(dtype), device_(device), ndim_(ndim) {
  PMOE_CHECK(ndim >= 0 && ndim <= kMaxDims, "Tensor: 0..", kMaxDims, " dims, got ", ndim);
  for (int d = 0; d < ndim; ++d) {
    PMOE_CHECK(shape[d] >= 0, "Tensor: negative extent ", shape[d], " in dim ", d);
    shape_[d] = shape[d];
    strides_[d] = strides[d];
  }
}

int64_t Tensor::numel() const {
  if (ndim_ == 0) return data_ ? 1 : 0;
  int64_t n = 1;
  for (int d = 0; d < ndim_; ++d) n *= shape_[d];
  return n;
}

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  for (int d = ndim_ - 1; d >= 0; --d) {
    if (shape_[d] != 1 && strides_[d] != expected) return false;
    expected *= shape_[d];
  }
  return true;
}

std::string Tensor::shape_str() const {
  std::string s = "[";
  for (int d = 0; d < ndim_; ++d) s += (d ? ", " : "") + std::to_string(shape_[d]);
  return s + "]";
}

// Each block carries a 64-byte header in front of it holding its size, so that aligned_free can
// count the bytes back out (pmoe/memory.hpp). The header keeps the data 64-byte aligned.
namespace {
constexpr size_t kHeaderBytes = 64;
}  // namespace

void* aligned_alloc_zeroed(size_t bytes) {
  const size_t rounded = bytes ? (bytes + 63) / 64 * 64 : 64;
  auto* block = static_cast<std::byte*>(std::aligned_alloc(64, kHeaderBytes + rounded));
  if (!block) throw std::bad_alloc();
  std::memcpy(block, &rounded, sizeof rounded);
  std::memset(block + kHeaderBytes, 0, rounded);
  detail::count_alloc(int64_t(rounded));
  return block + kHeaderBytes;
}

void aligned_free(void* p) {
  if (!p) return;
  std::byte* block = static_cast<std::byte*>(p) - kHeaderBytes;
  size_t rounded;
  std::memcpy(&rounded, block, sizeof rounded);
  detail::count_free(int64_t(rounded));
  std::free(block);
}

void Buffer::Free::operator()(void* p) const { aligned_free(p); }

Buffer::Buffer(DType dtype, std::initializer_list<int64_t> shape) {
  Tensor probe(nullptr, dtype, shape);
  storage_.reset(aligned_alloc_zeroed(probe.nbytes()));
  tensor_ = Tensor(storage_.get(), dtype, shape);
}

}  // namespace pmoe
