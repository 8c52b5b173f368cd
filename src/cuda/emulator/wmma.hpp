// nvcuda::wmma (CUDA's <mma.h>) on the emulated device: warp-wide matrix fragments and the
// warp-collective load / mma / store on them, for 16-bit inputs (__half, __nv_bfloat16) with f32
// accumulators, at the three shapes CUDA has for them (m16n16k16, m32n8k16, m8n32k16).
//
// What CUDA's contract says, and what is done here:
// - Every lane of the warp calls each op with the same arguments; how a fragment's elements
//   spread over the lanes is unspecified. Here a matrix_a or matrix_b fragment holds the whole
//   matrix in every lane (row-major, rows x cols), and an accumulator holds the elements
//   i = (lane + j) % 32 + 32 j (j < num_elements = M N / 32) of the row-major M x N matrix: each
//   lane computes and stores only those. So a lane that skips an op leaves its share unset, as a
//   GPU's warp gives garbage when not all of it calls; and a kernel that reads a stored
//   fragment back lane-strided (element lane + 32 j) reads other lanes' shares, so it needs the
//   barrier a GPU needs (no fixed mapping could show every such kernel, but the plain one
//   showed none: it was the very order the grouped GEMM reads in).
// - load/store: mptr 256-bit (32-byte) aligned, ldm a multiple of 16 bytes (8 16-bit elements,
//   4 floats), in elements of the pointer's type. A violation throws here (the launch fails with
//   the message), where a GPU faults or reads wrong data.
// - The ops do not synchronise the warp: a lane that reads what other lanes stored needs a
//   barrier, and here the other lanes (fibers) have not run yet without one.
// - mma_sync: D = A B + C. Each 16-bit input is widened exactly to f32, so every product is
//   exact; the K products are added to C's element one at a time in k order, each sum rounded
//   to nearest even in f32. A GPU's tensor cores add them in an unspecified order and internal
//   precision: compare their results within a bound, never bit for bit.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "cuda/emulator/device_api.hpp"
#include "cuda/emulator/half_types.hpp"

namespace nvcuda::wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

namespace detail {

template <typename Use, int M, int N, int K>
struct Shape;
template <int M, int N, int K>
struct Shape<matrix_a, M, N, K> {
  static constexpr int rows = M, cols = K;
};
template <int M, int N, int K>
struct Shape<matrix_b, M, N, K> {
  static constexpr int rows = K, cols = N;
};
template <int M, int N, int K>
struct Shape<accumulator, M, N, K> {
  static constexpr int rows = M, cols = N;
};

constexpr bool is_16bit_shape(int M, int N, int K) {
  return K == 16 && ((M == 16 && N == 16) || (M == 32 && N == 8) || (M == 8 && N == 32));
}

inline float widen(__half v) { return __half2float(v); }
inline float widen(__nv_bfloat16 v) { return __bfloat162float(v); }

// Element j of an accumulator fragment in lane `lane`: its index in the row-major M x N matrix.
inline int accumulator_element(int lane, int j) { return (lane + j) % 32 + 32 * j; }

// The calling thread's lane in its warp (threads numbered x fastest, as on a GPU).
inline int lane() {
  const auto& t = ::pmoe::emu::this_thread();
  const unsigned linear = t.thread_idx.x + t.block_dim.x * (t.thread_idx.y + t.block_dim.y * t.thread_idx.z);
  return int(linear % 32u);
}

inline void check_operand(const char* op, const void* mptr, unsigned ldm, unsigned elem_bytes) {
  if (reinterpret_cast<uintptr_t>(mptr) % 32 != 0)
    throw std::invalid_argument(std::string("wmma::") + op + ": mptr " +
                                std::to_string(reinterpret_cast<uintptr_t>(mptr)) +
                                " is not 256-bit aligned");
  if (ldm * elem_bytes % 16 != 0)
    throw std::invalid_argument(std::string("wmma::") + op + ": ldm " + std::to_string(ldm) +
                                " is not a multiple of 16 bytes");
}

}  // namespace detail

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
class fragment {
  static_assert(detail::is_16bit_shape(M, N, K), "wmma: emulated shapes are m16n16k16, m32n8k16, m8n32k16");
  static constexpr bool kAccumulator = std::is_same_v<Use, accumulator>;
  static_assert(kAccumulator ? std::is_same_v<T, float>
                             : std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>,
                "wmma: emulated fragments are __half or __nv_bfloat16 inputs, float accumulators");

