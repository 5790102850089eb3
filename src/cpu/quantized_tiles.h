// Q8, Q4, IQ4_NL and MXFP4 matrices (the types of groups of 32 columns under one scale)
// re-laid out in tiles of 16 rows for the VNNI kernels: AVX-512's
// (matvec_quantized_avx512vnni.cpp; the GEMMs gemm_quantized_avx512vnni.cpp for Q8 and Q4,
// gemm_blocks_avx512vnni.cpp for IQ4_NL and MXFP4) and AVX-VNNI's (matvec_quantized_avxvnni.cpp;
// gemm_quantized_panels.h, gemm_blocks_panels.h), which read a 64-byte register of a tile as two
// halves of 8 rows. The CPU backend makes them once, when it takes the model on a
// path that reads them (uses_row_tiles, cpu/resident_weights.h), and points Matrix::row_tiles at
// them; the rows stay in the file's mapping for the other paths. (Q4_K's, Q5_K's, Q6_K's and
// IQ4_XS's tiles: cpu/super_block_tiles.h.)
//
// In a weight file a row's values and its scales are two streams (Q8, Q4) or one of small
// blocks (IQ4_NL, MXFP4), and each int32 lane of a vpdpbusd holds four columns of one row. In a
// tile each lane is one row: a register holds four columns of 16 rows, and the scales of a
// group sit beside its values, so a matvec reads one stream of whole cache lines, needs no
// horizontal sums, and scales 16 rows with one multiply.
//
// A matrix is its tiles one after another (rows 16t..16t+15), each tile its blocks of two
// groups (32 columns each; an odd last group is paired with an empty one), each block:
//
//   bytes 0-31    the 16 rows' scales of the first group, in row order, 16 bits each
//   bytes 32-63   those of the second group
//   then          the first group's values: kTileRegisters(type) registers of 64 bytes;
//                 register j holds in lane r (bytes 4r..4r+3) bytes 4j..4j+3 of the
//                 group's values in row r: Q8 as unsigned bytes (value + 128); Q4, IQ4_NL and
//                 MXFP4 the block's bytes of nibbles as they are (columns 4j..4j+3 in the low
//                 nibbles, 16+4j..16+4j+3 in the high; IQ4_NL's and MXFP4's nibbles index
//                 their table of levels)
//   then          the second group's values, likewise.
//
// The scales are f16 (Q8, Q4, IQ4_NL's d), but MXFP4's mxfp4_scale(e) = 2^(e − 128) is a bf16
// (the top half of its f32, exact: f16 cannot hold it).
//
// Blocks are whole cache lines (Q8 1088 bytes, the others 576). Rows past the matrix's end,
// columns past a Q8 row's end and the empty group hold zero: a scale of 0 (and values 0).
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <vector>

#include "cpu/kernels.h"
#include "weights/model.h"

