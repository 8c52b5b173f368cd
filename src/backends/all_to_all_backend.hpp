// The boundary between AllToAll's front end (validation, phase order) and a backend's data path:
// the CPU's (src/cpu/all_to_all.cpp) or a device's (src/cuda/all_to_all), made through
// src/backends/registry.hpp. A backend sees arguments that were already checked against the config
// and the phase.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "pmoe/all_to_all.hpp"

namespace pmoe::detail {

class SlotTable;  // all_to_all/slot_table.hpp
class LossBoard;  // all_to_all/loss_board.hpp
struct PeerLossNoticed;

struct DispatchArgs {
  Tensor x, x_scale, indices, expert_num_tokens, expert_x, expert_x_scale;
  int m;           // tokens this call (rows of x, or *bound_m on the CPU)
  Tensor bound_m;  // on a device: [1] i32 read by the kernels instead of m; else empty
  bool recv_follows = false;  // Phase::both: the recv comes right after the send
};

struct CombineArgs {
  Tensor expert_y, indices, weights, y;
  int m;           // tokens this call
  Tensor bound_m;  // as in DispatchArgs
  bool recv_follows = false;  // as in DispatchArgs
};

class AllToAllBackend {
 public:
  virtual ~AllToAllBackend() = default;
  virtual void dispatch_send(const DispatchArgs& args) = 0;
  virtual void dispatch_recv(const DispatchArgs& args) = 0;
  virtual void combine_send(const CombineArgs& args) = 0;
  virtual void combine_recv(const CombineArgs& args) = 0;
  virtual size_t workspace_bytes() const = 0;
  virtual AllToAll::RemoteTraffic remote_traffic() const = 0;
  // The in-place buffers (see AllToAll::input_buffer()); empty Tensors when not allocated.
  virtual Tensor input_buffer() const = 0;
  virtual Tensor input_scale_buffer() const = 0;
  virtual Tensor expert_output_buffer() const = 0;
  // After dispatch_send: waits for every peer's send; the rows dispatch_recv will write.
  virtual int64_t arriving_rows() = 0;
  // Throws pmoe::Error if a kernel reported an error (device backends); the CPU reports at once.
  virtual void check_errors() const {}
  // From the next call on: ranks with live[r] == 0 are sent nothing and waited for by no one;
  // `table` maps logical experts to live slots (the CPU's front end applies it on the host, so
  // its backend needs the live ranks only). Called between calls.
  virtual void set_routing(const SlotTable& table, const std::vector<uint8_t>& live) = 0;

  // on_peer_loss = mask: the backend's waits end when `board` has news (LossBoard::watch on the
  // CPU, between a wait's polls; a watcher thread and the kernels' abort word on a device), by
  // throwing LossBoard's PeerLossNoticed from the op's call; `backstop_s` bounds a host wait
  // that the board never ends. The board outlives the backend.
  virtual void set_loss_board(LossBoard& board, double backstop_s) {
    (void)board, (void)backstop_s;
  }
  // After the survivors agreed on a lost peer: the calls in flight are abandoned and the next
  // call is calls_base + 1 on every survivor (its signals carry that epoch).
  virtual void restart_at(int64_t calls_base) { (void)calls_base; }
  // AllToAll::go_on_without: ends this rank's calls in flight (a device's waits, then its stream)
  // and gives the device's call counts, as its own loss would.
  virtual void end_calls(PeerLossNoticed& noticed) const { (void)noticed; }
  // Between calls: the calls this rank has made, `host_count` where the host saw them all (a
  // device's graph replays pass no host count: its kernels count them).
  virtual int64_t calls_made(int64_t host_count) { return host_count; }
  // The symmetric allocations the backend made, in the order it made them: what an op's admit
  // hands to a newcomer in a lost rank's place. Empty where that is not built (a device).
  virtual std::vector<SymmetricMemory*> symmetric_memory() { return {}; }
};

}  // namespace pmoe::detail
