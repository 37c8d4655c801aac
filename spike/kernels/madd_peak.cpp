// This CPU's multiply-add peaks from registers, per thread: int8 (vpdpbusd, 64 a zmm), bf16
// (vdpbf16ps, 32 a zmm), fp32 (vfmadd231ps, 16 a zmm): which one a compute-bound GEMM should use.
#include <chrono>

#include "ks_common.h"
#include "ks_pool.h"

namespace {

struct Peak {
    int64_t iters;
    int kind;  // 0 int8, 1 bf16, 2 fp32
    double seconds[64];
};

#define KS_CHAINS(op)                                                                        \
    __asm__ volatile(op(0) op(1) op(2) op(3) op(4) op(5) op(6) op(7) op(8) op(9) op(10) op(11) \
                     : [c0] "+v"(acc[0]), [c1] "+v"(acc[1]), [c2] "+v"(acc[2]),               \
                       [c3] "+v"(acc[3]), [c4] "+v"(acc[4]), [c5] "+v"(acc[5]),               \
                       [c6] "+v"(acc[6]), [c7] "+v"(acc[7]), [c8] "+v"(acc[8]),               \
                       [c9] "+v"(acc[9]), [c10] "+v"(acc[10]), [c11] "+v"(acc[11])            \
                     : [a] "v"(a), [b] "v"(b))
#define KS_DPBUSD(i) "vpdpbusd %[b], %[a], %[c" #i "]\n\t"
#define KS_DPBF16(i) "vdpbf16ps %[b], %[a], %[c" #i "]\n\t"
#define KS_FMA(i) "vfmadd231ps %[b], %[a], %[c" #i "]\n\t"

// `iters` loop turns of 12 vpdpbusd on 12 independent accumulators: more than latency x
// throughput on AVX-512 VNNI cores. In asm: the compiler otherwise drops the chains, whose
// result nothing reads; asm takes at most 30 operands, an accumulator is two.
void chains(void* p, int t, int) {
    Peak& peak = *static_cast<Peak*>(p);
    __m512i acc[12];
    // Normal numbers for the float kinds (integer patterns would be denormals, a slow path).
    const __m512i one = peak.kind == 0   ? _mm512_set1_epi8(3)
                        : peak.kind == 1 ? _mm512_set1_epi32(0x3F803F80)  // bf16 1.0, 1.0
                                         : _mm512_castps_si512(_mm512_set1_ps(1.0f));
    for (int i = 0; i < 12; ++i)
        acc[i] = peak.kind == 0 ? _mm512_set1_epi32(i) : _mm512_castps_si512(_mm512_set1_ps(float(i)));
    const __m512i a = one, b = one;
    const auto start = std::chrono::steady_clock::now();
    // One loop per kind: with the three asm blocks in one loop the compiler kept the
    // accumulators in memory between them, and the chains ran at half speed.
    if (peak.kind == 0)
        for (int64_t it = 0; it < peak.iters; ++it) KS_CHAINS(KS_DPBUSD);
    else if (peak.kind == 1)
        for (int64_t it = 0; it < peak.iters; ++it) KS_CHAINS(KS_DPBF16);
    else
        for (int64_t it = 0; it < peak.iters; ++it) KS_CHAINS(KS_FMA);
    peak.seconds[t] =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

// Multiply-adds per second over `threads` threads (at most 64), the slowest thread's time:
// kind 0 int8 (vpdpbusd), 1 bf16 (vdpbf16ps), 2 fp32 (vfmadd231ps).
KS_API double ks_madd_peak(int64_t iters, int threads, int kind) {
    Peak peak{iters, kind, {}};
    if (threads <= 1)
        chains(&peak, 0, 1);
    else
        ks::parallel_run(threads, chains, &peak);
    double slowest = 0;
    for (int t = 0; t < threads; ++t) slowest = peak.seconds[t] > slowest ? peak.seconds[t] : slowest;
    const int per_op = kind == 0 ? 64 : kind == 1 ? 32 : 16;
    return double(iters) * 12 * per_op * threads / slowest;
}
