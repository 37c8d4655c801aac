// Weights into q4_layout.h's form, from MatMulNBits' (the same weights ORT is timed on), and
// activations quantized to it.
#include <cmath>
#include <cstring>

#include "ks_common.h"
#include "q4_layout.h"

using namespace ks;

// codes: [n, k/32, 16] uint8, MatMulNBits' B (weight 2t in the low nibble of byte t);
// scales: [n, k/32] fp16 bits; out: [n, packed_row_bytes(k)] bytes (n % kTileRows == 0).
KS_API void ks_q4_pack(const uint8_t* codes, const uint16_t* scales, int64_t n, int64_t k,
                       uint8_t* out) {
    const int64_t groups = k / kGroup;
    for (int64_t row = 0; row < n; ++row) {
        const uint8_t* rc = codes + row * groups * 16;
        auto weight = [&](int64_t g, int64_t t) {
            uint8_t byte = rc[g * 16 + t / 2];
            return (t & 1) ? byte >> 4 : byte & 15;
        };
        for (int64_t sb = 0; sb < k / kSuper; ++sb) {
            uint8_t* dst = out + packed_offset(row, sb, k);
            for (int c = 0; c < 4; ++c)
                for (int i = 0; i < 16; ++i)
                    for (int j = 0; j < 4; ++j) {
                        int64_t g = sb * 16 + i;
                        dst[c * 64 + 4 * i + j] =
                            uint8_t(weight(g, 4 * c + j) | (weight(g, 16 + 4 * c + j) << 4));
                    }
            std::memcpy(dst + kSuperCodes, scales + row * groups + sb * 16, 32);
        }
    }
}

// One row x [k] -> codes [k] (interleaved), scales and corrections [k/32].
static void quantize_row(const float* x, int64_t k, int8_t* codes, float* scales,
                         int32_t* corr) {
    alignas(64) int8_t group[32];
    for (int64_t sb = 0; sb < k / kSuper; ++sb) {
        int32_t* step_dwords = reinterpret_cast<int32_t*>(codes + sb * kSuper);
        for (int i = 0; i < 16; ++i) {
            const int64_t g = sb * 16 + i;
            __m512 a = _mm512_loadu_ps(x + g * 32), b = _mm512_loadu_ps(x + g * 32 + 16);
            float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
            float inv = amax > 0 ? 127.0f / amax : 0.0f;
            __m512 vinv = _mm512_set1_ps(inv);
            // round to nearest even (MXCSR's default), |q| <= 127
            __m512i qa = _mm512_cvtps_epi32(_mm512_mul_ps(a, vinv));
            __m512i qb = _mm512_cvtps_epi32(_mm512_mul_ps(b, vinv));
            _mm_store_si128(reinterpret_cast<__m128i*>(group), _mm512_cvtsepi32_epi8(qa));
            _mm_store_si128(reinterpret_cast<__m128i*>(group + 16), _mm512_cvtsepi32_epi8(qb));
            scales[g] = amax / 127.0f;
            corr[g] = -8 * _mm512_reduce_add_epi32(_mm512_add_epi32(qa, qb));
            const int32_t* dw = reinterpret_cast<const int32_t*>(group);
            for (int s = 0; s < 8; ++s) step_dwords[s * 16 + i] = dw[s];
        }
    }
}

// x: [m, k] float -> codes [m, k], scales [m, k/32], corr [m, k/32].
KS_API void ks_q8_quantize(const float* x, int64_t m, int64_t k, int8_t* codes, float* scales,
                           int32_t* corr) {
    for (int64_t r = 0; r < m; ++r)
        quantize_row(x + r * k, k, codes + r * k, scales + r * (k / kGroup),
                     corr + r * (k / kGroup));
}
