// The packed int4 g32 weight layout and the int8 activation layout that q4_gemm reads.
//
// Weights, per output row, per super-block of 16 groups (512 weights along K): 256 bytes of
// codes, then the 16 groups' fp16 scales (32 bytes): 288 bytes, 0.5625 bytes a weight (Q4_0's).
// Rows come in tiles of 4 (kTileRows), their super-blocks interleaved: tile, super-block, row.
// A kernel reads 4 rows at once, so its reads are one sequential stream (rows one after another
// were 4 short streams a tile: at K = 2048, 1152 bytes each, the GEMV ran at half speed).
// A weight is (code - 8) * scale, codes 0..15 (MatMulNBits' symmetric int4 with its default
// zero point 8). The codes are interleaved for VNNI: vpdpbusd multiplies 4 consecutive bytes
// of a 32-bit lane and adds them into that lane, so lane i of every 64-byte vector holds 4
// weights of group i. Chunk c (0..3, 64 bytes) byte 4i+j: low nibble weight 4c+j of group i
// ("step" c), high nibble weight 16+4c+j (step c+4). One load, one AND and one shift+AND give
// two steps; eight vpdpbusd into one accumulator finish 16 groups, each lane one group's dot
// product, so the per-group scales apply as one 16-lane multiply (no horizontal sums, no
// scale broadcasts) and the fp16 scales load as one 256-bit vector.
//
// Activations, per row, quantized per group of 32 to int8 (llama.cpp's Q8_0 idea), in the
// same interleave: per super-block 8 step vectors of 64 bytes (step s, lane i = bytes 4s..4s+3
// of group i); per group a float scale and -8 * the sum of its codes (the zero point's share
// of the dot product, the accumulator's starting value). Rows come in tiles of `tile` rows (1
// for the GEMV, 4 for the GEMM: rows padded with zeros to a whole tile), interleaved per step:
// a GEMM tile's 4 rows x 8 steps of a super-block are one 2 KiB run, read in order.
#pragma once

#include <cstdint>

namespace ks {

constexpr int64_t kGroup = 32;
constexpr int64_t kSuper = 512;  // weights of one super-block along K
constexpr int64_t kSuperCodes = 256;
constexpr int64_t kSuperBytes = kSuperCodes + 16 * 2;  // codes + fp16 scales

constexpr int64_t kTileRows = 4;  // weight rows a tile
constexpr int kActTile = 4;  // activation rows a tile in the GEMM

inline int64_t packed_row_bytes(int64_t k) { return k / kSuper * kSuperBytes; }

// Byte offset of row `row`'s super-block `sb` in a packed weight of k columns.
inline int64_t packed_offset(int64_t row, int64_t sb, int64_t k) {
    const int64_t tile = row / kTileRows, r = row % kTileRows;
    return tile * kTileRows * packed_row_bytes(k) + (sb * kTileRows + r) * kSuperBytes;
}

// Where row `row`'s super-block `sb` starts among activation codes (add s * tile * 64 for step
// s) and among its scales and corrections (16 each), for rows in tiles of `tile`.
inline int64_t act_code_offset(int64_t row, int64_t sb, int64_t k, int64_t tile) {
    return ((row / tile * (k / kSuper) + sb) * 8 * tile + row % tile) * 64;
}
inline int64_t act_scale_offset(int64_t row, int64_t sb, int64_t k, int64_t tile) {
    return ((row / tile * (k / kSuper) + sb) * tile + row % tile) * 16;
}

// An activation matrix quantized for q4_gemm: m rows of k (m a multiple of tile), tiled.
struct QuantizedActs {
    const int8_t* codes;   // [m, k] interleaved as above
    const float* scales;   // [m, k / 32]
    const int32_t* corr;   // [m, k / 32]
    int64_t m, k, tile;
};

}  // namespace ks
