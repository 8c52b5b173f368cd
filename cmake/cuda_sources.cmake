# pmoe's CUDA sources, listed once for both of their compilations: nvcc's for a GPU (the pmoe
# target, top CMakeLists.txt) and the host compiler's for the emulated device (src/cuda/emulator).
# Only the GPU build adds what has no emulated twin (CUTLASS's GEMMs, NCCL's transport).
set(PMOE_CUDA_SOURCES
  ${PROJECT_SOURCE_DIR}/src/cuda/device_runtime.cu
  ${PROJECT_SOURCE_DIR}/src/cuda/backends.cu
  ${PROJECT_SOURCE_DIR}/src/cuda/all_to_all/backend.cu
  ${PROJECT_SOURCE_DIR}/src/cuda/all_to_all/dispatch.cu
  ${PROJECT_SOURCE_DIR}/src/cuda/all_to_all/combine.cu
  ${PROJECT_SOURCE_DIR}/src/cuda/all_to_all/narrow_indices.cu
  ${PROJECT_SOURCE_DIR}/src/cuda/overlap/signals.cu
  ${PROJECT_SOURCE_DIR}/src/cuda/overlap/all_gather_gemm.cu
  ${PROJECT_SOURCE_DIR}/src/cuda/overlap/gemm_reduce_scatter.cu
  ${PROJECT_SOURCE_DIR}/src/cuda/overlap/piece_sum.cu
  ${PROJECT_SOURCE_DIR}/src/cuda/overlap/copy_kernel.cu
  # The expert GEMMs behind one interface (src/cuda/gemm): the engine choice and pmoe's own
  # engines, the same code for a GPU and the emulated device.
  ${PROJECT_SOURCE_DIR}/src/cuda/gemm/expert_gemm.cu
  ${PROJECT_SOURCE_DIR}/src/cuda/gemm/grouped_gemm.cu
  ${PROJECT_SOURCE_DIR}/src/cuda/gemm/library_grouped_gemm.cu
  # The MoE layers on a device (src/cuda/moe).
  ${PROJECT_SOURCE_DIR}/src/cuda/moe/moe_row_kernels.cu
  ${PROJECT_SOURCE_DIR}/src/cuda/moe/moe_routing_kernels.cu
  ${PROJECT_SOURCE_DIR}/src/cuda/moe/moe_tp_sum_kernels.cu
  ${PROJECT_SOURCE_DIR}/src/cuda/moe/simple_moe.cu
  ${PROJECT_SOURCE_DIR}/src/cuda/moe/ep_moe.cu
  ${PROJECT_SOURCE_DIR}/src/cuda/moe/tp_moe.cu)

# The library grouped GEMM's twins, one for each compilation: on a GPU the call into CUTLASS
# (whose kernels, src/cuda/gemm/grouped_gemm_sm90.cu and _sm80.cu, the top CMakeLists.txt builds
# one architecture each), on the emulated device the shim of CUTLASS's contract, which the host
# compiler can build where CUTLASS cannot. The shim is a C++ file, not in the kernel list above:
# it checks its operands' alignment itself and names the group that breaks it, so it does not
# take the kernels' UBSan alignment check (src/cuda/emulator/CMakeLists.txt).
set(PMOE_CUDA_GPU_SOURCES ${PROJECT_SOURCE_DIR}/src/cuda/gemm/library_grouped_gemm_gpu.cu)
set(PMOE_CUDA_EMULATED_SOURCES
  ${PROJECT_SOURCE_DIR}/src/cuda/gemm/library_grouped_gemm_emulated.cpp)
