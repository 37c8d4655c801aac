// This CPU's int8 multiply-add peak: independent vpdpbusd chains from registers, per thread.
#include <omp.h>

#include "ks_common.h"

// int8 multiply-adds per second over `threads` threads, `iters` loop turns of 16 vpdpbusd
// (16 independent accumulators: more than latency x throughput on any AVX-512 VNNI core).
KS_API double ks_vnni_peak(int64_t iters, int threads) {
    double seconds = 0;
    int used = 1;
#pragma omp parallel num_threads(threads)
    {
        __m512i acc[16];
        for (int i = 0; i < 16; ++i) acc[i] = _mm512_set1_epi32(i);
        __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(-2);
#pragma omp barrier
        double start = omp_get_wtime();
        for (int64_t it = 0; it < iters; ++it) {
            for (int i = 0; i < 16; ++i) acc[i] = _mm512_dpbusd_epi32(acc[i], a, b);
            __asm__ volatile("" : "+v"(a), "+v"(b));  // keep the loop from being folded
        }
        double took = omp_get_wtime() - start;
        __m512i sum = acc[0];
        for (int i = 1; i < 16; ++i) sum = _mm512_add_epi32(sum, acc[i]);
        volatile int sink = _mm512_reduce_add_epi32(sum);
        (void)sink;
#pragma omp critical
        {
            seconds = took > seconds ? took : seconds;
            used = omp_get_num_threads();
        }
    }
    return double(iters) * 16 * 64 * used / seconds;
}
