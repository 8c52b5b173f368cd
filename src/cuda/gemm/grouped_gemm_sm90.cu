// The experts' grouped GEMM on Hopper (sm_90a), from CUTLASS 3 (library_grouped_gemm.cuh):
// the ptr-array grouped kernel, its problem shapes, pointers and strides read from device memory
// (the arrays PlanGroups wrote), none from the host.
//
//   mainloop   A_g [m, k] row-major, B_g [k, n] row-major (n contiguous: wgmma reads it
//              transposed from shared memory), 16-bit, loaded by TMA into a multi-stage
//              pipeline (as many stages as shared memory holds beside the epilogue's)
//   math       two consumer warpgroups, wgmma 64 x 256 x 16 each, f32 accumulators
//   epilogue   D_g [m, n] f32 row-major, stored by TMA; no C (beta = 0)
//   schedule   persistent CTAs, one a multiprocessor, over the groups' 128 x 256 tiles; a group
//              of m = 0 has none
//
// This file alone includes CUTLASS's sm90 headers and is built for sm_90a only (CMakeLists.txt):
// two instantiations (bf16, f16) of one tile shape, so only it pays their compile time.
#include "cuda/gemm/grouped_gemm_cutlass.hpp"

#include <cstring>
#include <mutex>

#include <cute/tensor.hpp>
#include <cutlass/bfloat16.h>
#include <cutlass/cutlass.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/dispatch_policy.hpp>
#include <cutlass/gemm/group_array_problem_shape.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/half.h>
#include <cutlass/kernel_hardware_info.hpp>

#include "cuda/check.hpp"
#include "cuda/gemm/cutlass_launch.cuh"
#include "pmoe/error.hpp"

namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR::cutlass_sm90 {
namespace {

using Shape3 = cute::Shape<int, int, int>;
using Problem = cutlass::gemm::GroupProblemShape<Shape3>;
using Row = cutlass::layout::RowMajor;

// The CUTLASS types are spelled out per input type at namespace scope, not inside a template:
// nvcc's host pass (gcc) misreads the epilogue builder's decltype in a dependent context.
using TileShape = cute::Shape<cute::_128, cute::_256, cute::_64>;
using ClusterShape = cute::Shape<cute::_1, cute::_1, cute::_1>;
constexpr int kAlignIn = 8, kAlignOut = 4;  // 16 bytes of 16-bit inputs, of f32 outputs
using Epilogue = cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, Row*, kAlignOut, float,
    Row*, kAlignOut, cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative>::CollectiveOp;
using Stages = cutlass::gemm::collective::StageCountAutoCarveout<
    static_cast<int>(sizeof(Epilogue::SharedStorage))>;
using MainloopBf16 = cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, cutlass::bfloat16_t, Row*, kAlignIn,
    cutlass::bfloat16_t, Row*, kAlignIn, float, TileShape, ClusterShape, Stages,
    cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>::CollectiveOp;
using MainloopF16 = cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, cutlass::half_t, Row*, kAlignIn,
    cutlass::half_t, Row*, kAlignIn, float, TileShape, ClusterShape, Stages,
    cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>::CollectiveOp;
using KernelBf16 = cutlass::gemm::kernel::GemmUniversal<Problem, MainloopBf16, Epilogue>;
using KernelF16 = cutlass::gemm::kernel::GemmUniversal<Problem, MainloopF16, Epilogue>;

template <typename Kernel>
struct Sm90Gemm {
  using T = typename Kernel::ElementA;
  using Adapter = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideD = typename Kernel::InternalStrideD;
  static_assert(sizeof(Shape3) == sizeof(GroupShape) && sizeof(StrideA) == sizeof(int64_t) &&
                    sizeof(StrideB) == sizeof(int64_t) && sizeof(StrideD) == sizeof(int64_t),
                "CUTLASS's shapes and strides are not pmoe's GroupShape and int64 arrays");

  static typename Adapter::Arguments arguments(const LibraryGroupedGemm& g, int sms) {
    typename Adapter::Arguments args;
    args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
    args.problem_shape = {g.groups, reinterpret_cast<Shape3*>(g.arrays.shapes), nullptr};
    args.mainloop.ptr_A = reinterpret_cast<const T**>(g.arrays.a);
    args.mainloop.dA = reinterpret_cast<StrideA*>(g.arrays.lda);
    args.mainloop.ptr_B = reinterpret_cast<const T**>(g.arrays.b);
    args.mainloop.dB = reinterpret_cast<StrideB*>(g.arrays.ldb);
    args.epilogue.thread.alpha = 1.0f;
    args.epilogue.thread.beta = 0.0f;
    args.epilogue.ptr_C = nullptr;
    args.epilogue.dC = nullptr;
    args.epilogue.ptr_D = reinterpret_cast<float**>(g.arrays.d);
    args.epilogue.dD = reinterpret_cast<StrideD*>(g.arrays.ldd);
    args.hw_info.device_id = g.device;
    args.hw_info.sm_count = sms;
    return args;
  }

  // The arrays PlanGroups writes are read as CUTLASS's types: the same bytes, checked once.
  static void check_layouts() {
    static std::once_flag once;
    static bool same = false;
    std::call_once(once, [] {
      const Shape3 shape{3, 5, 7};
      const StrideA a = cute::make_stride(int64_t(11), cute::Int<1>{}, cute::Int<0>{});
      const StrideB b = cute::make_stride(cute::Int<1>{}, int64_t(13), cute::Int<0>{});
      const StrideD d = cute::make_stride(int64_t(17), cute::Int<1>{}, cute::Int<0>{});
      GroupShape s;
      int64_t la = 0, lb = 0, ld = 0;
      std::memcpy(&s, &shape, sizeof s);
      std::memcpy(&la, &a, sizeof la);
      std::memcpy(&lb, &b, sizeof lb);
      std::memcpy(&ld, &d, sizeof ld);
      same = s.m == 3 && s.n == 5 && s.k == 7 && la == 11 && lb == 13 && ld == 17;
    });
    PMOE_CHECK(same, "CUTLASS 3 grouped GEMM: its problem shapes or strides are laid out unlike "
                     "pmoe's group arrays (library_grouped_gemm.cuh); a CUTLASS version change?");
  }

  static void run(const LibraryGroupedGemm& g, int sms, cudaStream_t stream) {
    check_layouts();
    const typename Adapter::Arguments args = arguments(g, sms);
    run_cutlass<Adapter>("CUTLASS 3 grouped GEMM", args, g, stream);
  }
};

}  // namespace

size_t workspace_bytes(int groups, int device) {
  LibraryGroupedGemm g;
  g.groups = groups;
  g.device = device;
  const int sms = sm_count(device);
  return std::max(Sm90Gemm<KernelBf16>::Adapter::get_workspace_size(
                      Sm90Gemm<KernelBf16>::arguments(g, sms)),
                  Sm90Gemm<KernelF16>::Adapter::get_workspace_size(
                      Sm90Gemm<KernelF16>::arguments(g, sms)));
}

void run(const LibraryGroupedGemm& g, cudaStream_t stream) {
  const int sms = sm_count(g.device);
  if (g.inputs == DType::f16) return Sm90Gemm<KernelF16>::run(g, sms, stream);
  Sm90Gemm<KernelBf16>::run(g, sms, stream);
}

}  // namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR::cutlass_sm90
