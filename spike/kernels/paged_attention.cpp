// Decode attention over ingot's paged KV pool, read in place through the block tables: no
// gather, no concat. Per layer the pool is K and V arrays [blocks, B, Hkv, D] (runtime/kv_pool.py),
// fp32, or int8 codes standing for code * scale with one scale per KV head (docs/design.md
// section 4, "Quantized KV cache"). One new token per sequence: its K (already rotated) and V
// are written at position context_lens[s] (as the engine graph's ScatterND does), then its
// query heads attend to positions 0..context_lens[s]. GQA: query head j reads KV head j / G.
//
// One task per sequence (its KV heads split across the threads only when there are fewer
// sequences than threads): every K and V row loaded serves its G query heads. Two passes:
// scores (q . k), then after the softmax the weighted V rows. int8 folds K's scale into q
// and V's into the final 1 / sum, so the inner loops only convert codes to float.
#include <algorithm>
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

// The task's rows of the slot `ahead` tokens on, into L1: a pass's loads otherwise waited on
// memory behind its arithmetic (fp32, 1 x 4096: 2 threads barely faster than 1).
template <typename KV>
inline void prefetch_rows(const KV* rows, int64_t bytes) {
    const char* p = reinterpret_cast<const char*>(rows);
    for (int64_t line = 0; line < bytes; line += 64) _mm_prefetch(p + line, _MM_HINT_T0);
}

// The four sums of a, b, c, d's 16 lanes: shared shuffles, not four reductions.
inline __m128 reduce4(__m512 a, __m512 b, __m512 c, __m512 d) {
    auto fold = [](__m512 x) {
        return _mm256_add_ps(_mm512_castps512_ps256(x),
                             _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
    };
    const __m256 ab = _mm256_hadd_ps(fold(a), fold(b));  // per 128-bit half: a a b b
    const __m256 cd = _mm256_hadd_ps(fold(c), fold(d));
    const __m256 abcd = _mm256_hadd_ps(ab, cd);  // per half: a b c d
    return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
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

// Sequence s, KV heads [h0, h1): a slot's rows of those heads are adjacent, so a pass reads each
// block's slots front to back (one task per KV head read 256 of every 2048 bytes on the 1B
// shape, at 6-9 GB/s).
template <typename KV>
void attend(const Problem& p, int64_t s, int64_t h0, int64_t h1, std::vector<float>& buf) {
    constexpr bool kInt8 = sizeof(KV) == 1;
    const int64_t group = p.hq / p.hkv, d = p.d, dc = d / 16, ctx = p.context_lens[s];
    const int64_t tokens = ctx + 1, row = p.hkv * d;  // a pool slot's stride
    const int64_t heads = (h1 - h0) * group;          // query heads of this task
    const int64_t* table = p.tables + s * p.mb;
    KV* kp = static_cast<KV*>(p.k_pool);
    KV* vp = static_cast<KV*>(p.v_pool);
    auto slot = [&](int64_t t) { return (table[t / p.block] * p.block + t % p.block) * row; };
    for (int64_t h = h0; h < h1; ++h) {
        const float ks = kInt8 ? p.k_scales[h] : 1.0f, vs = kInt8 ? p.v_scales[h] : 1.0f;
        store_row(kp + slot(ctx) + h * d, p.k_new + s * row + h * d, d, ks);
        store_row(vp + slot(ctx) + h * d, p.v_new + s * row + h * d, d, vs);
    }
    // buf: q [heads, D] (times the softmax scale and K's scale), scores [heads, tokens],
    // acc [heads, D]
    buf.assign(heads * (2 * d + tokens) + 16, 0.0f);
    float* q = buf.data();
    float* scores = q + heads * d;
    float* acc = scores + heads * tokens;
    for (int64_t j = 0; j < heads; ++j) {
        const int64_t h = h0 + j / group;
        const float qs = p.scale * (kInt8 ? p.k_scales[h] : 1.0f);
        for (int64_t i = 0; i < d; ++i) q[j * d + i] = p.q[(s * p.hq + h0 * group + j) * d + i] * qs;
    }

    // pass 1: scores [heads, tokens]; each K row loaded once for its group's query heads
    constexpr int64_t kAhead = 8;
    const int64_t task_bytes = (h1 - h0) * d * int64_t(sizeof(KV));
    __m512 dots[kMaxGroup];
    for (int64_t t = 0; t < tokens; ++t) {
        if (t + kAhead < tokens) prefetch_rows(kp + slot(t + kAhead) + h0 * d, task_bytes);
        const KV* k = kp + slot(t) + h0 * d;
        for (int64_t hh = 0; hh < h1 - h0; ++hh) {
            __m512 kv[kMaxD / 16];
            for (int64_t c = 0; c < dc; ++c) kv[c] = load16(k + hh * d + c * 16);
            for (int64_t g = 0; g < group; ++g) {
                const float* qj = q + (hh * group + g) * d;
                __m512 a = _mm512_mul_ps(kv[0], _mm512_loadu_ps(qj));
                for (int64_t c = 1; c < dc; ++c) a = _mm512_fmadd_ps(kv[c], _mm512_loadu_ps(qj + c * 16), a);
                dots[g] = a;
            }
            int64_t g = 0;
            for (; g + 4 <= group; g += 4) {
                alignas(16) float sums[4];
                _mm_store_ps(sums, reduce4(dots[g], dots[g + 1], dots[g + 2], dots[g + 3]));
                for (int i = 0; i < 4; ++i) scores[(hh * group + g + i) * tokens + t] = sums[i];
            }
            for (; g < group; ++g) scores[(hh * group + g) * tokens + t] = _mm512_reduce_add_ps(dots[g]);
        }
    }
    // softmax numerators in place; 1 / sum (times V's scale) per query head
    float inv_sum[kMaxGroup * 64];
    for (int64_t j = 0; j < heads; ++j) {
        float* sj = scores + j * tokens;
        float mx = -INFINITY;
        for (int64_t t = 0; t < tokens; ++t) mx = sj[t] > mx ? sj[t] : mx;
        const __m512 vmx = _mm512_set1_ps(mx);
        __m512 sum = _mm512_setzero_ps();
        int64_t t = 0;
        for (; t + 16 <= tokens; t += 16) {
            __m512 e = exp512(_mm512_sub_ps(_mm512_loadu_ps(sj + t), vmx));
            _mm512_storeu_ps(sj + t, e);
            sum = _mm512_add_ps(sum, e);
        }
        const __mmask16 tail = __mmask16((1u << (tokens - t)) - 1);
        __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, sj + t), vmx));
        _mm512_mask_storeu_ps(sj + t, tail, e);
        sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(tail, e));
        const float vs = kInt8 ? p.v_scales[h0 + j / group] : 1.0f;
        inv_sum[j] = vs / _mm512_reduce_add_ps(sum);
    }
    // pass 2: acc [heads, D] = sum_t p[j, t] v_t; each V row loaded once for its group
    for (int64_t t = 0; t < tokens; ++t) {
        if (t + kAhead < tokens) prefetch_rows(vp + slot(t + kAhead) + h0 * d, task_bytes);
        const KV* v = vp + slot(t) + h0 * d;
        for (int64_t hh = 0; hh < h1 - h0; ++hh) {
            __m512 vv[kMaxD / 16];
            for (int64_t c = 0; c < dc; ++c) vv[c] = load16(v + hh * d + c * 16);
            for (int64_t g = 0; g < group; ++g) {
                const int64_t j = hh * group + g;
                const __m512 w = _mm512_set1_ps(scores[j * tokens + t]);
                float* aj = acc + j * d;
                for (int64_t c = 0; c < dc; ++c)
                    _mm512_storeu_ps(aj + c * 16, _mm512_fmadd_ps(w, vv[c], _mm512_loadu_ps(aj + c * 16)));
            }
        }
    }
    for (int64_t j = 0; j < heads; ++j) {
        float* o = p.out + (s * p.hq + h0 * group + j) * d;
        const __m512 inv = _mm512_set1_ps(inv_sum[j]);
        for (int64_t c = 0; c < dc; ++c)
            _mm512_storeu_ps(o + c * 16, _mm512_mul_ps(_mm512_loadu_ps(acc + j * d + c * 16), inv));
    }
}

