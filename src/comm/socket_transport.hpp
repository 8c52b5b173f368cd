// A full mesh of TCP connections between the ranks of a SocketCommunicator: it carries the
// set-up collectives (all_gather, broadcast, barrier) between every pair, and the puts and
// signals to peers on other nodes, which the target applies to its own symmetric memory whenever
// it polls (every pmoe wait polls), as MpiTransport does with MPI messages.
//
// Why TCP and not the launcher's own engine (torch.distributed's gloo): pmoe's waits run in C++
// with the GIL released, on any thread of a rank; calling back into Python there would take the
// GIL on a data path, and gloo's point-to-point calls have no one-sided put and no bounded wait.
// The launcher is used once, to exchange the listening addresses (python/pmoe/torch/).
//
// Wire format, per connection, in order: frames of a Header followed by `bytes` of payload.
// TCP keeps a connection's bytes in order, so a signal is applied after the puts before it.
// Every socket is non-blocking; a send that finds the socket full reads incoming frames while it
// waits, so two ranks sending large puts to each other never block each other.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <vector>

namespace pmoe::detail {

class SocketTransport {
 public:
  // Collective. `listen_fd` is this rank's listening socket (taken over: closed on destruction);
  // `addresses[r]` is rank r's "host:port". Connects to the lower ranks and accepts the higher
  // ones, within `timeout_s`.
  SocketTransport(int listen_fd, int rank, std::vector<std::string> addresses, double timeout_s);
  // A process in lost rank `rank`'s place: connects to every other rank (each accepts it in
  // accept_replacement), within `timeout_s`. Keeps `listen_fd` for a later replacement of a peer.
  struct Replacing {};
  SocketTransport(Replacing, int listen_fd, int rank, std::vector<std::string> addresses,
                  double timeout_s);
  ~SocketTransport();
  SocketTransport(const SocketTransport&) = delete;
  SocketTransport& operator=(const SocketTransport&) = delete;

  // Makes allocation `serial` (data at `base`, signals at `signals`) a target for puts.
  void add_region(uint64_t serial, std::byte* base, uint64_t* signals);
  void remove_region(uint64_t serial);

  // Return once `src` may be reused (its bytes are in the kernel's socket buffer).
  void put(int peer, uint64_t serial, size_t offset, const void* src, size_t bytes);
  void signal(int peer, uint64_t serial, int slot, uint64_t value);

  // Set-up messages: send `bytes` to `peer`; receive the next one `peer` sent (bounded wait;
  // `what` names the collective for the error).
  void send_message(int peer, std::span<const std::byte> bytes);
  std::vector<std::byte> receive_message(int peer, const char* what);

  // Applies every frame that has arrived. Throws pmoe::Error if a peer closed its connection.
  void progress();

  // Whether `peer`'s connection is open (after reading what has arrived: a peer whose process
  // ended has had its connection closed by the kernel).
  bool connected(int peer);
  // Accepts, on this rank's listener, the connection of the process that takes `peer`'s place
  // (bounded by the timeout), in place of the old one, which must be closed. What the old one
  // left unread is dropped.
  void accept_replacement(int peer);

 private:
  struct Header {
    uint64_t kind;  // Kind
    uint64_t serial, offset, bytes, slot, value;
  };
  enum Kind : uint64_t { kPut = 1, kSignal = 2, kMessage = 3 };
  struct Region {
    std::byte* base;
    uint64_t* signals;
  };
  // What has arrived of the frame being read from one peer.
  struct Incoming {
    Header header{};
    size_t header_done = 0;
    size_t payload_done = 0;
    std::byte* into = nullptr;       // where the payload goes
    std::vector<std::byte> message;  // a set-up message's payload
  };

  void send_frame(int peer, const Header& header, const void* payload);
  void write_all(int peer, const std::byte* data, size_t bytes);
  bool read_some(int peer);  // true while bytes keep coming
  void frame_header_done(int peer);
  void frame_done(int peer);

  int rank_;
  double timeout_s_;
  int listen_fd_;
  std::vector<int> fds_;  // per peer; -1 for this rank
  std::vector<Incoming> incoming_;
  std::vector<std::deque<std::vector<std::byte>>> messages_;  // set-up messages, per peer
  std::map<uint64_t, Region> regions_;
  std::vector<std::byte> discard_;  // payloads for regions already freed
  std::string closed_;              // set once a peer closed its connection
  std::recursive_mutex mutex_;      // a rank's threads may wait (and poll) at once
};

}  // namespace pmoe::detail
