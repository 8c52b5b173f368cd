// The emulated device's stand-in for CUDA's header of the same name (src/cuda/emulator): the
// warp matrix functions (nvcuda::wmma).
#pragma once
#include "cuda/emulator/wmma.hpp"
