// How every op checks its tensor arguments, with one wording for every message: the op, the
// argument, what was expected and what came.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

#include "pmoe/tensor.hpp"

namespace pmoe::detail {

// Present (unless shape is empty), of `dtype`, on `device`, of exactly `shape`, row-major
// contiguous, with data (unless it has no element). Throws pmoe::Error otherwise.
void check_tensor(std::string_view op, const char* name, const Tensor& t, DType dtype,
                  Device device, std::initializer_list<int64_t> shape);

// Expert indices: like check_tensor, but i32 or i64.
void check_index_tensor(std::string_view op, const char* name, const Tensor& t, Device device,
                        std::initializer_list<int64_t> shape);

// `t` must be on `device`: throws pmoe::Error naming both otherwise. A host array handed to an op
// on a CUDA device also learns what memory to pass instead (on the emulated device, where no GPU
// is visible, nothing but pmoe's own arrays can be there).
void check_device(std::string_view op, const char* name, const Tensor& t, Device device);

// "bf16 (bfloat16)": pmoe's name and the array libraries' name, for error messages.
std::string dtype_words(DType t);

// A sum over ranks of n elements each (TpMoe's all-reduce, CPU and device): rank `peer` gave
// `their_n` where this rank `rank` has `n`. Throws pmoe::Error naming both when they differ.
void check_all_reduce_count(std::string_view op, int peer, int64_t their_n, int rank, int64_t n);

// An argument that must be left out here (an empty Tensor); `why` says when it is used.
void check_absent(std::string_view op, const char* name, const Tensor& t, const char* why);

}  // namespace pmoe::detail
