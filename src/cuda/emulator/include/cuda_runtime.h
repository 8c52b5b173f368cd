// The emulated device's stand-in for CUDA's header of the same name (src/cuda/emulator): the
// runtime API pmoe calls, and what kernel source needs from the compiler (qualifiers, built-in
// indices, atomics, barriers).
#pragma once
#include "cuda/emulator/runtime_api.hpp"
#include "cuda/emulator/device_api.hpp"
