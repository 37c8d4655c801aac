// ks_pool.h's pool: workers wait for a new generation number, spinning up to kSpin, then on a
// condition variable; the caller runs share 0 and spins until every worker has finished.
#include "ks_pool.h"

#include <immintrin.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

namespace ks {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kSpin = std::chrono::microseconds(500);

class Pool {
  public:
    ~Pool() { resize(0); }

    void run(int threads, void (*fn)(void*, int, int), void* ctx) {
        if (int(workers_.size()) != threads - 1) resize(threads - 1);
        fn_ = fn, ctx_ = ctx, threads_ = threads;
        pending_.store(threads - 1, std::memory_order_relaxed);
        // seq_cst on both sides (here and in wait_past): a worker going to sleep sees the new
        // generation, or this sees the worker among the sleepers; never neither.
        generation_.fetch_add(1);
        if (sleepers_.load() > 0) {
            std::lock_guard<std::mutex> lock(mutex_);
            wake_.notify_all();
        }
        fn(ctx, 0, threads);
        while (pending_.load(std::memory_order_acquire) > 0) _mm_pause();
    }

  private:
    void resize(int workers) {
        stop_.store(true);
        {
            std::lock_guard<std::mutex> lock(mutex_);
            generation_.fetch_add(1);
            wake_.notify_all();
        }
        for (auto& w : workers_) w.join();
        workers_.clear();
        stop_.store(false);
        // A new worker starts from the generation now: a job posted before it first looks is
        // still its to run.
        const uint64_t start = generation_.load();
        for (int i = 0; i < workers; ++i)
            workers_.emplace_back([this, i, start] { loop(i + 1, start); });
    }

    void loop(int index, uint64_t seen) {
        while (true) {
            uint64_t now = wait_past(seen);
            if (stop_.load()) return;
            seen = now;
            fn_(ctx_, index, threads_);
            pending_.fetch_sub(1, std::memory_order_release);
        }
    }

    uint64_t wait_past(uint64_t seen) {
        const auto deadline = Clock::now() + kSpin;
        for (int i = 0;; ++i) {
            uint64_t now = generation_.load(std::memory_order_acquire);
            if (now != seen) return now;
            _mm_pause();
            if ((i & 255) == 255 && Clock::now() > deadline) break;
        }
        std::unique_lock<std::mutex> lock(mutex_);
        sleepers_.fetch_add(1);
        wake_.wait(lock, [&] { return generation_.load() != seen; });
        sleepers_.fetch_sub(1);
        return generation_.load(std::memory_order_acquire);
    }

    std::vector<std::thread> workers_;
    std::atomic<uint64_t> generation_{0};
    std::atomic<int> pending_{0}, sleepers_{0};
    std::atomic<bool> stop_{false};
    std::mutex mutex_;
    std::condition_variable wake_;
    void (*fn_)(void*, int, int) = nullptr;
    void* ctx_ = nullptr;
    int threads_ = 1;
};

Pool pool;

}  // namespace

void parallel_run(int threads, void (*fn)(void*, int, int), void* ctx) {
    pool.run(threads, fn, ctx);
}

}  // namespace ks
