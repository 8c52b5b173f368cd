// The NCCL all-to-all-v row (nccl_all_to_all_v.hpp says what it does and why). Buffers, per rank,
// with R = W * max_tokens * min(k, E_local) the most rows a rank can receive:
//
//   send_       [max_tokens * k][row]    this rank's rows sorted by expert, so by destination
//   recv_       [R][row]                 by source rank, then local expert, then token
//   expert_x_   [E_local][W * max][row]  per local expert, in (source rank, token) order
//   expert_y_   [E_local][W * max][H]    bf16, the stand-in experts' outputs (untimed)
//   back_send_  [R][H]                   expert_y_'s rows in recv_'s order
//   back_recv_  [max_tokens * k][H]      this rank's rows back, in send_'s order
//   y_          [max_tokens][H]          bf16
// row = H x in_dtype, then the f8 scales (S f32); the plan (counts and row maps) is built on the
// host from the routing and from the counts received, and copied over from pinned memory.
#include "nccl_all_to_all_v.hpp"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <span>

#include "cuda/check.hpp"
#include "cuda/transport/nccl_api.hpp"
#include "reference/all_to_all_reference.hpp"

namespace pmoe::bench {
namespace {

using reference::AllToAllInputs;

// Row i of dst (row dst_index[i], or i) gets `bytes` from row src_index[i] (or i) of src.
struct RowCopy {
  std::byte* dst;
  size_t dst_stride;
  const int32_t* dst_index;
  const std::byte* src;
  size_t src_stride;
  const int32_t* src_index;
  int rows;
  size_t bytes;
};

template <typename Word>
__global__ void copy_rows(const RowCopy c) {
  for (int i = blockIdx.x; i < c.rows; i += gridDim.x) {
    const size_t d = c.dst_index ? size_t(c.dst_index[i]) : size_t(i);
    const size_t s = c.src_index ? size_t(c.src_index[i]) : size_t(i);
    auto* to = reinterpret_cast<Word*>(c.dst + d * c.dst_stride);
    const auto* from = reinterpret_cast<const Word*>(c.src + s * c.src_stride);
    for (size_t w = threadIdx.x; w < c.bytes / sizeof(Word); w += blockDim.x) to[w] = from[w];
  }
}

void launch_copy(const RowCopy& c, cudaStream_t stream) {
  if (c.rows == 0 || c.bytes == 0) return;
  const uintptr_t bits = c.bytes | c.dst_stride | c.src_stride |
                         reinterpret_cast<uintptr_t>(c.dst) | reinterpret_cast<uintptr_t>(c.src);
  const int blocks = std::min(c.rows, 1024);
  if (bits % 16 == 0)
    copy_rows<uint4><<<blocks, 256, 0, stream>>>(c);
  else
    copy_rows<unsigned char><<<blocks, 256, 0, stream>>>(c);
  PMOE_CUDA_CHECK(cudaGetLastError());
}

// y[t] = sum over j of weights[t, j] * rows[position[t, j]], f32 in j order, -1 skipped.
struct WeightedSum {
  __nv_bfloat16* y;
  const __nv_bfloat16* rows;
  const int32_t* position;
  const float* weights;
  int m, k, H;
};

__global__ void weighted_sum(const WeightedSum p) {
  for (int t = blockIdx.x; t < p.m; t += gridDim.x)
    for (int h = threadIdx.x; h < p.H; h += blockDim.x) {
      float acc = 0.0f;
      for (int j = 0; j < p.k; ++j) {
        const int32_t row = p.position[t * p.k + j];
        if (row < 0) continue;
        const float v = __bfloat162float(p.rows[size_t(row) * p.H + h]);
        acc = __fadd_rn(acc, __fmul_rn(p.weights[t * p.k + j], v));  // no fused multiply-add
      }
      p.y[size_t(t) * p.H + h] = __float2bfloat16_rn(acc);
    }
}

template <typename T>
T* device_array(size_t n) {
  void* p = nullptr;
  PMOE_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)));
  return static_cast<T*>(p);
}

template <typename T>
T* pinned_array(size_t n) {
  void* p = nullptr;
  PMOE_CUDA_CHECK(cudaMallocHost(&p, std::max<size_t>(n, 1) * sizeof(T)));
  return static_cast<T*>(p);
}

