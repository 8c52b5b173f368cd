#include "pmoe/tensor.hpp"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <new>

#include "core/device_runtime.hpp"
#include "core/memory_counters.hpp"
#include "pmoe/error.hpp"

namespace pmoe {

namespace {

// numel() and nbytes() must not overflow: extents whose element or byte count exceeds int64 (a
// hostile or corrupt DLPack shape) are refused when the view is made.
void check_element_count(int ndim, const int64_t* shape, DType dtype) {
  // In numel()'s order: a partial product that overflows is refused even if a later extent is 0.
  int64_t count = 1;
  for (int d = 0; d < ndim && count >= 0; ++d)
    if (__builtin_mul_overflow(count, shape[d], &count)) count = -1;
  int64_t bytes = 0;
  if (count < 0 || __builtin_mul_overflow(count, int64_t(dtype_size(dtype)), &bytes)) {
    std::string extents;
    for (int d = 0; d < ndim; ++d) extents += (d ? ", " : "") + std::to_string(shape[d]);
    throw Error(detail::cat("Tensor: shape [", extents, "] of ", dtype_name(dtype),
                            " has more bytes than a 64-bit count holds"));
  }
}

}  // namespace

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
  check_element_count(ndim_, shape_.data(), dtype_);
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
  check_element_count(ndim, shape_.data(), dtype_);
}

int64_t Tensor::numel() const {
  if (ndim_ == 0) return data_ ? 1 : 0;
  int64_t n = 1;
  for (int d = 0; d < ndim_; ++d) n *= shape_[d];
  return n;
}

bool Tensor::is_contiguous() const {
  if (numel() == 0 && ndim_ > 0) return true;  // no element to be out of place (any strides)
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
//
// Blocks of 2 MiB and more start on a 2 MiB boundary and ask for transparent huge pages: the
// ops read rows scattered over buffers of hundreds of MB (expert rows, symmetric regions), and
// with 4 KiB pages the TLB misses cost 15-25% of combine's reduction on this machine.
namespace {
constexpr size_t kHeaderBytes = 64;
constexpr size_t kHugePage = size_t(2) << 20;
}  // namespace

void* aligned_alloc_zeroed(size_t bytes) {
  const size_t rounded = bytes ? (bytes + 63) / 64 * 64 : 64;
  const bool huge = rounded >= kHugePage;
  const size_t alignment = huge ? kHugePage : 64;
  const size_t total = (kHeaderBytes + rounded + alignment - 1) / alignment * alignment;
  auto* block = static_cast<std::byte*>(std::aligned_alloc(alignment, total));
  if (!block) throw std::bad_alloc();
  if (huge) madvise(block, total, MADV_HUGEPAGE);  // a hint: refusal costs only speed
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

void Buffer::Free::operator()(void* p) const {
  if (device.kind == Device::Kind::cpu) {
    aligned_free(p);
  } else {
    detail::device_free(device, p);
  }
}

Buffer::Buffer(DType dtype, std::initializer_list<int64_t> shape, Device device) {
  allocate(dtype, int(shape.size()), shape.begin(), device);
}

Buffer Buffer::like(const Tensor& t, Device device) {
  Buffer b;
  int64_t shape[Tensor::kMaxDims];
  for (int d = 0; d < t.dim(); ++d) shape[d] = t.size(d);
  b.allocate(t.dtype(), t.dim(), shape, device);
  return b;
}

void Buffer::allocate(DType dtype, int ndim, const int64_t* shape, Device device) {
  int64_t strides[Tensor::kMaxDims];
  int64_t stride = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    strides[d] = stride;
    stride *= shape[d];
  }
  const Tensor probe(nullptr, dtype, ndim, shape, strides);
  void* p = device.kind == Device::Kind::cpu ? aligned_alloc_zeroed(probe.nbytes())
                                             : detail::device_alloc(device, probe.nbytes());
  storage_ = std::unique_ptr<void, Free>(p, Free{device});
  tensor_ = Tensor(storage_.get(), dtype, ndim, shape, strides, device);
}

void copy(const Tensor& dst, const Tensor& src) {
  PMOE_CHECK(dst.dtype() == src.dtype(), "copy: dtypes differ (", dtype_name(dst.dtype()),
             " <- ", dtype_name(src.dtype()), ")");
  bool same_shape = dst.dim() == src.dim();
  for (int d = 0; same_shape && d < dst.dim(); ++d) same_shape = dst.size(d) == src.size(d);
  PMOE_CHECK(same_shape, "copy: shapes differ (", dst.shape_str(), " <- ", src.shape_str(), ")");
  PMOE_CHECK(dst.is_contiguous() && src.is_contiguous(), "copy: both tensors must be contiguous");
  if (src.nbytes() == 0) return;
  if (dst.device().kind == Device::Kind::cpu && src.device().kind == Device::Kind::cpu) {
    std::memcpy(dst.data(), src.data(), src.nbytes());
  } else {
    detail::copy_bytes(dst.data(), dst.device(), src.data(), src.device(), src.nbytes());
  }
}

}  // namespace pmoe