 public:
  using element_type = T;
  static constexpr int rows = detail::Shape<Use, M, N, K>::rows;
  static constexpr int cols = detail::Shape<Use, M, N, K>::cols;
  static constexpr int num_elements = kAccumulator ? M * N / 32 : rows * cols;
  T x[num_elements];
};

template <typename Use, int M, int N, int K, typename T, typename Layout>
inline void fill_fragment(fragment<Use, M, N, K, T, Layout>& f, const T& v) {
  for (T& e : f.x) e = v;
}

// matrix_a / matrix_b: the whole matrix, from row-major or column-major memory.
template <typename Use, int M, int N, int K, typename T, typename Layout>
inline void load_matrix_sync(fragment<Use, M, N, K, T, Layout>& f, const T* mptr, unsigned ldm) {
  static_assert(std::is_same_v<Layout, row_major> || std::is_same_v<Layout, col_major>,
                "wmma: matrix_a and matrix_b fragments name their layout");
  detail::check_operand("load_matrix_sync", mptr, ldm, sizeof(T));
  using F = fragment<Use, M, N, K, T, Layout>;
  constexpr bool row = std::is_same_v<Layout, row_major>;
  auto load = [&](int r, int c) {
    f.x[r * F::cols + c] = row ? mptr[size_t(r) * ldm + c] : mptr[size_t(c) * ldm + r];
  };
  // Every row of A and column of B: a lane's accumulator elements span rows and columns.
  for (int r = 0; r < F::rows; ++r)
    for (int c = 0; c < F::cols; ++c) load(r, c);
}

// Accumulators: this lane's elements only.
template <int M, int N, int K>
inline void load_matrix_sync(fragment<accumulator, M, N, K, float>& f, const float* mptr,
                             unsigned ldm, layout_t layout) {
  detail::check_operand("load_matrix_sync", mptr, ldm, sizeof(float));
  for (int j = 0; j < f.num_elements; ++j) {
    const int i = detail::accumulator_element(detail::lane(), j), r = i / N, c = i % N;
    f.x[j] = layout == mem_row_major ? mptr[size_t(r) * ldm + c] : mptr[size_t(c) * ldm + r];
  }
}
template <int M, int N, int K>
inline void store_matrix_sync(float* mptr, const fragment<accumulator, M, N, K, float>& f,
                              unsigned ldm, layout_t layout) {
  detail::check_operand("store_matrix_sync", mptr, ldm, sizeof(float));
  for (int j = 0; j < f.num_elements; ++j) {
    const int i = detail::accumulator_element(detail::lane(), j), r = i / N, c = i % N;
    (layout == mem_row_major ? mptr[size_t(r) * ldm + c] : mptr[size_t(c) * ldm + r]) = f.x[j];
  }
}

// D = A B + C, this lane's elements of D (D may be C).
template <int M, int N, int K, typename T, typename LA, typename LB>
inline void mma_sync(fragment<accumulator, M, N, K, float>& d,
                     const fragment<matrix_a, M, N, K, T, LA>& a,
                     const fragment<matrix_b, M, N, K, T, LB>& b,
                     const fragment<accumulator, M, N, K, float>& c) {
  for (int j = 0; j < d.num_elements; ++j) {
    const int i = detail::accumulator_element(detail::lane(), j), r = i / N, col = i % N;
    float acc = c.x[j];
    for (int k = 0; k < K; ++k)
      acc += detail::widen(a.x[r * K + k]) * detail::widen(b.x[k * N + col]);  // exact product
    d.x[j] = acc;
  }
}

}  // namespace nvcuda::wmma
