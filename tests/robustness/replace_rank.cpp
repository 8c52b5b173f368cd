// Topology: 4 processes on one node (forked by this program, no launcher), a SocketCommunicator
// over TCP on 127.0.0.1 with node-local shared memory, an AllToAll made with on_peer_loss = mask.
// Rank 2 SIGKILLs itself at a random moment while every rank loops over dispatch/combine calls.
// The survivors get one pmoe::PeerLost naming it and go on without it (each call's dispatch
// checked against the reference in which rank 2 sends nothing), then:
//   1. refuse, before anything moves, an admit of a live rank, of a rank out of range, of
//      themselves, and a SocketCommunicator::admit of a rank whose process lives;
//   2. admit a first newcomer built with another hidden_dim: every rank, newcomer included, gets
//      a pmoe::Error naming the field, and the survivors' op goes on masked (one more call);
//   3. admit a second newcomer with the right config (SocketCommunicator::replacing, then
//      AllToAll's Replacing constructor): from then on every call of every rank, the newcomer's
//      included, equals the plain reference at full size (dispatch rows and counts, combine's y,
//      byte for byte), with one call number on every rank.
// Before the second newcomer, a stray connection reaches rank 0's kept listener and announces
// rank 1: rank 0 closes it and goes on waiting, rather than fail an admission the others complete.
// Each process prints "replace-rank: <who> ok|FAIL <text>"; this driver checks every exit status
// and that none of the run's shared-memory segments is left in /dev/shm.
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "all_to_all_cases.hpp"
#include "comm/shm_segment.hpp"
#include "pmoe/error.hpp"
#include "pmoe/socket_communicator.hpp"
#include "reference/all_to_all_reference.hpp"

