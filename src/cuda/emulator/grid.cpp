// Grids, blocks and threads of the emulated device.
//
//   device d:  FIFO of launches  ->  resident_blocks host threads ("slots"), each taking the
//              next block of the oldest launch that has blocks left
//   block:     blockDim fibers (Boost.Context) on the slot's host thread, run in turns; a fiber
//              runs until __syncthreads(), __nanosleep() or its end, then the next one runs
//
// The order of the fibers in each pass, and of the blocks, is the schedule's (schedule.hpp:
// PMOE_EMU_SCHEDULE); by default, after every barrier the fibers resume in a new pseudo-random
// order, so a kernel that reads __shared__ before the barrier that should guard it sees another
// thread's stale value, as it would on a GPU where warps run in any order. Late stores
// (late_stores.hpp) are told of every barrier, block end and kernel end. A pass in which every runnable fiber only slept
// (all are waiting on something outside the block) backs off: first yields, then short sleeps,
// so the ranks they wait for get the cores.
//
// Sanitizers: fiber switches are announced to AddressSanitizer (__sanitizer_start_switch_fiber);
// what ThreadSanitizer sees is said above struct Fiber.
#include "cuda/emulator/grid.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <boost/context/fiber.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <exception>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cuda/emulator/device_api.hpp"
#include "cuda/emulator/kernel_counts.hpp"
#include "cuda/emulator/late_stores.hpp"
#include "cuda/emulator/schedule.hpp"
#include "cuda/emulator/shared_memory.hpp"

#if defined(__SANITIZE_ADDRESS__)
#define PMOE_EMU_ASAN 1
#endif
#if defined(__SANITIZE_THREAD__)
#define PMOE_EMU_TSAN 1
#endif
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define PMOE_EMU_ASAN 1
#endif
#if __has_feature(thread_sanitizer)
#define PMOE_EMU_TSAN 1
#endif
#endif

#if defined(PMOE_EMU_ASAN)
#include <sanitizer/common_interface_defs.h>
#endif
#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>  // client requests: nothing unless run under valgrind
#define PMOE_EMU_VALGRIND 1
#else
#define PMOE_EMU_VALGRIND 0
#endif

namespace pmoe::emu {

thread_local ThreadState* current_thread = nullptr;

namespace {

namespace ctx = boost::context;

int env_int(const char* name, int fallback, int lo, int hi) {
  const char* text = std::getenv(name);
  if (!text || !*text) return fallback;
  const int value = std::atoi(text);
  return value < lo ? lo : value > hi ? hi : value;
}

// Sanitizer-sized stacks: instrumented frames are several times larger.
#if defined(PMOE_EMU_ASAN) || defined(PMOE_EMU_TSAN)
constexpr size_t kStackBytes = size_t(256) << 10;
#else
constexpr size_t kStackBytes = size_t(64) << 10;
#endif
constexpr unsigned kMaxBlockThreads = 1024;

// A fiber's stack (lowest usable address), kept for the life of the process like the fiber; a
// guard page below it turns an overflow into a fault instead of a silent overwrite.
std::byte* new_fiber_stack() {
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  void* base = mmap(nullptr, kStackBytes + page, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) throw std::bad_alloc();
  mprotect(base, page, PROT_NONE);
  std::byte* bottom = static_cast<std::byte*>(base) + page;
#if PMOE_EMU_VALGRIND
  // Told to valgrind, which otherwise takes a switch onto it for a huge frame of its host
  // thread's stack and reports the scheduler's own words as never written (cuda.memcheck.*).
  VALGRIND_STACK_REGISTER(bottom, bottom + kStackBytes);
#endif
  return bottom;
}

// ThreadSanitizer is not told about the fibers: to it, a block is one thread, so the threads of
// a block never race in its eyes (barriers are judged by the fiber order and its reshuffles), and
// it judges what crosses blocks, kernels, streams, ranks and host threads. Announcing each switch
// (__tsan_switch_to_fiber) would give the same verdicts at a cost of minutes per test, since this
// TSan's vector clocks grow with every fiber it knows. The price: in a report, the frames below
// the racing access may belong to another fiber of the block.

struct Fiber {
  enum class Status { ready, at_barrier, at_warp_exchange, done };
  ThreadState state{};
  Status status = Status::ready;
  bool slept = false;  // its last turn ended in __nanosleep (no progress)
  int64_t serial_steps = 0;  // count_serial_steps() of this thread in the block now running
  int64_t bytes_read = 0, bytes_written = 0;  // count_bytes_*() of this thread, this block
  int system_fences = 0;
  ctx::fiber context;  // the fiber while it is suspended (the scheduler's side)
  ctx::fiber caller;   // the scheduler while the fiber runs (the fiber's side)
  std::byte* stack = nullptr;
  void* asan_fake_stack = nullptr;
};

// Hands Boost.Context the stack the runner already took for the fiber.
struct GivenStack {
  std::byte* bottom;
  ctx::stack_context allocate() {
    ctx::stack_context sc;
    sc.size = kStackBytes;
    sc.sp = bottom + kStackBytes;
    return sc;
  }
  void deallocate(ctx::stack_context&) noexcept {}  // never called: fibers never end
};

// Runs blocks on one slot's host thread.
class BlockRunner {
 public:
  BlockRunner() : fibers_(new Fiber[kMaxBlockThreads]), order_(kMaxBlockThreads) {}

