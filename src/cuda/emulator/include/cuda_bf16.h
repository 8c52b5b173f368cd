// The emulated device's stand-in for CUDA's header of the same name (src/cuda/emulator).
#pragma once
#include "cuda/emulator/half_types.hpp"
