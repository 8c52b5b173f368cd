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
  # The MoE layers on a device (src/cuda/moe).
  ${PROJECT_SOURCE_DIR}/src/cuda/moe/moe_kernels.cu
  ${PROJECT_SOURCE_DIR}/src/cuda/moe/grouped_gemm.cu
  ${PROJECT_SOURCE_DIR}/src/cuda/moe/library_grouped_gemm.cu
  ${PROJECT_SOURCE_DIR}/src/cuda/moe/simple_moe.cu
  ${PROJECT_SOURCE_DIR}/src/cuda/moe/ep_moe.cu
  ${PROJECT_SOURCE_DIR}/src/cuda/moe/tp_moe.cu)