// Tasks: one per sequence (all its KV heads); with fewer sequences than threads, each
// sequence's KV heads split into `threads` parts.
template <typename KV>
void run(const Problem& p, int64_t seqs, int threads) {
    const int64_t parts = seqs >= threads ? 1 : std::min<int64_t>(threads, p.hkv);
    parallel_for(threads, seqs * parts, 1, [&](int64_t lo, int64_t hi) {
        std::vector<float> buf;
        for (int64_t task = lo; task < hi; ++task) {
            const int64_t s = task / parts, part = task % parts;
            attend<KV>(p, s, p.hkv * part / parts, p.hkv * (part + 1) / parts, buf);
        }
    });
}

}  // namespace

// kv_dtype 0: fp32 pools; 1: int8 pools with k_scales / v_scales [Hkv]. Returns 0, or -1 for
// a shape it does not take (D not a multiple of 16 or above 256, more than 16 query heads a
// KV head, more than 1024 query heads).
KS_API int ks_paged_attention(const float* q, const float* k_new, const float* v_new,
                              void* k_pool, void* v_pool, const int64_t* block_tables,
                              const int64_t* context_lens, const float* k_scales,
                              const float* v_scales, int64_t seqs, int64_t mb, int64_t hq,
                              int64_t hkv, int64_t d, int64_t block, float scale, int kv_dtype,
                              float* out, int threads) {
    if (d % 16 || d > kMaxD || hq % hkv || hq / hkv > kMaxGroup || hq > kMaxGroup * 64) return -1;
    const Problem p{q, k_new, v_new, k_pool, v_pool, block_tables, context_lens, k_scales,
                    v_scales, mb, hq, hkv, d, block, scale, out};
    if (kv_dtype == 1)
        run<int8_t>(p, seqs, threads);
    else
        run<float>(p, seqs, threads);
    return 0;
}
