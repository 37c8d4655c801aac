// y [m, n] = x [m, k] @ W.T for W int4 g32 in q4_layout.h's packed form, x quantized per group
// of 32 to int8 on the fly; int8 products summed with AVX-512 VNNI (vpdpbusd), scaled per
// group in fp32. Rows of W are split across `threads` threads (ks_pool.h), in whole tiles.
//
// m == 1 (decode at batch 1, bandwidth-bound): gemv_rows streams NR rows at once and unpacks
// nibbles straight into vpdpbusd. m > 1 (compute-bound as m grows): each thread unpacks NR
// rows' super-block once into an L1 buffer and runs every MR-row tile of x against it, so the
// unpack is paid once per m rows, not per tile.
#include "ks_common.h"
#include "ks_pool.h"
#include "q4_layout.h"

using namespace ks;

KS_API void ks_q8_quantize(const float* x, int64_t m, int64_t k, int64_t tile, int8_t* codes,
                           float* scales, int32_t* corr);

namespace {

const __m512i kLowNibbles = _mm512_set1_epi8(0x0F);

// Rows of one tile (NR == kTileRows): their super-blocks are consecutive, kSuperBytes apart.
template <int NR>
void gemv_rows(const uint8_t* w, const QuantizedActs& a, float* y) {
    __m512 facc[NR];
    for (int r = 0; r < NR; ++r) facc[r] = _mm512_setzero_ps();
    for (int64_t sb = 0; sb < a.k / kSuper; ++sb) {
        const uint8_t* base = w + sb * NR * kSuperBytes;
        const int8_t* x = a.codes + sb * kSuper;  // a.tile == 1
        // two accumulators a row (low and high nibble steps): 2*NR independent vpdpbusd chains
        __m512i lo_acc[NR], hi_acc[NR];
        const __m512i corr = _mm512_loadu_si512(a.corr + sb * 16);
        for (int r = 0; r < NR; ++r) lo_acc[r] = corr, hi_acc[r] = _mm512_setzero_si512();
        for (int c = 0; c < 4; ++c) {
            const __m512i xlo = _mm512_load_si512(x + c * 64);
            const __m512i xhi = _mm512_load_si512(x + (c + 4) * 64);
            for (int r = 0; r < NR; ++r) {
                const __m512i v = _mm512_loadu_si512(base + r * kSuperBytes + c * 64);
                const __m512i lo = _mm512_and_si512(v, kLowNibbles);
                const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), kLowNibbles);
                lo_acc[r] = _mm512_dpbusd_epi32(lo_acc[r], lo, xlo);
                hi_acc[r] = _mm512_dpbusd_epi32(hi_acc[r], hi, xhi);
            }
        }
        const __m512 xs = _mm512_loadu_ps(a.scales + sb * 16);
        for (int r = 0; r < NR; ++r) {
            const __m256i ws16 = _mm256_loadu_si256(
                reinterpret_cast<const __m256i*>(base + r * kSuperBytes + kSuperCodes));
            const __m512 scale = _mm512_mul_ps(_mm512_cvtph_ps(ws16), xs);
            const __m512 dot = _mm512_cvtepi32_ps(_mm512_add_epi32(lo_acc[r], hi_acc[r]));
            facc[r] = _mm512_fmadd_ps(dot, scale, facc[r]);
        }
    }
    for (int r = 0; r < NR; ++r) y[r] = _mm512_reduce_add_ps(facc[r]);
}

// One super-block of NR rows unpacked: [NR][8 steps][64] codes 0..15 and [NR][16] fp32 scales.
template <int NR>
struct Unpacked {
    alignas(64) uint8_t codes[NR][8][64];
    alignas(64) float scales[NR][16];

    void load(const uint8_t* w, int64_t sb) {  // w: the tile's first byte
        for (int r = 0; r < NR; ++r) {
            const uint8_t* base = w + (sb * NR + r) * kSuperBytes;
            for (int c = 0; c < 4; ++c) {
                const __m512i v = _mm512_loadu_si512(base + c * 64);
                _mm512_store_si512(codes[r][c], _mm512_and_si512(v, kLowNibbles));
                _mm512_store_si512(codes[r][c + 4],
                                   _mm512_and_si512(_mm512_srli_epi16(v, 4), kLowNibbles));
            }
            const __m256i ws16 =
                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + kSuperCodes));
            _mm512_store_ps(scales[r], _mm512_cvtph_ps(ws16));
        }
    }
};