namespace barellm::cpu {

constexpr int kTileRows = 16;      // rows of a tile: one per int32 lane of a register
constexpr int kTileLaneBytes = 4;  // bytes of one row in one register (a vpdpbusd lane)
constexpr int kTileRegisterBytes = kTileRows * kTileLaneBytes;     // 64
constexpr int kTileBlockGroups = 2;                                // groups per block
constexpr int kTileScaleBytes = kTileBlockGroups * kTileRows * 2;  // one cache line of f16
constexpr uint8_t kTileQ8Zero = 128;   // a Q8 value of 0, stored unsigned
constexpr uint8_t kTileQ4Zero = 0x88;  // two Q4 nibbles of 0 (8 stands for 0)

// Whether a matrix of this type has tiles of this layout: Q8, Q4, IQ4_NL, MXFP4.
constexpr bool has_group_tiles(DType type) {
    return type == DType::Q8_0 || type == DType::Q4_0 || type == DType::IQ4_NL ||
           type == DType::MXFP4;
}
// Whether its nibbles pick a level in a table (IQ4_NL, MXFP4).
constexpr bool looks_up_levels(DType type) { return type == DType::IQ4_NL || type == DType::MXFP4; }
// Bytes of one group's values in a row: Q8 32 (a byte a column), the others 16 (two columns a
// byte).
constexpr int tile_row_group_bytes(DType type) {
    return type == DType::Q8_0 ? kQ8Group : kQ4BlockBytes;
}
// Registers of one group's values in a tile: Q8 8, the others 4.
constexpr int tile_registers(DType type) { return tile_row_group_bytes(type) / kTileLaneBytes; }
constexpr size_t tile_group_bytes(DType type) {
    return size_t(tile_registers(type)) * kTileRegisterBytes;
}
constexpr size_t tile_block_bytes(DType type) {
    return kTileScaleBytes + kTileBlockGroups * tile_group_bytes(type);
}

// Where group g of a tile keeps its 16 f16 scales and its values.
inline const uint8_t* tile_group_block(const uint8_t* tile, DType type, int g) {
    return tile + size_t(g / kTileBlockGroups) * tile_block_bytes(type);
}
inline const uint16_t* tile_group_scales(const uint8_t* tile, DType type, int g) {
    return reinterpret_cast<const uint16_t*>(tile_group_block(tile, type, g)) +
           (g % kTileBlockGroups) * kTileRows;
}
inline const uint8_t* tile_group_values(const uint8_t* tile, DType type, int g) {
    return tile_group_block(tile, type, g) + kTileScaleBytes +
           (g % kTileBlockGroups) * tile_group_bytes(type);
}

// Whether matrices of this type can have tiles: Q8, Q4, IQ4_NL and MXFP4 (here), Q2_K, Q3_K, Q4_K,
// Q5_K, Q6_K and IQ4_XS (cpu/super_block_tiles.h); which level reads them: uses_row_tiles
// (cpu/kernels.h).
inline bool has_row_tiles(DType dtype) {
    return has_group_tiles(dtype) || dtype == DType::Q2_K || dtype == DType::Q3_K ||
           dtype == DType::Q4_K || dtype == DType::Q5_K || dtype == DType::Q6_K ||
           dtype == DType::IQ4_XS;
}
// Whether the SIMD kernels read matrices of this type from their tiles only, having none for
// their rows (Q2_K, Q3_K): without tiles such a matrix takes the scalar matvec and the f32 GEMM.
inline bool read_from_tiles_only(DType dtype) {
    return dtype == DType::Q2_K || dtype == DType::Q3_K;
}

// Of a matrix of a type that has tiles:
int tile_count(const Matrix& w);          // ceil(rows / 16)
int tile_groups(const Matrix& w);         // groups of 32 of a row (this layout's types)
size_t tile_bytes(const Matrix& w);       // bytes of one tile
size_t row_tiles_bytes(const Matrix& w);  // bytes of all the tiles of w

// x's values as the tile matvecs (avx512:: and avxvnni::matvec_rows_q8/_q4/_lookup_blocks) read
// them, padded with zeros to whole groups: the calling thread's copy, rewritten at each call.
// A tile's weights are unsigned, Q8's value + 128, Q4's nibble q standing for q − 8, IQ4_NL's
// and MXFP4's levels looked up as level + 128, so each group's dot product is tile_offset × Σx
// too large: it starts from tile_group_start, which makes its int32 result exact.
const std::vector<int8_t>& padded_tile_x(const QuantizedVector& x);
constexpr int kTileLevelExcess = 128;  // IQ4_NL's and MXFP4's looked-up levels, + 128
constexpr int tile_offset(DType type) {
    return type == DType::Q8_0 ? kTileQ8Zero : type == DType::Q4_0 ? kQ4Offset : kTileLevelExcess;
}
inline int32_t tile_group_start(const QuantizedVector& x, int g, int offset) {
    return -offset * int32_t(x.group_sums[g]);
}
// How far ahead of the block being read the tile matvecs ask for cache lines, in bytes: on
// Intel, where the loads waited for memory without it, 12 lines; 0 where the hardware
// prefetcher streams the tiles faster alone (cpu_prefetches_tiles_unaided;
// docs/benchmarks-history.md: "CPU: software prefetch distances of the decode matvecs").
int tile_prefetch_bytes();

// A 64-byte aligned buffer of bytes.
struct FreeBytes {
    void operator()(uint8_t* p) const { std::free(p); }
};
using AlignedBytes = std::unique_ptr<uint8_t, FreeBytes>;

// Writes the tiles of w (a type of this layout or of cpu/super_block_tiles.h) to the
// row_tiles_bytes(w) bytes at `tiles`, 64-byte aligned.
void write_row_tiles(const Matrix& w, uint8_t* tiles);
// The tiles of w in a new buffer; throws Error when memory runs out.
AlignedBytes make_row_tiles(const Matrix& w);

}  // namespace barellm::cpu
