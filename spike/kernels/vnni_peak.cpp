// This CPU's int8 multiply-add peak: independent vpdpbusd chains from registers, per thread.
#include <chrono>

#include "ks_common.h"
#include "ks_pool.h"

namespace {

struct Peak {
    int64_t iters;
    double seconds[64];
};

// `iters` loop turns of 12 vpdpbusd on 12 independent accumulators: more than latency x
// throughput on AVX-512 VNNI cores. In asm: the compiler otherwise drops the chains, whose
// result nothing reads; asm takes at most 30 operands, an accumulator is two.
void chains(void* p, int t, int) {
    Peak& peak = *static_cast<Peak*>(p);
    __m512i acc[12];
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_epi32(i);
    const __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(-2);
    const auto start = std::chrono::steady_clock::now();
    for (int64_t it = 0; it < peak.iters; ++it) {
#define KS_DP(i) "vpdpbusd %[b], %[a], %[c" #i "]\n\t"
        __asm__ volatile(KS_DP(0) KS_DP(1) KS_DP(2) KS_DP(3) KS_DP(4) KS_DP(5) KS_DP(6) KS_DP(7)
                             KS_DP(8) KS_DP(9) KS_DP(10) KS_DP(11)
                         : [c0] "+v"(acc[0]), [c1] "+v"(acc[1]), [c2] "+v"(acc[2]),
                           [c3] "+v"(acc[3]), [c4] "+v"(acc[4]), [c5] "+v"(acc[5]),
                           [c6] "+v"(acc[6]), [c7] "+v"(acc[7]), [c8] "+v"(acc[8]),
                           [c9] "+v"(acc[9]), [c10] "+v"(acc[10]), [c11] "+v"(acc[11])
                         : [a] "v"(a), [b] "v"(b));
#undef KS_DP
    }
    peak.seconds[t] =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

// int8 multiply-adds per second over `threads` threads (at most 64), the slowest thread's time.
KS_API double ks_vnni_peak(int64_t iters, int threads) {
    Peak peak{iters, {}};
    if (threads <= 1)
        chains(&peak, 0, 1);
    else
        ks::parallel_run(threads, chains, &peak);
    double slowest = 0;
    for (int t = 0; t < threads; ++t) slowest = peak.seconds[t] > slowest ? peak.seconds[t] : slowest;
    return double(iters) * 12 * 64 * threads / slowest;
}
