#include "core/arg_checks.hpp"

#include "pmoe/error.hpp"
#include "pmoe/stream.hpp"

namespace pmoe::detail {

std::string dtype_words(DType t) { return cat(dtype_name(t), " (", dtype_array_name(t), ")"); }

void check_tensor(std::string_view op, const char* name, const Tensor& t, DType dtype,
                  Device device, std::initializer_list<int64_t> shape) {
  const std::string want = Tensor(nullptr, dtype, shape).shape_str();
  PMOE_CHECK(!t.empty() || shape.size() == 0, op, ": `", name, "` is missing (expected ",
             dtype_name(dtype), " ", want, ")");
  PMOE_CHECK(t.dtype() == dtype, op, ": `", name, "` must be ", dtype_words(dtype), ", got ",
             dtype_words(t.dtype()));
  check_device(op, name, t, device);
  bool same_shape = t.dim() == int(shape.size());
  int d = 0;
  for (int64_t extent : shape) same_shape = same_shape && t.size(d++) == extent;
  PMOE_CHECK(same_shape, op, ": `", name, "` must have shape ", want, ", got ", t.shape_str());
  PMOE_CHECK(t.is_contiguous(), op, ": `", name, "` must be row-major contiguous");
  PMOE_CHECK(t.data() != nullptr || t.numel() == 0, op, ": `", name, "` has no data pointer");
}

void check_device(std::string_view op, const char* name, const Tensor& t, Device device) {
  if (t.device() == device) return;
  std::string hint;
  if (t.device().kind == Device::Kind::cpu && device.kind == Device::Kind::cuda)
    hint = cuda_emulated()
               ? " (a CPU array; this is pmoe's emulated CUDA device, where no GPU is visible and "
                 "torch or NumPy cannot allocate: pass pmoe's own arrays, pmoe.zeros filled by "
                 "pmoe.copy in Python or a Buffer on the device in C++, or run on a GPU)"
               : " (a CPU array: pass device memory, e.g. CUDA tensors of torch or CuPy, or "
                 "pmoe.zeros filled by pmoe.copy in Python, a Buffer on the device in C++)";
  throw Error(
      cat(op, ": `", name, "` must be on ", device.str(), ", got ", t.device().str(), hint));
}

void check_index_tensor(std::string_view op, const char* name, const Tensor& t, Device device,
                        std::initializer_list<int64_t> shape) {
  PMOE_CHECK(t.empty() || t.dtype() == DType::i32 || t.dtype() == DType::i64, op, ": `", name,
             "` holds expert indices: it must be i32 or i64 (int32 or int64; torch.topk's int64 "
             "works as it is), got ",
             dtype_words(t.dtype()));
  check_tensor(op, name, t, t.empty() ? DType::i32 : t.dtype(), device, shape);
}

void check_absent(std::string_view op, const char* name, const Tensor& t, const char* why) {
  PMOE_CHECK(t.empty(), op, ": `", name, "` must be an empty Tensor ", why, ", got ",
             dtype_name(t.dtype()), " ", t.shape_str());
}

void check_all_reduce_count(std::string_view op, int peer, int64_t their_n, int rank, int64_t n) {
  PMOE_CHECK(their_n == n, op, ": rank ", peer, " all-reduces ", their_n, " elements but rank ",
             rank, " has ", n, "; every rank must pass the same number of tokens");
}

}  // namespace pmoe::detail