class NcclAllToAllV final : public BaselinePath {
 public:
  NcclAllToAllV(Communicator& comm, const AllToAllConfig& cfg, const AllToAllInputs& in)
      : cfg_(cfg),
        in_(in),
        api_(cuda::nccl_host_api()),
        W_(comm.size()),
        rank_(comm.rank()),
        k_(cfg.top_k),
        E_local_(cfg.num_experts / W_),
        H_(cfg.hidden_dim),
        S_(cfg.scales_per_token()),
        payload_(size_t(H_) * dtype_size(cfg.in_dtype)),
        row_(payload_ + sizeof(float) * S_),
        y_row_(size_t(H_) * sizeof(uint16_t)),
        capacity_(int64_t(W_) * cfg.max_tokens),
        most_received_(capacity_ * std::min(k_, E_local_)),
        stream_(static_cast<cudaStream_t>(comm.stream().handle)) {
    PMOE_CHECK(cfg.out_dtype == DType::bf16, "nccl_alltoallv: out_dtype bf16 only");
    PMOE_CUDA_CHECK(cudaSetDevice(comm.device().index));
    ncclUniqueId id{};
    if (rank_ == 0) PMOE_NCCL_HOST_CHECK(api_.GetUniqueId(&id));
    comm.broadcast(std::as_writable_bytes(std::span(&id, 1)), 0);
    PMOE_NCCL_HOST_CHECK(api_.CommInitRank(&nccl_, W_, id, rank_));
    const size_t sent = size_t(cfg.max_tokens) * k_;
    x_ = device_array<std::byte>(size_t(in.m) * payload_);
    x_scale_ = device_array<std::byte>(size_t(in.m) * S_ * sizeof(float));
    weights_ = device_array<float>(size_t(in.m) * k_);
    PMOE_CUDA_CHECK(
        cudaMemcpy(x_, in.x.data<void>(), size_t(in.m) * payload_, cudaMemcpyHostToDevice));
    if (S_)
      PMOE_CUDA_CHECK(cudaMemcpy(x_scale_, in.x_scale.data<void>(),
                                 size_t(in.m) * S_ * sizeof(float), cudaMemcpyHostToDevice));
    PMOE_CUDA_CHECK(cudaMemcpy(weights_, in.weights.data<void>(), size_t(in.m) * k_ * sizeof(float),
                               cudaMemcpyHostToDevice));
    send_ = device_array<std::byte>(sent * row_);
    recv_ = device_array<std::byte>(size_t(most_received_) * row_);
    expert_x_ = device_array<std::byte>(size_t(E_local_) * capacity_ * row_);
    expert_y_ = device_array<std::byte>(size_t(E_local_) * capacity_ * y_row_);
    back_send_ = device_array<std::byte>(size_t(most_received_) * y_row_);
    back_recv_ = device_array<std::byte>(sent * y_row_);
    y_ = device_array<__nv_bfloat16>(size_t(in.m) * H_);
    plan_size_ = size_t(cfg.num_experts) + 2 * size_t(in.m) * k_;
    plan_ = pinned_array<int32_t>(plan_size_);
    plan_device_ = device_array<int32_t>(plan_size_);
    received_ = pinned_array<int32_t>(size_t(W_) * E_local_);
    received_device_ = device_array<int32_t>(size_t(W_) * E_local_);
    slot_ = pinned_array<int32_t>(size_t(most_received_));
    slot_device_ = device_array<int32_t>(size_t(most_received_));
  }

  ~NcclAllToAllV() override {
    cudaStreamSynchronize(stream_);
    if (nccl_) api_.CommDestroy(nccl_);
    for (void* p : {(void*)x_, (void*)x_scale_, (void*)weights_, (void*)send_, (void*)recv_,
                    (void*)expert_x_, (void*)expert_y_, (void*)back_send_, (void*)back_recv_,
                    (void*)y_, (void*)plan_device_, (void*)received_device_, (void*)slot_device_})
      cudaFree(p);
    for (void* p : {(void*)plan_, (void*)received_, (void*)slot_}) cudaFreeHost(p);
  }