namespace {

using pmoe::AllToAll;
using pmoe::AllToAllConfig;
using pmoe::Buffer;
using pmoe::DType;
using pmoe::SocketCommunicator;
using pmoe::Tensor;
using pmoe::detail::cat;
namespace reference = pmoe::reference;

constexpr int kWorld = 4;
constexpr int kVictim = 2;
constexpr int kMaskedCalls = 3;  // calls the survivors make without the victim before admitting
constexpr int kFullCalls = 6;    // calls every rank checks once the group is full again
constexpr uint8_t kSentinel = 0xa5;
constexpr int kConfigError = 3;  // the exit status of the newcomer with the wrong config

[[noreturn]] void leave(const std::string& who, bool ok, const std::string& text,
                        int status = -1) {
  std::printf("replace-rank: %s %s %s\n", who.c_str(), ok ? "ok" : "FAIL", text.c_str());
  std::fflush(stdout);
  _exit(status >= 0 ? status : ok ? 0 : 1);
}

AllToAllConfig make_config(int hidden) {
  AllToAllConfig c = pmoe::testing::make_config(/*max_tokens=*/16, /*experts=*/4 * kWorld,
                                                /*top_k=*/3, hidden);
  c.on_peer_loss = pmoe::OnPeerLoss::mask;
  c.peer_timeout_s = 10;  // a backstop: the pid watch finds a killed peer in about 20 ms
  return c;
}

// One call, numbered `call` (the same on every rank), checked against the reference in which
// the ranks in `silent` send nothing. With nobody silent combine's y is checked too; otherwise
// only dispatch (the dropped experts' share of y is the mask tests' business). "" or what differs.
std::string checked_call(AllToAll& a2a, int rank, int64_t call, const std::vector<int>& silent) {
  const AllToAllConfig& cfg = a2a.config();
  const int W = a2a.world_size(), E_local = a2a.num_local_experts();
  const int64_t rows = int64_t(W) * cfg.max_tokens;
  const uint64_t seed = reference::hash64(11, uint64_t(call));
  std::vector<reference::AllToAllInputs> all;
  for (int r = 0; r < W; ++r) {
    const bool quiet = std::find(silent.begin(), silent.end(), r) != silent.end();
    const int m = quiet ? 0 : int(reference::hash64(seed, uint64_t(r)) % (cfg.max_tokens + 1));
    all.push_back(reference::make_inputs(cfg, r, m, seed, reference::Routing::random));
  }
  const reference::AllToAllInputs& mine = all[size_t(rank)];
  Buffer counts(DType::i32, {E_local});
  Buffer expert_x(cfg.in_dtype, {E_local, rows, cfg.hidden_dim});
  Buffer expert_y(DType::bf16, {E_local, rows, cfg.hidden_dim});
  Buffer y(cfg.out_dtype, {mine.m, cfg.hidden_dim});
  std::memset(expert_x.tensor().data<void>(), kSentinel, expert_x.tensor().nbytes());
  a2a.dispatch(mine.x, Tensor(), mine.indices, counts, expert_x, Tensor());
  std::string error = reference::compare_dispatch(
      cfg, W, reference::reference_dispatch(cfg, W, rank, all), counts, expert_x, Tensor(),
      kSentinel);
  reference::run_fake_experts(cfg, W, rank, counts, expert_x, Tensor(), expert_y);
  a2a.combine(expert_y, mine.indices, mine.weights, y);
  if (error.empty() && silent.empty())
    error = reference::compare_bytes("combine y", y,
                                     reference::reference_combine(cfg, mine, DType::bf16));
  return error.empty() ? "" : cat("call ", call, ": ", error);
}

// Expects `run` to throw a pmoe::Error whose text holds `words`; "" or what went wrong.
std::string refused(const char* what, const std::function<void()>& run, const char* words) {
  try {
    run();
  } catch (const pmoe::Error& e) {
    if (std::strstr(e.what(), words)) return "";
    return cat(what, ": the error does not say '", words, "': ", e.what());
  }
  return cat(what, " was not refused");
}

// Every rank's full-size calls once the group is full again, then a barrier with everyone.
std::string full_calls(SocketCommunicator& comm, AllToAll& a2a, int rank) {
  for (int i = 0; i < kFullCalls; ++i) {
    const std::string error = checked_call(a2a, rank, a2a.calls_started() + 1, {});
    if (!error.empty()) return error;
  }
  comm.barrier();
  return "";
}

void survivor(SocketCommunicator::Listener listener, int rank,
              const std::vector<std::string>& addresses, const std::vector<std::string>& nodes,
              const std::string& job) {
  const std::string who = cat("rank ", rank);
  std::string error;
  int losses = 0;
  try {
    SocketCommunicator comm(std::move(listener), rank, addresses, nodes, job);
    AllToAll a2a(comm, make_config(64));
    // Calls until the loss, then kMaskedCalls without the victim (its slots masked).
    int masked_calls = 0;
    for (int i = 0; masked_calls < kMaskedCalls; ++i) {
      if (i > 100000) leave(who, false, "the victim never died");
      const bool victim_masked = !a2a.rank_mask().live[kVictim];
      const int64_t call = a2a.calls_started() + 1;
      try {
        error = checked_call(a2a, rank, call, victim_masked ? std::vector<int>{kVictim}
                                                            : std::vector<int>{});
        // A call before the loss may return the victim's rows and still be declared lost
        // by the agreement (a survivor waited in it): judged only once the loss is known.
        if (!error.empty() && victim_masked) leave(who, false, error);
        if (victim_masked) ++masked_calls;
      } catch (const pmoe::PeerLost& lost) {
        ++losses;
        if (lost.ranks() != std::vector<int>{kVictim})
          leave(who, false, cat("a PeerLost that does not name rank 2 alone: ", lost.what()));
      }
    }
    if (losses != 1) leave(who, false, cat(losses, " PeerLost where one was due"));

    // 1. Bad input, refused before anything moves.
    const int live_peer = rank == 0 ? 1 : 0;
    for (const std::string& e :
         {refused("AllToAll::admit of a live rank", [&] { a2a.admit(live_peer); }, "is live"),
          refused("AllToAll::admit out of range", [&] { a2a.admit(kWorld); }, "outside"),
          refused("SocketCommunicator::admit of itself", [&] { comm.admit(rank); }, "itself"),
          refused("SocketCommunicator::admit out of range", [&] { comm.admit(-1); }, "outside"),
          refused("SocketCommunicator::admit of a live process", [&] { comm.admit(live_peer); },
                  "still open")})
      if (!e.empty()) leave(who, false, e);

    // 2. A newcomer with another config: refused on every rank; the op goes on masked.
    comm.admit(kVictim);
    const std::string wrong =
        refused("AllToAll::admit of a newcomer with another hidden_dim",
                [&] { a2a.admit(kVictim); }, "hidden_dim");
    if (!wrong.empty()) leave(who, false, wrong);
    if (a2a.rank_mask().live[kVictim]) leave(who, false, "a refused admit unmasked rank 2");
    error = checked_call(a2a, rank, a2a.calls_started() + 1, {kVictim});
    if (!error.empty()) leave(who, false, "after the refused newcomer: " + error);

    // 3. The right newcomer. Its predecessor's connection closes when it exits: until then the
    // communicator refuses, saying so.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    for (;;) {
      try {
        comm.admit(kVictim);
        break;
      } catch (const pmoe::Error& e) {
        if (!std::strstr(e.what(), "still open") || std::chrono::steady_clock::now() > deadline)
          throw;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
    a2a.admit(kVictim);
    if (!a2a.rank_mask().live[kVictim]) leave(who, false, "rank 2 is still masked");
    const int64_t next = a2a.calls_started() + 1;
    error = full_calls(comm, a2a, rank);
    if (!error.empty()) leave(who, false, "full group: " + error);
    leave(who, true, cat("full again from call ", next));
  } catch (const std::exception& e) {
    leave(who, false, cat("threw: ", e.what()));
  }
}

void newcomer(SocketCommunicator::Listener listener, std::vector<std::string> addresses,
              const std::vector<std::string>& nodes, const std::string& job, int hidden) {
  const std::string who = hidden == 64 ? "newcomer" : "wrong newcomer";
  try {
    addresses[kVictim] = cat("127.0.0.1:", listener.port());
    auto comm = SocketCommunicator::replacing(std::move(listener), kVictim, addresses, nodes, job);
    std::unique_ptr<AllToAll> a2a;
    try {
      a2a = std::make_unique<AllToAll>(*comm, make_config(hidden), AllToAll::Replacing{});
    } catch (const pmoe::Error& e) {
      if (hidden != 64 && std::strstr(e.what(), "hidden_dim"))
        leave(who, true, "refused as expected", kConfigError);
      throw;
    }
    if (hidden != 64) leave(who, false, "a newcomer with another hidden_dim was taken");
    const int64_t next = a2a->calls_started() + 1;
    const std::string error = full_calls(*comm, *a2a, kVictim);
    if (!error.empty()) leave(who, false, error);
    leave(who, true, cat("joined at call ", next));
  } catch (const std::exception& e) {
    leave(who, false, cat("threw: ", e.what()));
  }
}

// Forks fn into a child; returns its pid.
pid_t spawn(const std::function<void()>& fn) {
  const pid_t pid = fork();
  if (pid < 0) leave("driver", false, "fork failed");
  if (pid == 0) {
    fn();
    _exit(1);
  }
  return pid;
}

// Waits for `pid` for at most `seconds`; its wait status, or -1 on timeout (then it is killed).
int wait_for(pid_t pid, double seconds) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  for (;;) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) return status;
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

// A TCP connection to "host:port" that announces `rank` as a newcomer would (4 bytes); its fd.
int stray_connection(const std::string& address, int32_t rank) {
  const size_t colon = address.rfind(':');
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(uint16_t(std::atoi(address.c_str() + colon + 1)));
  inet_pton(AF_INET, address.substr(0, colon).c_str(), &to.sin_addr);
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0 || connect(fd, reinterpret_cast<const sockaddr*>(&to), sizeof to) != 0 ||
      write(fd, &rank, sizeof rank) != ssize_t(sizeof rank))
    leave("driver", false, "the stray connection failed");
  return fd;
}