// acc [kActTile][NR] 16-lane partial sums (memory: they outlive the super-block loop) += one
// activation tile (4 rows) against the unpacked super-block: 8 steps x 16 vpdpbusd.
template <int NR>
void gemm_tile(const Unpacked<NR>& w, const int8_t* codes, const float* scales,
               const int32_t* corr, __m512* acc) {
    constexpr int MR = kActTile;
    __m512i iacc[MR][NR];
#pragma GCC unroll 4
    for (int m = 0; m < MR; ++m) {
        const __m512i c = _mm512_load_si512(corr + m * 16);
#pragma GCC unroll 4
        for (int r = 0; r < NR; ++r) iacc[m][r] = c;
    }
#pragma GCC unroll 8
    for (int s = 0; s < 8; ++s) {
        __m512i wv[NR];
#pragma GCC unroll 4
        for (int r = 0; r < NR; ++r) wv[r] = _mm512_load_si512(w.codes[r][s]);
#pragma GCC unroll 4
        for (int m = 0; m < MR; ++m) {
            const __m512i xv = _mm512_load_si512(codes + (s * MR + m) * 64);
#pragma GCC unroll 4
            for (int r = 0; r < NR; ++r) iacc[m][r] = _mm512_dpbusd_epi32(iacc[m][r], wv[r], xv);
        }
    }
#pragma GCC unroll 4
    for (int m = 0; m < MR; ++m) {
        const __m512 xs = _mm512_load_ps(scales + m * 16);
#pragma GCC unroll 4
        for (int r = 0; r < NR; ++r) {
            const __m512 scale = _mm512_mul_ps(_mm512_load_ps(w.scales[r]), xs);
            __m512& f = acc[m * NR + r];
            f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(iacc[m][r]), scale, f);
        }
    }
}

// y [m, NR] (row stride ldy) for one weight tile; a.m is whole activation tiles, `rows` real.
template <int NR>
void gemm_rows(const uint8_t* w, const QuantizedActs& a, int64_t rows, float* y, int64_t ldy,
               __m512* acc, Unpacked<NR>& buf) {
    for (int64_t i = 0; i < a.m * NR; ++i) acc[i] = _mm512_setzero_ps();
    for (int64_t sb = 0; sb < a.k / kSuper; ++sb) {
        // Two super-blocks ahead (tiles are contiguous: past the tile's last, the next tile's
        // first): at m = 32 a super-block's 1152 bytes come ~1000 cycles apart, too slowly for
        // the hardware prefetcher, and every load waited on DRAM (gate_up: 132 against 238
        // GMAC/s with the weight in cache).
        const char* ahead = reinterpret_cast<const char*>(w + (sb + 2) * NR * kSuperBytes);
        for (int64_t line = 0; line < NR * kSuperBytes; line += 64)
            _mm_prefetch(ahead + line, _MM_HINT_T0);
        buf.load(w, sb);
        for (int64_t m0 = 0; m0 < a.m; m0 += kActTile)
            gemm_tile<NR>(buf, a.codes + act_code_offset(m0, sb, a.k, kActTile),
                          a.scales + act_scale_offset(m0, sb, a.k, kActTile),
                          a.corr + act_scale_offset(m0, sb, a.k, kActTile), acc + m0 * NR);
    }
    for (int64_t m = 0; m < rows; ++m)
        for (int r = 0; r < NR; ++r) y[m * ldy + r] = _mm512_reduce_add_ps(acc[m * NR + r]);
}

}  // namespace

// y [m, n] from activations already quantized (ks_q8_quantize, rows in tiles of 1 for m == 1,
// else of kActTile). n % 4 == 0, k % 512 == 0.
KS_API void ks_q4_gemm_quantized(const int8_t* codes, const float* scales, const int32_t* corr,
                                 int64_t m, int64_t k, const uint8_t* w, int64_t n, float* y,
                                 int threads) {
    constexpr int NR = kTileRows;
    const int64_t tile = m == 1 ? 1 : kActTile, mp = (m + tile - 1) / tile * tile;
    const QuantizedActs a{codes, scales, corr, mp, k, tile};
    const int64_t row_bytes = packed_row_bytes(k);
    if (m == 1) {
        parallel_for(threads, n, NR, [&](int64_t lo, int64_t hi) {
            for (int64_t n0 = lo; n0 < hi; n0 += NR) gemv_rows<NR>(w + n0 * row_bytes, a, y + n0);
        });
        return;
    }
    parallel_for(threads, n, NR, [&](int64_t lo, int64_t hi) {
        Scratch<__m512> acc = scratch<__m512>(mp * NR);
        Unpacked<NR> buf;
        for (int64_t n0 = lo; n0 < hi; n0 += NR)
            gemm_rows<NR>(w + n0 * row_bytes, a, m, y + n0, n, acc.get(), buf);
    });
}

// y [m, n] = x [m, k] @ W.T: quantize x (one thread; cheap next to the matmul), then the above.
KS_API void ks_q4_gemm(const float* x, int64_t m, int64_t k, const uint8_t* w, int64_t n,
                       float* y, int threads) {
    const int64_t tile = m == 1 ? 1 : kActTile, mp = (m + tile - 1) / tile * tile;
    Scratch<int8_t> codes = scratch<int8_t>(mp * k);
    Scratch<float> scales = scratch<float>(mp * (k / kGroup));
    Scratch<int32_t> corr = scratch<int32_t>(mp * (k / kGroup));
    ks_q8_quantize(x, m, k, tile, codes.get(), scales.get(), corr.get());
    ks_q4_gemm_quantized(codes.get(), scales.get(), corr.get(), m, k, w, n, y, threads);
}
