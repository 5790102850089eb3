// Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and IQ4_XS matrices re-laid out in tiles of 16 rows for the decode
// matvecs on AVX-512 VNNI (matvec_super_block_tiles_avx512vnni.cpp) and AVX2
// (matvec_super_block_tiles_avx2.cpp, a tile's register read as two halves of 8 rows) and the
// prefill GEMMs (gemm_blocks_avx512vnni.cpp, avx2/gemm_blocks_panels.h), as Q8 and Q4 are
// (cpu/quantized_tiles.h). The CPU backend makes them once, when it takes the model on the AVX2
// or AVX-512 path (cpu/resident_weights.h), and points Matrix::row_tiles at them; the rows of
// super-blocks stay in the file's mapping for the scalar path.
//
// In a row of super-blocks each int32 lane of a vpdpbusd holds four columns of one row, and
// Q4_K's 6-bit scales and mins come packed in 12 bytes a super-block. In a tile each lane is
// one row: a register holds four columns of 16 rows, so a matvec needs no horizontal sums, and
// the scales (and mins) are a byte each, 16 rows side by side, ready to widen.
//
// A matrix is its tiles one after another (rows 16t..16t+15), each tile its super-blocks of
// 256 columns one after another. Rows past the matrix's end are zero throughout.
//
// Q4_K: a super-block kQ4KTileBlockBytes (2368, 37 cache lines; the 16 rows' blocks take 2304):
//
//   bytes 0-31      the 16 rows' f16 d, in row order
//   bytes 32-63     the 16 rows' f16 dmin
//   bytes 64-191    the scales: byte 16j + r the 6-bit scale of sub-block j (0..7) of row r
//   bytes 192-319   the mins by pairs of sub-blocks: bytes 32p + 2r and 32p + 2r + 1 the 6-bit
//                   mins of sub-blocks 2p and 2p + 1 (p 0..3) of row r
//   bytes 320-2367  the values, chunk c (0..3) of 32 bytes of each row's qs after another, 512
//                   bytes each: 8 registers of 64 bytes; register k holds in lane r (bytes
//                   4r..4r+3) bytes 4k..4k+3 of chunk c of row r, as the block has them
//                   (columns 64c + 4k..64c + 4k + 3, sub-block 2c, in the low nibbles, and
//                   those 32 columns on, sub-block 2c + 1, in the high).
//
// Q5_K: a super-block kQ5KTileBlockBytes (2880, 45 cache lines; the 16 rows' blocks take
// 2816): Q4_K's fields, then the levels q (0..31) of each pair of columns a chunk takes in one
// byte, sub-block 2c's whole and three bits of sub-block 2c + 1's, and the top two bits of the
// latter before them, so that a super-block is read front to back, as one stream:
//
//   bytes 0-319     as Q4_K's: d, dmin, scales, mins
//   bytes 320-831   the top bits: 8 registers; register k holds in lane r four bytes, of
//                   columns 4k + m (m 0..3), whose bits 2c and 2c + 1 are bits 3 and 4 of q
//                   of column 64c + 32 + 4k + m of row r (c 0..3)
//   bytes 832-2879  the values, laid out as Q4_K's bytes 320-2367: the byte of chunk c's
//                   register k, lane r, byte m holds q of column 64c + 4k + m (sub-block 2c)
//                   in bits 0-4 and bits 0-2 of q of column 64c + 32 + 4k + m (sub-block
//                   2c + 1) in bits 5-7. So sub-block 2c's levels come out by one AND, and
//                   2c + 1's by a shift and an AND joined to their two top bits.
//
// Q6_K: a super-block kQ6KTileBlockBytes (3392, 53 cache lines; the 16 rows' blocks take 3360):
//
//   bytes 0-31      the 16 rows' f16 d, in row order
//   bytes 32-63     zero
//   bytes 64-319    the scales: byte 16i + r the int8 scale of sub-block i (0..15) of row r
//   bytes 320-3391  the levels q (0..63), sub-block i (16 columns) after another, 192 bytes
//                   each: three registers; in lane r, byte m (0..3) of register s (0..2)
//                   holds q of column 16i + 4s + m in bits 0-5 and two bits of q of column
//                   16i + 12 + m in bits 6-7: its bits 2s and 2s + 1. So three levels come
//                   out by one AND each, and the fourth is gathered from the three top pairs.
//
// Q3_K: a super-block kQ3KTileBlockBytes (1856, 29 cache lines; the 16 rows' blocks take 1760):
//
//   bytes 0-31      the 16 rows' f16 d, in row order
//   bytes 32-63     zero
//   bytes 64-319    the scales: byte 16i + r the int8 scale sc − 32 of sub-block i (0..15) of
//                   row r
//   bytes 320-1855  the levels q (0..7), a pair of sub-blocks A = 2p and B = 2p + 1 (32 columns)
//                   after another, 192 bytes each: three registers R0, R1, R2. In lane r, byte m
//                   (0..3) of each holds two levels whole, in bits 0-2 and 3-5, and two bits of
//                   another in bits 6-7; with q(X, c) the level of column c of sub-block X:
//                     R0: q(A, m), q(A, 4 + m), bits 0-1 of q(B, 8 + m)
//                     R1: q(A, 8 + m), q(A, 12 + m), bit 2 of q(B, 8 + m), bit 0 of q(B, 12 + m)
//                     R2: q(B, m), q(B, 4 + m), bits 1-2 of q(B, 12 + m)
//                   So six registers of levels come out by an AND (and a shift) each, and two
//                   are gathered from the top bits.
//
// Q2_K: a super-block kQ2KTileBlockBytes (1344, 21 cache lines, as many bytes as the 16 rows'
// blocks):
//
//   bytes 0-31      the 16 rows' f16 d, in row order
//   bytes 32-63     the 16 rows' f16 dmin
//   bytes 64-319    the scales and mins by pairs of sub-blocks: bytes 32p + 2r and 32p + 2r + 1
//                   the block's bytes scales[2p] and scales[2p + 1] of row r (p 0..7): the
//                   4-bit scale in the low nibble, the 4-bit min in the high
//   bytes 320-1343  the levels q (0..3), sub-block i (16 columns) after another, one register
//                   each: in lane r, byte m (0..3) holds q of column 16i + 4s + m in bits 2s
//                   and 2s + 1 (s 0..3). So each register of levels comes out by a shift and
//                   an AND.
//
// IQ4_XS: a super-block kIq4XSTileBlockBytes (2240, 35 cache lines; the 16 rows' blocks take
// 2176):
//
//   bytes 0-31      the 16 rows' f16 d, in row order
//   bytes 32-63     zero
//   bytes 64-191    the scales: byte 16j + r the int8 scale ls − 32 of sub-block j (0..7) of
//                   row r
//   bytes 192-2239  the 4-bit indices, sub-block j (32 columns) after another, 256 bytes each:
//                   four registers; register k holds in lane r bytes 4k..4k+3 of sub-block j's
//                   16 bytes of qs of row r, as the block has them (columns 32j + 4k..32j + 4k
//                   + 3 in the low nibbles, the 16 columns on in the high).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "cpu/kernels.h"
#include "cpu/panel_prefetcher.h"
#include "cpu/quantized_tiles.h"
#include "weights/model.h"
#include "weights/weight_blocks.h"