std::vector<std::string> segments_left(const std::string& prefix) {
  std::vector<std::string> left;
  if (DIR* dir = opendir("/dev/shm")) {
    while (dirent* entry = readdir(dir))
      if (std::strncmp(entry->d_name, prefix.c_str(), prefix.size()) == 0)
        left.push_back(entry->d_name);
    closedir(dir);
  }
  return left;
}

}  // namespace

int main(int argc, char** argv) {
  const unsigned seed = argc > 1 ? unsigned(std::atoi(argv[1])) : unsigned(getpid());
  const std::string job = cat("replace.", getpid());
  const std::vector<std::string> nodes(kWorld, "n0");
  std::vector<std::string> addresses(kWorld);
  std::vector<SocketCommunicator::Listener> listeners;
  for (int r = 0; r < kWorld; ++r) {
    listeners.emplace_back("127.0.0.1");
    addresses[size_t(r)] = cat("127.0.0.1:", listeners.back().port());
  }
  std::vector<pid_t> ranks;
  for (int r = 0; r < kWorld; ++r)
    ranks.push_back(spawn([&, r] {
      for (int other = 0; other < kWorld; ++other)  // each child keeps its own listener only
        if (other != r) SocketCommunicator::Listener(std::move(listeners[size_t(other)]));
      if (r == kVictim) {  // dies 100 to 400 ms after its op is made, in whatever call it is in
        SocketCommunicator comm(std::move(listeners[size_t(r)]), r, addresses, nodes, job);
        AllToAll a2a(comm, make_config(64));
        std::mt19937 random(seed);
        const int delay_ms = 100 + int(random() % 300);
        std::thread([delay_ms] {
          std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
          raise(SIGKILL);
        }).detach();
        for (;;) checked_call(a2a, r, a2a.calls_started() + 1, {});
      }
      survivor(std::move(listeners[size_t(r)]), r, addresses, nodes, job);
    }));
  listeners.clear();  // the children hold them now

  bool ok = true;
  auto expect = [&](bool good, const std::string& text) {
    if (!good) std::printf("replace-rank: driver FAIL %s\n", text.c_str());
    ok = ok && good;
  };
  const int victim_status = wait_for(ranks[kVictim], 60);
  expect(victim_status >= 0 && WIFSIGNALED(victim_status) && WTERMSIG(victim_status) == SIGKILL,
         "the victim did not die by SIGKILL");
  // Each newcomer opens its listener here, before the fork, as a launcher would hand it over.
  const int wrong_status = wait_for(
      spawn([&] { newcomer(SocketCommunicator::Listener("127.0.0.1"), addresses, nodes, job, 32); }),
      60);
  expect(wrong_status >= 0 && WIFEXITED(wrong_status) && WEXITSTATUS(wrong_status) == kConfigError,
         "the newcomer with another config was not refused");
  const int stray = stray_connection(addresses[0], 1);
  const pid_t right = spawn(
      [&] { newcomer(SocketCommunicator::Listener("127.0.0.1"), addresses, nodes, job, 64); });
  const int right_status = wait_for(right, 60);
  close(stray);
  expect(right_status >= 0 && WIFEXITED(right_status) && WEXITSTATUS(right_status) == 0,
         "the newcomer failed");
  for (int r = 0; r < kWorld; ++r) {
    if (r == kVictim) continue;
    const int status = wait_for(ranks[size_t(r)], 30);
    expect(status >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0,
           cat("rank ", r, " failed"));
  }
  const std::vector<std::string> left = segments_left(pmoe::detail::shm_prefix() + ".");
  expect(left.empty(), cat(left.size(), " shared-memory segment(s) left in /dev/shm, e.g. ",
                           left.empty() ? "" : left[0]));
  std::printf("replace-rank: driver %s (seed %u)\n", ok ? "ok" : "FAIL", seed);
  return ok ? 0 : 1;
}
