// Decode attention over ingot's paged KV pool, read in place through the block tables: no
// gather, no concat. Per layer the pool is K and V arrays [blocks, B, Hkv, D] (runtime/kv_pool.py),
// fp32, or int8 codes standing for code * scale with one scale per KV head (docs/design.md
// section 4, "Quantized KV cache"). One new token per sequence: its K (already rotated) and V
// are written at position context_lens[s] (as the engine graph's ScatterND does), then its
// query heads attend to positions 0..context_lens[s]. GQA: query head j reads KV head j / G.
//
// One task per (sequence, KV head), split across the threads: the task's G query heads share
// every K and V row it loads. Two passes a block of B tokens: scores (q . k, one K row loaded
// for all G heads), then after the softmax the weighted V rows. int8 folds K's scale into q
// and V's into the final 1 / sum, so the inner loops only convert codes to float.
#include <cmath>
#include <cstring>
#include <vector>

#include "ks_common.h"
#include "ks_pool.h"

using namespace ks;

namespace {

inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const int8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

// Row `src` [D] into the pool slot `dst`: a copy (fp32) or QuantizeLinear's int8 rounding
// (x / scale, half to even, saturated).
inline void store_row(float* dst, const float* src, int64_t d, float) {
    std::memcpy(dst, src, d * sizeof(float));
}
inline void store_row(int8_t* dst, const float* src, int64_t d, float scale) {
    const __m512 vs = _mm512_set1_ps(scale);
    for (int64_t c = 0; c < d; c += 16) {
        __m512i q = _mm512_cvtps_epi32(_mm512_div_ps(_mm512_loadu_ps(src + c), vs));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + c), _mm512_cvtsepi32_epi8(q));
    }
}

struct Problem {
    const float* q;                    // [S, Hq*D]
    const float *k_new, *v_new;        // [S, Hkv*D]
    void *k_pool, *v_pool;             // [blocks, B, Hkv, D]
    const int64_t* tables;             // [S, MB]
    const int64_t* context_lens;       // [S]
    const float *k_scales, *v_scales;  // [Hkv] (int8 only)
    int64_t mb, hq, hkv, d, block;
    float scale;
    float* out;                        // [S, Hq*D]
};

constexpr int kMaxD = 256, kMaxGroup = 16;

