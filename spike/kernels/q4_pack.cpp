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

// Row `row` of x [k] -> its codes, scales and corrections in the tiled layout.
static void quantize_row(const float* x, int64_t row, int64_t k, int64_t tile, int8_t* codes,
                         float* scales, int32_t* corr) {
    alignas(64) int8_t group[32];
    for (int64_t sb = 0; sb < k / kSuper; ++sb) {
        int8_t* sb_codes = codes + act_code_offset(row, sb, k, tile);
        float* sb_scales = scales + act_scale_offset(row, sb, k, tile);
        int32_t* sb_corr = corr + act_scale_offset(row, sb, k, tile);
        for (int i = 0; i < 16; ++i) {
            const float* xg = x + (sb * 16 + i) * 32;
            __m512 a = _mm512_loadu_ps(xg), b = _mm512_loadu_ps(xg + 16);
            float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
            float inv = amax > 0 ? 127.0f / amax : 0.0f;
            __m512 vinv = _mm512_set1_ps(inv);
            // round to nearest even (MXCSR's default), |q| <= 127
            __m512i qa = _mm512_cvtps_epi32(_mm512_mul_ps(a, vinv));
            __m512i qb = _mm512_cvtps_epi32(_mm512_mul_ps(b, vinv));
            _mm_store_si128(reinterpret_cast<__m128i*>(group), _mm512_cvtsepi32_epi8(qa));
            _mm_store_si128(reinterpret_cast<__m128i*>(group + 16), _mm512_cvtsepi32_epi8(qb));
            sb_scales[i] = amax / 127.0f;
            sb_corr[i] = -8 * _mm512_reduce_add_epi32(_mm512_add_epi32(qa, qb));
            // step s, lane i: bytes 4s..4s+3 of group i
            for (int s = 0; s < 8; ++s)
                std::memcpy(sb_codes + s * tile * 64 + 4 * i, group + 4 * s, 4);
        }
    }
}

// x: [m, k] float -> codes [mp, k], scales and corrections [mp, k/32], rows in tiles of `tile`,
// mp = m rounded up to a whole tile; the padding rows are zeros (they add nothing).
KS_API void ks_q8_quantize(const float* x, int64_t m, int64_t k, int64_t tile, int8_t* codes,
                           float* scales, int32_t* corr) {
    for (int64_t r = 0; r < m; ++r) quantize_row(x + r * k, r, k, tile, codes, scales, corr);
    const int64_t mp = (m + tile - 1) / tile * tile;
    for (int64_t r = m; r < mp; ++r)
        for (int64_t sb = 0; sb < k / kSuper; ++sb) {
            for (int s = 0; s < 8; ++s)
                std::memset(codes + act_code_offset(r, sb, k, tile) + s * tile * 64, 0, 64);
            std::memset(scales + act_scale_offset(r, sb, k, tile), 0, 16 * sizeof(float));
            std::memset(corr + act_scale_offset(r, sb, k, tile), 0, 16 * sizeof(int32_t));
        }
}
