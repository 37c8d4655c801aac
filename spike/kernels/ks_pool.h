// The kernels' threads: a pool of our own, not OpenMP. In one process with torch (which ships
// its own libgomp) the two OpenMP runtimes' threads fought over this host's 2 cores: the
// 1B step's GEMVs went from 4.4 ms to 8-90 ms. Workers spin a bounded time after each job
// (the next kernel call of a decode step comes microseconds later), then sleep, so an idle
// pool never takes a core from another engine timed in the same process.
#pragma once

#include <cstdint>

namespace ks {

// Runs fn(ctx, t, threads) for t in [0, threads) on the caller and threads - 1 workers and
// returns when all are done. Not reentrant: one caller at a time (the Python side's GIL holder).
void parallel_run(int threads, void (*fn)(void*, int, int), void* ctx);

// fn(begin, end) over [0, count) split into `threads` contiguous ranges of whole `grain`s.
template <typename F>
void parallel_for(int threads, int64_t count, int64_t grain, F&& fn) {
    struct Ctx {
        F* fn;
        int64_t units, grain, count;
    } ctx{&fn, (count + grain - 1) / grain, grain, count};
    auto body = [](void* p, int t, int n) {
        Ctx& c = *static_cast<Ctx*>(p);
        int64_t lo = c.units * t / n * c.grain, hi = c.units * (t + 1) / n * c.grain;
        if (hi > c.count) hi = c.count;
        if (lo < hi) (*c.fn)(lo, hi);
    };
    if (threads <= 1) {
        if (count > 0) fn(int64_t(0), count);
        return;
    }
    parallel_run(threads, body, &ctx);
}

}  // namespace ks