  // Runs one block; returns the first exception a thread threw, if any.
  std::exception_ptr run(const cuda_api::dim3& grid, const cuda_api::dim3& block,
                         const cuda_api::uint3& block_idx, const std::function<void()>& body,
                         uint64_t seed, LaunchHeldStores& held, BlockCounts& counts) {
    const unsigned n = block.x * block.y * block.z;
    counts_ = {};
    for (Warp& w : warps_) w.arrived = w.exchanges = 0;
    size_ = n;
    body_ = &body;
    failure_ = nullptr;
    alive_ = n;
    arrived_ = 0;
    arrived_true_ = 0;
    rng_.seed(seed);
    for (unsigned i = 0; i < n; ++i) {
      Fiber& f = fibers_[i];
      f.state.thread_idx = {i % block.x, (i / block.x) % block.y, i / (block.x * block.y)};
      f.state.block_idx = block_idx;
      f.state.block_dim = block;
      f.state.grid_dim = grid;
      f.status = Fiber::Status::ready;
      f.slept = false;
      f.serial_steps = 0;
      f.bytes_read = f.bytes_written = 0;
      f.system_fences = 0;
      if (!f.stack) {  // a fiber per thread index, made once and kept for every later block
        f.stack = new_fiber_stack();
        f.context = ctx::fiber(std::allocator_arg, GivenStack{f.stack}, [this, &f](ctx::fiber&& caller) {
          return fiber_main(f, std::move(caller));
        });
      }
    }
    fill_shared_memory_with_garbage();  // what an earlier block left, as on a GPU
    late_stores_block_start(held);
    order_fibers(order_, n, /*first=*/true, rng_);
    int idle_passes = 0;
    while (alive_ > 0) {
      bool progressed = false;
      reshuffle_ = false;
      for (unsigned i = 0; i < n && !reshuffle_; ++i) {
        Fiber& f = fibers_[order_[i]];
        if (f.status != Fiber::Status::ready) continue;
        resume(f);
        progressed = progressed || !f.slept;
      }
      if (reshuffle_) order_fibers(order_, n, /*first=*/false, rng_);
      if (progressed) {
        idle_passes = 0;
      } else if (++idle_passes < 64) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
    }
    current_thread = nullptr;
    late_stores_block_end(held);
    for (unsigned i = 0; i < n; ++i) {
      counts_.serial_steps = std::max(counts_.serial_steps, fibers_[i].serial_steps);
      counts_.bytes_read += fibers_[i].bytes_read;
      counts_.bytes_written += fibers_[i].bytes_written;
      counts_.system_fences += fibers_[i].system_fences;
    }
    counts = counts_;
    return failure_;
  }

