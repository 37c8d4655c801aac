// Shared by the spike's kernels: the C ABI macro, aligned scratch, and a vector exp.
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>

#define KS_API extern "C" __attribute__((visibility("default")))

namespace ks {

// 64-byte aligned scratch freed at scope exit: a zmm load never splits a cache line.
struct AlignedFree {
    void operator()(void* p) const { std::free(p); }
};
template <typename T>
using Scratch = std::unique_ptr<T[], AlignedFree>;

template <typename T>
Scratch<T> scratch(size_t count) {
    size_t bytes = (count * sizeof(T) + 63) & ~size_t(63);
    return Scratch<T>(static_cast<T*>(std::aligned_alloc(64, bytes ? bytes : 64)));
}

// exp(x) for 16 floats: 2^(x log2 e) split into an integer power (exponent bits) and a degree-6
// polynomial of the fraction; relative error ~2e-7 on [-87, 0], which softmax needs (inputs are
// x - max <= 0). Below -87 the result flushes to 0.
inline __m512 exp512(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f));
    __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_sub_ps(t, n);  // in [-0.5, 0.5]
    __m512 p = _mm512_set1_ps(1.535336188319500e-4f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.339887440266574e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.618437357674640e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550332471162809e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402264791363012e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931472028550421e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);  // p * 2^n
}

}  // namespace ks
