// A rank's communication thread on the CPU backend: it runs one job at a time (the puts and
// signals of one overlapped call) beside the rank's own thread, which multiplies meanwhile.
//
// The thread lives as long as the op, so a call costs a wake-up, not a thread start. Between
// jobs it sleeps on a condition variable. The job may only make calls that are safe off the
// rank's thread: loads, stores, puts and signals to node-local peers; never MPI (MPI runs
// MPI_THREAD_SERIALIZED), which is why the ops use no worker when some peer is off-node.
#pragma once

#include <atomic>
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace pmoe::detail {

class CommWorker {
 public:
  // `timeout_s` bounds finish(): a job's own waits are bounded by it, so finish() waits at most
  // twice as long before it gives up.
  explicit CommWorker(double timeout_s);
  ~CommWorker();  // stops the thread (after abandoning a running job)
  CommWorker(const CommWorker&) = delete;
  CommWorker& operator=(const CommWorker&) = delete;

  // Hands `job` to the thread. The previous job must have been finished or abandoned.
  void start(std::function<void()> job);
  // Waits for the job; rethrows what it threw. Throws pmoe::Error if it does not end in time.
  void finish();
  // Asks the job to stop (its waits poll stop_requested()) and waits until it has returned, so
  // that it touches no caller memory afterwards. Never throws.
  void abandon() noexcept;

  // The calling thread's progress in the current job (pieces multiplied), 0 at start(). The
  // job blocks on it (no spinning or napping, which would take cycles from the GEMM sharing
  // the core) until it reaches `value`; it throws pmoe::Error on abandon() or after timeout_s.
  void publish(int progress);
  void wait_progress(int value, const char* op);

  // Polled by the job's waits: the calling thread gave up on this call.
  bool stop_requested() const { return stop_.load(std::memory_order_acquire); }
  // Polled by the calling thread's waits: the job threw, finish() will rethrow it.
  bool failed() const { return failed_.load(std::memory_order_acquire); }

 private:
  void loop();

  double timeout_s_;
  std::mutex mutex_;
  std::condition_variable wake_;  // a job, progress or quit for the thread; a job's end for callers
  std::function<void()> job_;
  bool has_job_ = false;
  bool busy_ = false;
  bool quit_ = false;
  int progress_ = 0;
  std::exception_ptr error_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> failed_{false};
  std::thread thread_;  // last: starts once everything above exists
};

}  // namespace pmoe::detail