  // Called on a fiber's stack.
  void barrier(Fiber& f, bool predicate) {
    f.status = Fiber::Status::at_barrier;
    arrived_true_ += predicate ? 1 : 0;
    ++arrived_;
    release_if_all_arrived();
    suspend(f);
  }
  int barrier_count() const { return barrier_result_; }
  void nap(Fiber& f) {
    counts_.spun = true;
    f.slept = true;
    suspend(f);
  }
  Fiber* running() { return running_; }
  void note_wait_on_own_grid() { counts_.waited_on_own_grid = true; }

  // Called on a fiber's stack: every live lane of the calling thread's warp (32 consecutive
  // thread indices) hands in a word, and each gets back the word of lane `source` (its own when
  // `source` is out of the warp). The lanes wait for each other as at a barrier of the warp; the
  // words of two exchanges in a row go to two buffers, since a lane may hand in the next one
  // before a slower lane has read this one.
  uint64_t warp_exchange(Fiber& f, uint64_t word, int source) {
    const unsigned me = unsigned(&f - fibers_.get()), warp = me / kWarp, lane = me % kWarp;
    Warp& w = warps_[warp];
    const unsigned buffer = w.exchanges & 1u;
    w.words[buffer][lane] = word;
    ++w.arrived;
    if (!release_warp_if_all_arrived(warp)) {
      f.status = Fiber::Status::at_warp_exchange;
      suspend(f);
    }
    const unsigned first = warp * kWarp;
    const bool inside = source >= 0 && unsigned(source) < kWarp && first + unsigned(source) < size_;
    return w.words[buffer][inside ? unsigned(source) : lane];
  }

 private:
  static constexpr unsigned kWarp = 32;
  struct Warp {
    uint64_t words[2][kWarp];
    unsigned arrived = 0;    // lanes at the exchange now
    unsigned exchanges = 0;  // exchanges completed: picks the buffer
  };

  // Lets the warp's lanes go on once every live one has handed in its word. True if it did.
  bool release_warp_if_all_arrived(unsigned warp) {
    Warp& w = warps_[warp];
    const unsigned first = warp * kWarp, end = std::min(size_, first + kWarp);
    unsigned live = 0;
    for (unsigned i = first; i < end; ++i) live += fibers_[i].status != Fiber::Status::done;
    if (w.arrived == 0 || w.arrived != live) return false;
    for (unsigned i = first; i < end; ++i)
      if (fibers_[i].status == Fiber::Status::at_warp_exchange) fibers_[i].status = Fiber::Status::ready;
    w.arrived = 0;
    ++w.exchanges;
    return true;
  }

  void release_if_all_arrived() {
    if (arrived_ == 0 || arrived_ != alive_) return;
    for (unsigned i = 0; i < size_; ++i) {
      Fiber& f = fibers_[i];
      if (f.status == Fiber::Status::at_barrier) f.status = Fiber::Status::ready;
    }
    barrier_result_ = int(arrived_true_);
    ++counts_.barrier_rounds;
    arrived_ = 0;
    arrived_true_ = 0;
    reshuffle_ = true;
    late_stores_barrier_passed();
  }

  void resume(Fiber& f) {
    running_ = &f;
    current_thread = &f.state;
    f.slept = false;
#if defined(PMOE_EMU_ASAN)
    __sanitizer_start_switch_fiber(&scheduler_fake_stack_, f.stack, kStackBytes);
#endif
    f.context = std::move(f.context).resume();
#if defined(PMOE_EMU_ASAN)
    __sanitizer_finish_switch_fiber(scheduler_fake_stack_, nullptr, nullptr);
#endif
    running_ = nullptr;
  }

