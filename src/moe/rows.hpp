// Row-matrix helpers shared by the MoE layers: argument checks with messages that name the op
// and the argument, f32 <-> dtype row copies, and a grow-only workspace counted by
// pmoe/memory.hpp like every other library allocation.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "pmoe/tensor.hpp"

namespace pmoe::detail {

// Throws pmoe::Error unless `t` is a 2-D tensor on `device` of one of `dtypes`, with `cols` columns and
// (rows >= 0) exactly `rows` rows, unit stride in its last dimension and rows that do not
// overlap; `contiguous` also requires row-major contiguity.
void check_rows(const char* op, const char* name, const Tensor& t, int64_t rows, int64_t cols,
                std::initializer_list<DType> dtypes, bool contiguous,
                Device device = Device::cpu());

// dst[r, c] = float(src[r, c]) for a 2-D f32 or bf16 tensor; dst has leading dimension ld.
void rows_to_f32(const Tensor& src, float* dst, int64_t ld);
// dst[r, c] = src[r, c] rounded to dst's dtype (f32 or bf16); src has leading dimension ld.
void rows_from_f32(const float* src, int64_t ld, const Tensor& dst);

// A 2-D row-major view of `rows` x `cols` elements at `data` with leading dimension `ld`.
Tensor row_view(void* data, DType dtype, int64_t rows, int64_t cols, int64_t ld);

// Grow-only scratch memory, 64-byte aligned, allocated through Buffer so it is counted.
class Scratch {
 public:
  template <typename T>
  T* get(int64_t count) {
    reserve(size_t(count) * sizeof(T));
    return buffer_.data<T>();
  }
  size_t bytes() const { return buffer_.nbytes(); }

 private:
  void reserve(size_t bytes);
  Buffer buffer_;
};

}  // namespace pmoe::detail
