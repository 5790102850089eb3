// Q8, Q4, IQ4_NL and MXFP4 matrices in tiles of 16 rows (the layout: cpu/quantized_tiles.h).
#include "cpu/quantized_tiles.h"

#include <algorithm>
#include <cstring>
#include <new>
#include <string>

#include "cpu/panel_prefetcher.h"
#include "cpu/super_block_tiles.h"
#include "util/error.h"
#include "weights/half.h"
#include "weights/safetensors.h"
#include "weights/weight_blocks.h"

namespace barellm::cpu {

namespace {

constexpr size_t kAlignment = 64;  // bytes: a register, a cache line

int tile_blocks(const Matrix& w) {
    return (tile_groups(w) + kTileBlockGroups - 1) / kTileBlockGroups;
}

// Block g of row r of an IQ4_NL or MXFP4 matrix.
const uint8_t* lookup_block(const Matrix& w, int r, int g) {
    return w.row_data(r) + size_t(g) * block_bytes(w.dtype);
}

// The scale of group g of row r as a tile stores it: f16, MXFP4's mxfp4_scale(e) as a bf16 (a
// power of two or 0: its f32's low half is zero, and the top half is the bf16).
uint16_t stored_scale(const Matrix& w, int r, int g) {
    if (w.dtype == DType::MXFP4)
        return uint16_t(
            float_to_bits(mxfp4_scale(lookup_block(w, r, g)[offsetof(BlockMXFP4, e)])) >> 16);
    if (w.dtype == DType::IQ4_NL) {
        uint16_t d;
        std::memcpy(&d, lookup_block(w, r, g) + offsetof(BlockIQ4_NL, d), sizeof d);
        return d;
    }
    return w.scales[size_t(r) * tile_groups(w) + g];
}

// The bytes of group g of row r as a tile stores them: Q8 unsigned (value + 128, zero past
// the row's end), the nibbles of the others as they are.
void stored_group(uint8_t* dest, const Matrix& w, int r, int g) {
    const int group_bytes = tile_row_group_bytes(w.dtype);
    const uint8_t* row = static_cast<const uint8_t*>(w.data) + size_t(r) * w.row_bytes();
    if (w.dtype == DType::Q4_0) {
        std::memcpy(dest, row + size_t(g) * group_bytes, group_bytes);
        return;
    }
    if (looks_up_levels(w.dtype)) {
        const size_t nibbles =
            w.dtype == DType::IQ4_NL ? offsetof(BlockIQ4_NL, qs) : offsetof(BlockMXFP4, qs);
        std::memcpy(dest, lookup_block(w, r, g) + nibbles, group_bytes);
        return;
    }
    for (int i = 0; i < group_bytes; ++i) {
        const int col = g * group_bytes + i;
        dest[i] = col < w.cols ? uint8_t(row[col] ^ kTileQ8Zero) : kTileQ8Zero;
    }
}

}  // namespace

int tile_count(const Matrix& w) { return (w.rows + kTileRows - 1) / kTileRows; }

int tile_groups(const Matrix& w) {
    return looks_up_levels(w.dtype) ? w.cols / kSmallBlock : w.scale_count_per_row();
}

size_t tile_bytes(const Matrix& w) {
    if (!has_group_tiles(w.dtype)) return super_block_tile_bytes(w);
    return size_t(tile_blocks(w)) * tile_block_bytes(w.dtype);
}

size_t row_tiles_bytes(const Matrix& w) { return size_t(tile_count(w)) * tile_bytes(w); }

void write_row_tiles(const Matrix& w, uint8_t* tiles) {
    if (!has_group_tiles(w.dtype)) return write_super_block_tiles(w, tiles);
    const size_t bytes = row_tiles_bytes(w);
    const DType type = w.dtype;
    const int groups = tile_groups(w);
    const uint8_t zero = type == DType::Q8_0 ? kTileQ8Zero : kTileQ4Zero;
    std::memset(tiles, zero, bytes);
    uint8_t group[kQ8Group];
    for (int t = 0; t < tile_count(w); ++t)
        for (int g = 0; g < tile_blocks(w) * kTileBlockGroups; ++g) {
            const uint8_t* tile = tiles + size_t(t) * tile_bytes(w);
            uint16_t* scales = const_cast<uint16_t*>(tile_group_scales(tile, type, g));
            uint8_t* values = const_cast<uint8_t*>(tile_group_values(tile, type, g));
            for (int lane = 0; lane < kTileRows; ++lane) {
                const int r = t * kTileRows + lane;
                if (r >= w.rows || g >= groups) {  // zero: scale 0, values already zero
                    scales[lane] = 0;
                    continue;
                }
                scales[lane] = stored_scale(w, r, g);
                stored_group(group, w, r, g);
                for (int j = 0; j < tile_registers(type); ++j)
                    std::memcpy(values + j * kTileRegisterBytes + lane * kTileLaneBytes,
                                group + j * kTileLaneBytes, kTileLaneBytes);
            }
        }
}

const std::vector<int8_t>& padded_tile_x(const QuantizedVector& x) {
    static thread_local std::vector<int8_t> padded;
    padded.assign(x.scales.size() * kQ8Group, 0);
    std::copy(x.values.begin(), x.values.end(), padded.begin());
    return padded;
}

int tile_prefetch_bytes() {
    constexpr int kIntelPrefetchLines = 12;
    static const int bytes = cpu_prefetches_tiles_unaided() ? 0 : kIntelPrefetchLines * kCacheLine;
    return bytes;
}

AlignedBytes make_row_tiles(const Matrix& w) {
    const size_t bytes = row_tiles_bytes(w);
    AlignedBytes tiles(static_cast<uint8_t*>(std::aligned_alloc(kAlignment, bytes)));
    if (!tiles) throw Error("out of memory for " + std::to_string(bytes) + " bytes of tiles");
    write_row_tiles(w, tiles.get());
    return tiles;
}

}  // namespace barellm::cpu