  void dispatch() override {
    const int E = cfg_.num_experts, m = in_.m;
    const int32_t* idx = in_.indices.data<int32_t>();
    // The plan: [E] rows per expert | [m * k] position of (t, j) in send_ | [rows] token of each.
    int32_t* per_expert = plan_;
    int32_t* position = plan_ + E;
    int32_t* token_of = position + size_t(m) * k_;
    std::fill(per_expert, per_expert + E, 0);
    for (int i = 0; i < m * k_; ++i)
      if (idx[i] >= 0) ++per_expert[idx[i]];
    std::vector<int32_t> next(size_t(E) + 1, 0);
    for (int e = 0; e < E; ++e) next[size_t(e) + 1] = next[size_t(e)] + per_expert[e];
    send_rows_.assign(size_t(W_), 0);
    for (int e = 0; e < E; ++e) send_rows_[size_t(e / E_local_)] += per_expert[e];
    int rows = 0;
    for (int t = 0; t < m; ++t)
      for (int j = 0; j < k_; ++j) {
        const int e = idx[t * k_ + j];
        position[t * k_ + j] = e < 0 ? -1 : next[size_t(e)]++;
        if (e < 0) continue;
        token_of[position[t * k_ + j]] = t;
        ++rows;
      }
    PMOE_CUDA_CHECK(cudaMemcpyAsync(plan_device_, plan_, plan_size_ * sizeof(int32_t),
                                    cudaMemcpyHostToDevice, stream_));
    const int32_t* token_of_device = plan_device_ + E + size_t(m) * k_;
    launch_copy({send_, row_, nullptr, x_, payload_, token_of_device, rows, payload_}, stream_);
    launch_copy({send_ + payload_, row_, nullptr, x_scale_, S_ * sizeof(float), token_of_device,
                 rows, S_ * sizeof(float)},
                stream_);

    // Counts first: each peer's E_local counts, then wait for them.
    PMOE_NCCL_HOST_CHECK(api_.GroupStart());
    for (int p = 0; p < W_; ++p) {
      PMOE_NCCL_HOST_CHECK(
          api_.Send(plan_device_ + size_t(p) * E_local_, E_local_, ncclInt32, p, nccl_, stream_));
      PMOE_NCCL_HOST_CHECK(api_.Recv(received_device_ + size_t(p) * E_local_, E_local_, ncclInt32,
                                     p, nccl_, stream_));
    }
    PMOE_NCCL_HOST_CHECK(api_.GroupEnd());
    PMOE_CUDA_CHECK(cudaMemcpyAsync(received_, received_device_,
                                    size_t(W_) * E_local_ * sizeof(int32_t), cudaMemcpyDeviceToHost,
                                    stream_));
    PMOE_CUDA_CHECK(cudaStreamSynchronize(stream_));

    // Where each received row goes: (source, expert, token) order to per-expert (source, token).
    recv_rows_.assign(size_t(W_), 0);
    expert_count_.assign(size_t(E_local_), 0);
    int received = 0;
    for (int s = 0; s < W_; ++s)
      for (int e = 0; e < E_local_; ++e)
        for (int i = 0; i < received_[s * E_local_ + e]; ++i, ++received, ++recv_rows_[size_t(s)])
          slot_[received] = int32_t(e * capacity_ + expert_count_[size_t(e)]++);
    PMOE_CUDA_CHECK(cudaMemcpyAsync(slot_device_, slot_, size_t(received) * sizeof(int32_t),
                                    cudaMemcpyHostToDevice, stream_));
    exchange(send_, send_rows_, recv_, recv_rows_, row_);
    launch_copy({expert_x_, row_, slot_device_, recv_, row_, nullptr, received, row_}, stream_);
  }

  void run_experts() override {  // untimed: the stand-in experts on the host
    PMOE_CUDA_CHECK(cudaStreamSynchronize(stream_));
    host_rows_.assign(size_t(E_local_) * capacity_ * row_, std::byte{0});
    std::vector<std::byte> out(size_t(E_local_) * capacity_ * y_row_);
    for (int e = 0; e < E_local_; ++e) {
      const size_t first = size_t(e) * capacity_;
      PMOE_CUDA_CHECK(cudaMemcpy(host_rows_.data() + first * row_, expert_x_ + first * row_,
                                 size_t(expert_count_[size_t(e)]) * row_, cudaMemcpyDeviceToHost));
      for (int i = 0; i < expert_count_[size_t(e)]; ++i) {
        const std::byte* row = host_rows_.data() + (first + i) * row_;
        reference::fake_expert_row(
            cfg_, row, S_ ? reinterpret_cast<const float*>(row + payload_) : nullptr,
            rank_ * E_local_ + e, DType::bf16, out.data() + (first + i) * y_row_);
      }
    }
    PMOE_CUDA_CHECK(cudaMemcpy(expert_y_, out.data(), out.size(), cudaMemcpyHostToDevice));
  }

