// The experts' grouped GEMM on Ampere and later (sm_80), from CUTLASS 2 (library_grouped_gemm.cuh):
// GemmGrouped with device-only scheduling, so the problem sizes, pointers and row strides are
// read from device memory (the arrays PlanGroups wrote) and the host never sees a count.
//
//   mainloop   A_g [m, k] row-major, B_g [k, n] row-major, 16-bit, cp.async into 4 stages of
//              128 x 32 and 32 x 128 tiles; 4 warps of 64 x 64, mma.sync 16 x 8 x 16, f32 sums
//   epilogue   D_g [m, n] f32 row-major, 4 floats a store; C not read (beta = 0)
//   schedule   a fixed grid (multiprocessors x resident blocks) whose blocks visit the groups'
//              tiles in turn; a group of m = 0 has none
//
// Built for sm_80 only (SASS, plus its PTX for devices past 9.0; CMakeLists.txt): two
// instantiations (bf16, f16).
#include "cuda/gemm/grouped_gemm_cutlass.hpp"

#include <mutex>

#include <cutlass/bfloat16.h>
#include <cutlass/cutlass.h>
#include <cutlass/epilogue/thread/linear_combination.h>
#include <cutlass/gemm/device/gemm_grouped.h>
#include <cutlass/gemm/gemm.h>
#include <cutlass/gemm/kernel/default_gemm_grouped.h>
#include <cutlass/half.h>

#include "cuda/check.hpp"
#include "cuda/gemm/cutlass_launch.cuh"
#include "pmoe/error.hpp"

namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR::cutlass_sm80 {
namespace {

using Row = cutlass::layout::RowMajor;
static_assert(sizeof(cutlass::gemm::GemmCoord) == sizeof(GroupShape),
              "CUTLASS's GemmCoord is not pmoe's GroupShape");

template <typename T>
struct Sm80Gemm {
  static constexpr int kAlignIn = 16 / int(sizeof(T)), kAlignOut = 16 / int(sizeof(float));
  using Kernel = typename cutlass::gemm::kernel::DefaultGemmGrouped<
      T, Row, cutlass::ComplexTransform::kNone, kAlignIn, T, Row, cutlass::ComplexTransform::kNone,
      kAlignIn, float, Row, float, cutlass::arch::OpClassTensorOp, cutlass::arch::Sm80,
      cutlass::gemm::GemmShape<128, 128, 32>, cutlass::gemm::GemmShape<64, 64, 32>,
      cutlass::gemm::GemmShape<16, 8, 16>,
      cutlass::epilogue::thread::LinearCombination<float, kAlignOut, float, float>,
      cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<1>, 4,
      cutlass::gemm::kernel::GroupScheduleMode::kDeviceOnly>::GemmKernel;
  using Gemm = cutlass::gemm::device::GemmGrouped<Kernel>;

  // The grid: as many blocks as are resident at once (the kernel's occupancy, asked once).
  static int blocks(int sms) {
    static std::once_flag once;
    static int per_sm = 0;
    std::call_once(once, [] { per_sm = Gemm::maximum_active_blocks(); });
    PMOE_CHECK(per_sm > 0, "CUTLASS 2 GemmGrouped: no block fits a multiprocessor");
    return per_sm * sms;
  }

  static void run(const LibraryGroupedGemm& g, int sms, cudaStream_t stream) {
    typename Gemm::EpilogueOutputOp::Params epilogue(1.0f, 0.0f);
    auto* shapes = reinterpret_cast<cutlass::gemm::GemmCoord*>(g.arrays.shapes);
    auto** a = const_cast<T**>(reinterpret_cast<const T* const*>(g.arrays.a));
    auto** b = const_cast<T**>(reinterpret_cast<const T* const*>(g.arrays.b));
    auto** d = reinterpret_cast<float**>(g.arrays.d);
    typename Gemm::Arguments args(shapes, g.groups, blocks(sms), epilogue, a, b, d, d,
                                  g.arrays.lda, g.arrays.ldb, g.arrays.ldd, g.arrays.ldd);
    run_cutlass<Gemm>("CUTLASS 2 GemmGrouped", args, g, stream);
  }
};

}  // namespace

size_t workspace_bytes(int, int) {
  return 0;  // device-only scheduling precomputes nothing
}

void run(const LibraryGroupedGemm& g, cudaStream_t stream) {
  const int sms = sm_count(g.device);
  if (g.inputs == DType::f16) return Sm80Gemm<cutlass::half_t>::run(g, sms, stream);
  Sm80Gemm<cutlass::bfloat16_t>::run(g, sms, stream);
}

}  // namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR::cutlass_sm80
