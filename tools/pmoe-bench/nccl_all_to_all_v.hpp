// `pmoe-bench all-to-all --device cuda`'s row nccl_alltoallv: the all-to-all-v a user of NCCL
// writes, over the same inputs, stand-in experts and reference check as pmoe's rows. It moves the
// same routed rows with grouped ncclSend/ncclRecv, counts first, as the CPU's alltoallv row does
// with MPI (all_to_all_baselines.hpp):
//   dispatch: sort this rank's (token, slot) pairs by expert on the host (a counting sort of the
//             routing, stable in token order), gather their rows (payload, then scales) into one
//             send buffer by destination rank (a kernel), exchange the per-(rank, local expert)
//             counts, wait for them (the rows' sizes come from them), exchange the rows, then
//             regroup the received rows per local expert, in (source rank, token) order (a kernel);
//   combine:  gather the expert outputs back into the order the rows came in (a kernel), exchange
//             them back, and sum y[t] = sum_j weight[t, j] * row(t, j) in f32, in slot order, with
//             separate roundings, as pmoe's combine does (a kernel).
// All of it on the rank's stream, host work included in the time (the counts are awaited mid-way).
// NCCL is loaded at run time, from the file the GIN path would take (src/cuda/transport/
// nccl_api.hpp: PMOE_NCCL_LIBRARY, else one already loaded, else the one CMake found, else the
// loader's libnccl.so.2), but through nccl_host_api(): the row calls NCCL's host API only, so any
// NCCL 2 runs it (the toolkit's 2.28 under 2.30 headers too); the release check that binds the GIN
// kernels to their headers' NCCL is not this row's.
#pragma once

#include <memory>
#include <string>

#include "all_to_all_baselines.hpp"

namespace pmoe::bench {

// Why this rank cannot run the row ("" where it can): a build without NCCL's headers, or no
// NCCL 2 libnccl that loads. Not collective; the caller agrees across ranks.
std::string nccl_all_to_all_v_unavailable();

// Collective over a communicator whose ranks are on distinct GPUs (NCCL refuses two ranks of one
// communicator on one GPU): makes the NCCL communicator and the buffers. in_dtype bf16 or f8e4m3;
// out_dtype bf16. Throws pmoe::Error where nccl_all_to_all_v_unavailable() is not "".
std::unique_ptr<BaselinePath> make_nccl_all_to_all_v_path(Communicator& comm,
                                                          const AllToAllConfig& config,
                                                          const reference::AllToAllInputs& inputs);

}  // namespace pmoe::bench