  void combine() override {
    const int received = std::accumulate(recv_rows_.begin(), recv_rows_.end(), 0);
    launch_copy({back_send_, y_row_, nullptr, expert_y_, y_row_, slot_device_, received, y_row_},
                stream_);
    exchange(back_send_, recv_rows_, back_recv_, send_rows_, y_row_);
    if (in_.m == 0) return;
    const WeightedSum p{y_,
                        reinterpret_cast<const __nv_bfloat16*>(back_recv_),
                        plan_device_ + cfg_.num_experts,
                        weights_,
                        in_.m,
                        k_,
                        H_};
    weighted_sum<<<std::min(in_.m, 1024), 256, 0, stream_>>>(p);
    PMOE_CUDA_CHECK(cudaGetLastError());
  }

  std::string check(const std::vector<AllToAllInputs>& all) override {
    PMOE_CUDA_CHECK(cudaStreamSynchronize(stream_));
    const auto expected = reference::reference_dispatch(cfg_, W_, rank_, all);
    for (int e = 0; e < E_local_; ++e) {
      if (expert_count_[size_t(e)] != expected.counts[size_t(e)])
        return "nccl_alltoallv: wrong row count at local expert " + std::to_string(e);
      for (int i = 0; i < expert_count_[size_t(e)]; ++i)
        if (std::memcmp(host_rows_.data() + (size_t(e) * capacity_ + i) * row_,
                        expected.rows[size_t(e)].data() + size_t(i) * payload_, payload_) != 0)
          return "nccl_alltoallv: wrong row " + std::to_string(i) + " at local expert " +
                 std::to_string(e);
    }
    Buffer y(DType::bf16, {in_.m, H_});
    PMOE_CUDA_CHECK(cudaMemcpy(y.data<void>(), y_, y.nbytes(), cudaMemcpyDeviceToHost));
    return reference::compare_bytes("nccl_alltoallv y", y,
                                    reference::reference_combine(cfg_, in_, DType::bf16));
  }

 private:
  // Rows to and from every peer, in one group: send_rows[p] rows of `bytes` from `from` (peer
  // after peer), recv_rows[p] rows into `to`.
  void exchange(const std::byte* from, const std::vector<int>& send_rows, std::byte* to,
                const std::vector<int>& recv_rows, size_t bytes) {
    size_t sent = 0, got = 0;
    PMOE_NCCL_HOST_CHECK(api_.GroupStart());
    for (int p = 0; p < W_; ++p) {
      const size_t out = size_t(send_rows[size_t(p)]) * bytes,
                   in = size_t(recv_rows[size_t(p)]) * bytes;
      if (out) PMOE_NCCL_HOST_CHECK(api_.Send(from + sent, out, ncclUint8, p, nccl_, stream_));
      if (in) PMOE_NCCL_HOST_CHECK(api_.Recv(to + got, in, ncclUint8, p, nccl_, stream_));
      sent += out;
      got += in;
    }
    PMOE_NCCL_HOST_CHECK(api_.GroupEnd());
  }

  const AllToAllConfig cfg_;
  const AllToAllInputs& in_;
  const cuda::NcclHostApi& api_;
  const int W_, rank_, k_, E_local_, H_, S_;
  const size_t payload_, row_, y_row_;
  const int64_t capacity_, most_received_;
  cudaStream_t stream_;
  ncclComm_t nccl_ = nullptr;
  std::byte *x_ = nullptr, *x_scale_ = nullptr, *send_ = nullptr, *recv_ = nullptr,
            *expert_x_ = nullptr, *expert_y_ = nullptr, *back_send_ = nullptr,
            *back_recv_ = nullptr;
  float* weights_ = nullptr;
  __nv_bfloat16* y_ = nullptr;
  size_t plan_size_ = 0;
  int32_t *plan_ = nullptr, *plan_device_ = nullptr, *received_ = nullptr,
          *received_device_ = nullptr, *slot_ = nullptr, *slot_device_ = nullptr;
  std::vector<int> send_rows_, recv_rows_, expert_count_;  // per peer; per local expert
  std::vector<std::byte> host_rows_;                       // expert_x_, copied back to check
};

}  // namespace

std::string nccl_all_to_all_v_unavailable() {
  try {
    cuda::nccl_host_api();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::unique_ptr<BaselinePath> make_nccl_all_to_all_v_path(Communicator& comm,
                                                          const AllToAllConfig& config,
                                                          const AllToAllInputs& inputs) {
  return std::make_unique<NcclAllToAllV>(comm, config, inputs);
}

}  // namespace pmoe::bench