namespace barellm::cpu {

constexpr int kKSubBlocks = kSuperBlock / kSubBlock;          // 8 sub-blocks of 32 columns
constexpr int kQ4KChunks = 4;                                 // chunks of qs: two sub-blocks each
constexpr int kQ4KChunkBytes = kSuperBlock / 2 / kQ4KChunks;  // 32 bytes of a row
constexpr int kQ4KChunkRegisters = kQ4KChunkBytes / kTileLaneBytes;  // 8
// Byte offsets in a tile's super-block.
constexpr int kQ4KTileDOffset = 0;
constexpr int kQ4KTileDMinOffset = kTileRows * 2;                                   // 32
constexpr int kQ4KTileScalesOffset = 2 * kTileRows * 2;                             // 64
constexpr int kQ4KTileMinsOffset = kQ4KTileScalesOffset + kKSubBlocks * kTileRows;  // 192
constexpr int kQ4KTileValuesOffset = kQ4KTileMinsOffset + kKSubBlocks * kTileRows;  // 320
constexpr int kQ4KTileChunkBytes = kQ4KChunkRegisters * kTileRegisterBytes;         // 512
constexpr int kQ4KTileBlockBytes = kQ4KTileValuesOffset + kQ4KChunks * kQ4KTileChunkBytes;
static_assert(kQ4KTileBlockBytes == 2368 && kQ4KTileBlockBytes % 64 == 0);

constexpr int kQ5KTileHighOffset = kQ4KTileValuesOffset;  // 320: the top bits
// A Q5_K tile's value byte: sub-block 2c's level in its low kQ5KLowBits, the low
// kQ5KSecondLowBits of sub-block 2c + 1's above.
constexpr int kQ5KLowBits = 5, kQ5KSecondLowBits = 8 - kQ5KLowBits;
constexpr int kQ5KTileValuesOffset =
    kQ5KTileHighOffset + kQ4KChunkRegisters * kTileRegisterBytes;  // 832
constexpr int kQ5KTileBlockBytes = kQ5KTileValuesOffset + kQ4KChunks * kQ4KTileChunkBytes;
static_assert(kQ5KTileBlockBytes == 2880 && kQ5KTileBlockBytes % 64 == 0);
// Where the values start in a Q4_K (fifth_bit false) or Q5_K tile's super-block.
constexpr int k_tile_values_offset(bool fifth_bit) {
    return fifth_bit ? kQ5KTileValuesOffset : kQ4KTileValuesOffset;
}

constexpr int kQ6KSubBlocks = kSuperBlock / kQ6SubBlock;  // 16 sub-blocks of 16 columns
constexpr int kQ6KTileDOffset = 0;
constexpr int kQ6KTileScalesOffset = 64;
constexpr int kQ6KTileValuesOffset = kQ6KTileScalesOffset + kQ6KSubBlocks * kTileRows;  // 320
constexpr int kQ6KTileSubBlockBytes = 3 * kTileRegisterBytes;                           // 192
constexpr int kQ6KTileBlockBytes = kQ6KTileValuesOffset + kQ6KSubBlocks * kQ6KTileSubBlockBytes;
static_assert(kQ6KTileBlockBytes == 3392 && kQ6KTileBlockBytes % 64 == 0);

constexpr int kQ3KSubBlocks = kSuperBlock / kQ6SubBlock;  // 16 sub-blocks of 16 columns
constexpr int kQ3KTileDOffset = 0;
constexpr int kQ3KTileScalesOffset = 64;
constexpr int kQ3KTileValuesOffset = kQ3KTileScalesOffset + kQ3KSubBlocks * kTileRows;  // 320
constexpr int kQ3KTilePairBytes = 3 * kTileRegisterBytes;  // R0, R1, R2
constexpr int kQ3KTileBlockBytes = kQ3KTileValuesOffset + kQ3KSubBlocks / 2 * kQ3KTilePairBytes;
static_assert(kQ3KTileBlockBytes == 1856 && kQ3KTileBlockBytes % 64 == 0);

constexpr int kQ2KSubBlocks = kSuperBlock / kQ6SubBlock;  // 16 sub-blocks of 16 columns
constexpr int kQ2KTileDOffset = 0;
constexpr int kQ2KTileDMinOffset = kTileRows * 2;                                       // 32
constexpr int kQ2KTileScalesOffset = 2 * kTileRows * 2;                                 // 64
constexpr int kQ2KTileValuesOffset = kQ2KTileScalesOffset + kQ2KSubBlocks * kTileRows;  // 320
constexpr int kQ2KLevelBits = 2;  // bits of a level in a value byte
constexpr int kQ2KMinShift = 4;   // a scales byte: the scale in bits 0-3, the min in bits 4-7
constexpr int kQ2KTileBlockBytes = kQ2KTileValuesOffset + kQ2KSubBlocks * kTileRegisterBytes;
static_assert(kQ2KTileBlockBytes == 1344 && kQ2KTileBlockBytes % 64 == 0 &&
              kQ2KTileBlockBytes == kTileRows * int(sizeof(BlockQ2_K)));

constexpr int kIq4XSSubBlocks = kSuperBlock / kSubBlock;  // 8 sub-blocks of 32 columns
constexpr int kIq4XSSubBlockRegisters = kSubBlock / 2 / kTileLaneBytes;  // 4
constexpr int kIq4XSTileDOffset = 0;
constexpr int kIq4XSTileScalesOffset = 64;
constexpr int kIq4XSTileValuesOffset = kIq4XSTileScalesOffset + kIq4XSSubBlocks * kTileRows;  // 192
constexpr int kIq4XSTileSubBlockBytes = kIq4XSSubBlockRegisters * kTileRegisterBytes;         // 256
constexpr int kIq4XSTileBlockBytes =
    kIq4XSTileValuesOffset + kIq4XSSubBlocks * kIq4XSTileSubBlockBytes;
static_assert(kIq4XSTileBlockBytes == 2240 && kIq4XSTileBlockBytes % 64 == 0);

// The largest super-block of a tile, of any type.
constexpr int kLargestTileBlockBytes = kQ6KTileBlockBytes;
static_assert(kLargestTileBlockBytes >= kQ2KTileBlockBytes &&
              kLargestTileBlockBytes >= kQ3KTileBlockBytes &&
              kLargestTileBlockBytes >= kQ4KTileBlockBytes &&
              kLargestTileBlockBytes >= kQ5KTileBlockBytes &&
              kLargestTileBlockBytes >= kIq4XSTileBlockBytes);

// Bytes of one super-block of a tile: Q2_K's, Q3_K's, Q4_K's, Q5_K's, Q6_K's or IQ4_XS's.
constexpr int super_block_tile_bytes(DType type) {
    return type == DType::Q2_K   ? kQ2KTileBlockBytes
           : type == DType::Q3_K ? kQ3KTileBlockBytes
           : type == DType::Q4_K ? kQ4KTileBlockBytes
           : type == DType::Q5_K ? kQ5KTileBlockBytes
           : type == DType::Q6_K ? kQ6KTileBlockBytes
                                 : kIq4XSTileBlockBytes;
}

// For tile_bytes and write_row_tiles (cpu/quantized_tiles.h): bytes of one tile of a Q2_K,
// Q3_K, Q4_K, Q5_K, Q6_K or IQ4_XS matrix, and its tiles written to the row_tiles_bytes(w) bytes at
// `tiles`, 64-byte aligned.
size_t super_block_tile_bytes(const Matrix& w);
void write_super_block_tiles(const Matrix& w, uint8_t* tiles);

// How a decode matvec on `type`'s tiles asks for cache lines by software prefetch: `bytes` ahead
// of the super-block it reads (0: none), each step over a super-block asking for its share of
// that one's lines, a line or two at a time (prefetch_share), into L2 only or on into L1. A tile
// is read as one stream, front to back. Measured per CPU (docs/BENCHMARKS.md: "The change: the
// next super-block asked for into L2", "CPU: the AVX2 super-block tiles asked for a line at a
// time"; docs/benchmarks-history.md: "CPU: software prefetch of the super-block tiles"):
// - Intel: the next super-block, into L2 (prefetcht1), on AVX-512 and AVX2 alike: K-quant
//   decode 1.2-1.6 times as fast as with four super-blocks ahead into L1 (Q6_K on AVX2 from
//   54-59% of the streaming read to 86-92%), and faster than with none.
// - AMD without AVX-512 (Zen 3): the next super-block, into L1: the AVX2 kernel reads its
//   tiles 1.3-1.5 times as fast as with none.
// - AMD with AVX-512 (Zen 4, cpu_prefetches_tiles_unaided): none.
struct TilePrefetch {
    int bytes = 0;
    bool into_l2 = false;
};
TilePrefetch super_block_prefetch(DType type);
// The lines that `prefetch` asks for while super-block `block` is read.
inline LinesAhead lines_ahead(const uint8_t* block, TilePrefetch prefetch) {
    return {prefetch.bytes > 0 ? block + prefetch.bytes : nullptr, prefetch.into_l2};
}

// x's sums by pairs as the tile kernels read them, two int16 in an int32 (the lower one
// first): of 32 values (Q4_K's and Q5_K's mins are applied with them), into `pairs` [n / 64], and
// of 16 (Q2_K's mins; Q6_K's offset of 32, Q3_K's of 4), into `pairs` [n / 32].
void pair_sums_of_32(std::vector<int32_t>* pairs, const Q8KVector& x);
void pair_sums_of_16(std::vector<int32_t>* pairs, const Q8KVector& x);

// One token's x as a tile kernel reads it: Q8_K values and d, and `sums`, what `sums_of` (one
// of the above, or a kernel's own) makes of x's sums.
struct TileTokenX {
    const int8_t* values;
    const float* d;
    const int32_t* sums;
};
using TileSums = void (*)(std::vector<int32_t>* sums, const Q8KVector& x);
// The `tokens` x[t] so, in the calling thread's storage, kept until its next call.
const TileTokenX* tile_tokens(const Q8KVector* x, int tokens, TileSums sums_of);

}  // namespace barellm::cpu
