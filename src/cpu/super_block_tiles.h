// Q4_K matrices re-laid out in tiles of 16 rows for the AVX-512 VNNI decode matvec
// (matvec_super_block_tiles_avx512vnni.cpp), as Q8 and Q4 are (cpu/quantized_tiles.h). The CPU
// backend makes them once, when it takes the model on the AVX-512 path of a CPU with
// AVX512_VNNI (cpu/resident_weights.h), and points Matrix::row_tiles at them; the rows of
// super-blocks stay in the file's mapping for the other paths (AVX2, scalar, the prefill GEMM).
//
// In a row of super-blocks each int32 lane of a vpdpbusd holds four columns of one row, and
// the 6-bit scales and mins come packed in 12 bytes a super-block. In a tile each lane is one
// row: a register holds four columns of 16 rows, so a matvec needs no horizontal sums, and the
// scales and mins are unpacked to a byte each, 16 rows side by side, ready to widen.
//
// A matrix is its tiles one after another (rows 16t..16t+15), each tile its super-blocks of
// 256 columns one after another, each super-block kQ4KTileBlockBytes (2368, 37 cache lines;
// the 16 rows' blocks take 2304):
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
// Rows past the matrix's end are zero throughout.
#pragma once
#include <cstddef>
#include <cstdint>

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

// For tile_bytes and write_row_tiles (cpu/quantized_tiles.h): bytes of one tile of a Q4_K
// matrix, and its tiles written to the row_tiles_bytes(w) bytes at `tiles`, 64-byte aligned.
size_t q4_k_tile_bytes(const Matrix& w);
void write_q4_k_tiles(const Matrix& w, uint8_t* tiles);

}  // namespace barellm::cpu
