// The experts' activations, applied in place to f32 rows of the hidden layer.
//
//   relu/gelu:  hidden row [F']            -> act(hidden) in place
//   swiglu:     hidden row [gate F' | linear F'] -> silu(gate) * linear, written over the gate
//               half; the row keeps its stride 2 F'
#pragma once

#include <cmath>
#include <cstdint>

#include "pmoe/moe.hpp"

namespace pmoe::detail {

inline float relu(float v) { return v > 0.0f ? v : 0.0f; }
inline float gelu(float v) { return 0.5f * v * (1.0f + std::erf(v * 0.70710678118654752f)); }
inline float silu(float v) { return v / (1.0f + std::exp(-v)); }

// hidden [rows, halves * width] row-major; afterwards columns [0, width) of each row hold the
// activated values.
inline void apply_activation(Activation act, float* hidden, int64_t rows, int64_t width) {
  const int64_t ld = act == Activation::swiglu ? 2 * width : width;
  for (int64_t r = 0; r < rows; ++r) {
    float* h = hidden + r * ld;
    switch (act) {
      case Activation::relu:
        for (int64_t c = 0; c < width; ++c) h[c] = relu(h[c]);
        break;
      case Activation::gelu:
        for (int64_t c = 0; c < width; ++c) h[c] = gelu(h[c]);
        break;
      case Activation::swiglu:
        for (int64_t c = 0; c < width; ++c) h[c] = silu(h[c]) * h[width + c];
        break;
    }
  }
}

}  // namespace pmoe::detail
