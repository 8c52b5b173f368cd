// The emulated device's stand-in for cuBLAS's header of the same name (src/cuda/emulator): the
// cuBLAS calls pmoe makes, run by the host BLAS on the emulated streams (cublas_api.hpp).
#pragma once
#include "cuda_runtime.h"
#include "cuda/emulator/cublas_api.hpp"