  void suspend(Fiber& f) {
#if defined(PMOE_EMU_ASAN)
    __sanitizer_start_switch_fiber(&f.asan_fake_stack, scheduler_stack_bottom_,
                                   scheduler_stack_size_);
#endif
    f.caller = std::move(f.caller).resume();
#if defined(PMOE_EMU_ASAN)
    __sanitizer_finish_switch_fiber(f.asan_fake_stack, &scheduler_stack_bottom_,
                                    &scheduler_stack_size_);
#endif
  }

  // A fiber never returns: it runs its thread of one block after another, parked in between.
  // (A returning fiber would leave Boost.Context's entry frame on ThreadSanitizer's shadow
  // stack every time, until it overflows.)
  [[noreturn]] ctx::fiber fiber_main(Fiber& f, ctx::fiber&& caller) {
#if defined(PMOE_EMU_ASAN)
    __sanitizer_finish_switch_fiber(nullptr, &scheduler_stack_bottom_, &scheduler_stack_size_);
#endif
    f.caller = std::move(caller);
    for (;;) {
      try {
        (*body_)();
      } catch (...) {
        if (!failure_) failure_ = std::current_exception();
      }
      f.status = Fiber::Status::done;
      --alive_;
      release_if_all_arrived();  // threads that returned no longer hold a barrier back
      release_warp_if_all_arrived(unsigned(&f - fibers_.get()) / kWarp);  // nor an exchange
      suspend(f);                // until the scheduler hands it the same thread of a new block
    }
  }

  std::unique_ptr<Fiber[]> fibers_;
  std::vector<unsigned> order_;
  unsigned size_ = 0;  // threads in the block now running
  const std::function<void()>* body_ = nullptr;
  std::exception_ptr failure_;  // written by a fiber, read after the block's end
  Fiber* running_ = nullptr;
  unsigned alive_ = 0, arrived_ = 0, arrived_true_ = 0;
  int barrier_result_ = 0;
  BlockCounts counts_;  // of the block now running
  Warp warps_[kMaxBlockThreads / kWarp];
  bool reshuffle_ = false;
  std::minstd_rand rng_;
  void* scheduler_fake_stack_ = nullptr;
  const void* scheduler_stack_bottom_ = nullptr;
  size_t scheduler_stack_size_ = 0;
};

thread_local BlockRunner* current_runner = nullptr;

// One launch in a device's queue.
struct Launch {
  Launch(cuda_api::dim3 g, cuda_api::dim3 b, const std::function<void()>* f, unsigned blocks,
         uint64_t launch_number)
      : grid(g), block(b), body(f), total(blocks), number(launch_number),
        order(launch_number, blocks) {}
  cuda_api::dim3 grid, block;
  const std::function<void()>* body;
  unsigned total = 0, next = 0, finished = 0;  // blocks; guarded by the device's mutex
  std::exception_ptr failure;
  uint64_t number = 0;  // the launching host thread's count of launches (the schedule's seed)
  BlockOrder order;     // the order in which blocks start
  LaunchHeldStores held;
  LaunchCounts counts;  // guarded by the device's mutex
};

class Device {
 public:
  explicit Device(int slots) {
    for (int i = 0; i < slots; ++i) std::thread([this] { slot_main(); }).detach();
  }

  void run(Launch& launch) {
    std::unique_lock lock(mutex_);
    queue_.push_back(&launch);
    work_.notify_all();
    done_.wait(lock, [&] { return launch.finished == launch.total; });
  }