template <typename KV>
void attend(const Problem& p, int64_t s, int64_t h, std::vector<float>& scores) {
    constexpr bool kInt8 = sizeof(KV) == 1;
    const int64_t g_count = p.hq / p.hkv, d = p.d, dc = d / 16, ctx = p.context_lens[s];
    const int64_t tokens = ctx + 1, row = p.hkv * d;  // a pool slot's stride
    const int64_t* table = p.tables + s * p.mb;
    KV* kp = static_cast<KV*>(p.k_pool);
    KV* vp = static_cast<KV*>(p.v_pool);
    const float ks_ = kInt8 ? p.k_scales[h] : 1.0f, vs_ = kInt8 ? p.v_scales[h] : 1.0f;
    auto slot = [&](int64_t t) { return (table[t / p.block] * p.block + t % p.block) * row + h * d; };
    store_row(kp + slot(ctx), p.k_new + s * row + h * d, d, ks_);
    store_row(vp + slot(ctx), p.v_new + s * row + h * d, d, vs_);

    // q of each query head, times the softmax scale (and K's dequantization scale)
    alignas(64) float q[kMaxGroup][kMaxD];
    for (int64_t g = 0; g < g_count; ++g)
        for (int64_t i = 0; i < d; ++i)
            q[g][i] = p.q[s * p.hq * d + (h * g_count + g) * d + i] * p.scale * ks_;
    scores.resize(g_count * tokens);

    // pass 1: scores [G, tokens]
    for (int64_t t = 0; t < tokens; ++t) {
        const KV* k = kp + slot(t);
        __m512 kv[kMaxD / 16];
        for (int64_t c = 0; c < dc; ++c) kv[c] = load16(k + c * 16);
        for (int64_t g = 0; g < g_count; ++g) {
            __m512 acc = _mm512_mul_ps(kv[0], _mm512_load_ps(q[g]));
            for (int64_t c = 1; c < dc; ++c) acc = _mm512_fmadd_ps(kv[c], _mm512_load_ps(q[g] + c * 16), acc);
            scores[g * tokens + t] = _mm512_reduce_add_ps(acc);
        }
    }
    // softmax numerators, in place; 1 / sum (times V's scale) per head
    float inv_sum[kMaxGroup];
    for (int64_t g = 0; g < g_count; ++g) {
        float* sg = scores.data() + g * tokens;
        float mx = -INFINITY;
        for (int64_t t = 0; t < tokens; ++t) mx = sg[t] > mx ? sg[t] : mx;
        const __m512 vmx = _mm512_set1_ps(mx);
        __m512 sum = _mm512_setzero_ps();
        int64_t t = 0;
        for (; t + 16 <= tokens; t += 16) {
            __m512 e = exp512(_mm512_sub_ps(_mm512_loadu_ps(sg + t), vmx));
            _mm512_storeu_ps(sg + t, e);
            sum = _mm512_add_ps(sum, e);
        }
        const __mmask16 tail = __mmask16((1u << (tokens - t)) - 1);
        __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, sg + t), vmx));
        _mm512_mask_storeu_ps(sg + t, tail, e);
        sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(tail, e));
        inv_sum[g] = vs_ / _mm512_reduce_add_ps(sum);
    }
    // pass 2: out [G, D] = sum_t p[g, t] v_t
    alignas(64) float acc[kMaxGroup][kMaxD] = {};
    for (int64_t t = 0; t < tokens; ++t) {
        const KV* v = vp + slot(t);
        __m512 vv[kMaxD / 16];
        for (int64_t c = 0; c < dc; ++c) vv[c] = load16(v + c * 16);
        for (int64_t g = 0; g < g_count; ++g) {
            const __m512 w = _mm512_set1_ps(scores[g * tokens + t]);
            for (int64_t c = 0; c < dc; ++c)
                _mm512_store_ps(acc[g] + c * 16, _mm512_fmadd_ps(w, vv[c], _mm512_load_ps(acc[g] + c * 16)));
        }
    }
    for (int64_t g = 0; g < g_count; ++g) {
        float* o = p.out + s * p.hq * d + (h * g_count + g) * d;
        const __m512 inv = _mm512_set1_ps(inv_sum[g]);
        for (int64_t c = 0; c < dc; ++c)
            _mm512_storeu_ps(o + c * 16, _mm512_mul_ps(_mm512_load_ps(acc[g] + c * 16), inv));
    }
}

template <typename KV>
void run(const Problem& p, int64_t seqs, int threads) {
    parallel_for(threads, seqs * p.hkv, 1, [&](int64_t lo, int64_t hi) {
        std::vector<float> scores;
        for (int64_t task = lo; task < hi; ++task) attend<KV>(p, task / p.hkv, task % p.hkv, scores);
    });
}

}  // namespace

// kv_dtype 0: fp32 pools; 1: int8 pools with k_scales / v_scales [Hkv]. Returns 0, or -1 for
// a shape it does not take (D not a multiple of 16 or above 256, more than 16 query heads a
// KV head).
KS_API int ks_paged_attention(const float* q, const float* k_new, const float* v_new,
                              void* k_pool, void* v_pool, const int64_t* block_tables,
                              const int64_t* context_lens, const float* k_scales,
                              const float* v_scales, int64_t seqs, int64_t mb, int64_t hq,
                              int64_t hkv, int64_t d, int64_t block, float scale, int kv_dtype,
                              float* out, int threads) {
    if (d % 16 || d > kMaxD || hq % hkv || hq / hkv > kMaxGroup) return -1;
    const Problem p{q, k_new, v_new, k_pool, v_pool, block_tables, context_lens, k_scales,
                    v_scales, mb, hq, hkv, d, block, scale, out};
    if (kv_dtype == 1)
        run<int8_t>(p, seqs, threads);
    else
        run<float>(p, seqs, threads);
    return 0;
}
