#include "cpu/comm_worker.hpp"

#include <chrono>

#include "pmoe/error.hpp"

namespace pmoe::detail {

CommWorker::CommWorker(double timeout_s) : timeout_s_(timeout_s), thread_([this] { loop(); }) {}

CommWorker::~CommWorker() {
  abandon();
  {
    std::lock_guard lock(mutex_);
    quit_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void CommWorker::start(std::function<void()> job) {
  {
    std::lock_guard lock(mutex_);
    PMOE_CHECK(!busy_, "CommWorker::start: the previous job is still running");
    job_ = std::move(job);
    has_job_ = true;
    busy_ = true;
    error_ = nullptr;
    progress_ = 0;
    stop_.store(false, std::memory_order_release);
    failed_.store(false, std::memory_order_release);
  }
  wake_.notify_all();
}

void CommWorker::finish() {
  std::unique_lock lock(mutex_);
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(2 * timeout_s_ + 1);
  if (!wake_.wait_until(lock, deadline, [&] { return !busy_; })) {
    stop_.store(true, std::memory_order_release);
    throw Error(cat("communication thread: its job did not end within ", 2 * timeout_s_ + 1, " s"));
  }
  if (error_) {
    std::exception_ptr error = error_;
    error_ = nullptr;
    std::rethrow_exception(error);
  }
}

void CommWorker::publish(int progress) {
  {
    std::lock_guard lock(mutex_);
    progress_ = progress;
  }
  wake_.notify_all();
}

void CommWorker::wait_progress(int value, const char* op) {
  std::unique_lock lock(mutex_);
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s_);
  const bool reached = wake_.wait_until(
      lock, deadline, [&] { return progress_ >= value || stop_.load(std::memory_order_acquire); });
  PMOE_CHECK(!stop_.load(std::memory_order_acquire), "communication thread: stopped by its rank");
  PMOE_CHECK(reached, op, ": the communication thread waited ", timeout_s_, " s for GEMM ", value,
             " of its rank");
}

void CommWorker::abandon() noexcept {
  {
    std::lock_guard lock(mutex_);  // so that a job blocked in wait_progress sees it
    stop_.store(true, std::memory_order_release);
  }
  wake_.notify_all();
  std::unique_lock lock(mutex_);
  // No deadline: every wait of a job polls stop_requested(), so the job returns within one put.
  wake_.wait(lock, [&] { return !busy_; });
  error_ = nullptr;
}

void CommWorker::loop() {
  std::unique_lock lock(mutex_);
  for (;;) {
    wake_.wait(lock, [&] { return has_job_ || quit_; });
    if (!has_job_) return;  // quit, nothing pending
    std::function<void()> job = std::move(job_);
    has_job_ = false;
    lock.unlock();
    std::exception_ptr error;
    try {
      job();
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    error_ = error;
    if (error) failed_.store(true, std::memory_order_release);
    busy_ = false;
    wake_.notify_all();
  }
}

}  // namespace pmoe::detail