 private:
  // Slots live as long as the process (devices are never destroyed).
  void slot_main() {
    BlockRunner runner;
    current_runner = &runner;
    std::unique_lock lock(mutex_);
    for (;;) {
      work_.wait(lock, [&] { return !queue_.empty(); });
      Launch& launch = *queue_.front();
      const unsigned index = launch.order.at(launch.next++);
      if (launch.next == launch.total) queue_.pop_front();
      lock.unlock();
      const cuda_api::dim3& g = launch.grid;
      const cuda_api::uint3 block_idx{index % g.x, (index / g.x) % g.y, index / (g.x * g.y)};
      BlockCounts counts;
      std::exception_ptr failure =
          runner.run(launch.grid, launch.block, block_idx, *launch.body,
                     block_seed(launch.number, index), launch.held, counts);
      lock.lock();
      launch.counts.add(counts);
      if (failure && !launch.failure) launch.failure = failure;
      if (++launch.finished == launch.total) done_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable work_, done_;
  std::deque<Launch*> queue_;
};

Device& device(int index) {
  static std::vector<Device*> devices = [] {
    std::vector<Device*> all(size_t(device_shape().devices), nullptr);
    return all;
  }();
  static std::mutex mutex;
  std::lock_guard lock(mutex);
  Device*& d = devices[size_t(index)];
  if (!d) d = new Device(device_shape().resident_blocks());  // never freed: slots outlive main
  return *d;
}

}  // namespace

const DeviceShape& device_shape() {
  static const DeviceShape shape{env_int("PMOE_EMU_DEVICES", 4, 1, 64),
                                 env_int("PMOE_EMU_SMS", 4, 1, 1024),
                                 env_int("PMOE_EMU_BLOCKS_PER_SM", 4, 1, 64)};
  return shape;
}

cuda_api::cudaError_t run_grid(int device_index, cuda_api::dim3 grid, cuda_api::dim3 block,
                               const std::function<void()>& body, uint64_t launch_number,
                               const char* name) {
  const uint64_t blocks = uint64_t(grid.x) * grid.y * grid.z;
  const uint64_t threads = uint64_t(block.x) * block.y * block.z;
  if (blocks == 0 || threads == 0 || threads > kMaxBlockThreads || blocks > (1u << 31))
    return cuda_api::cudaErrorInvalidConfiguration;
  if (device_index < 0 || device_index >= device_shape().devices)
    return cuda_api::cudaErrorInvalidDevice;
  if (!schedule().valid) return cuda_api::cudaErrorInvalidValue;  // said once, on stderr
  Launch launch(grid, block, &body, unsigned(blocks), launch_number);
  device(device_index).run(launch);
  launch.held.kernel_end();
  record_launch(name, launch.counts);
  if (launch.failure) {
    const std::string settings = describe_device_settings();
    try {
      std::rethrow_exception(launch.failure);
    } catch (const std::exception& e) {
      fprintf(stderr, "pmoe emulated device (%s): a kernel thread threw: %s\n", settings.c_str(),
              e.what());
    } catch (...) {
      fprintf(stderr, "pmoe emulated device (%s): a kernel thread threw\n", settings.c_str());
    }
    return cuda_api::cudaErrorLaunchFailure;
  }
  return cuda_api::cudaSuccess;
}

void sync_threads() {
  BlockRunner* runner = current_runner;
  runner->barrier(*runner->running(), false);
}

int sync_threads_count(int predicate) {
  BlockRunner* runner = current_runner;
  runner->barrier(*runner->running(), predicate != 0);
  return runner->barrier_count();
}

uint64_t warp_exchange(uint64_t word, int source_lane) {
  BlockRunner* runner = current_runner;
  return runner->warp_exchange(*runner->running(), word, source_lane);
}

void count_wait_on_own_grid() { current_runner->note_wait_on_own_grid(); }
void count_serial_steps(int64_t n) { current_runner->running()->serial_steps += n; }

// A kernel thread's fiber, or null on a host thread (whose loads and stores are not a kernel's).
static Fiber* kernel_fiber() {
  BlockRunner* runner = current_runner;
  return runner ? runner->running() : nullptr;
}
void count_bytes_read(int64_t n) {
  if (Fiber* f = kernel_fiber()) f->bytes_read += n;
}
void count_bytes_written(int64_t n) {
  if (Fiber* f = kernel_fiber()) f->bytes_written += n;
}
void count_system_fence() {
  if (Fiber* f = kernel_fiber()) ++f->system_fences;
}

void yield_thread() {
  BlockRunner* runner = current_runner;
  runner->nap(*runner->running());
}

uint64_t global_timer_ns() {
  return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::steady_clock::now().time_since_epoch())
                      .count());
}

}  // namespace pmoe::emu
