// Q8 and Q4 matrices in tiles of 16 rows (the layout: cpu/quantized_tiles.h).
#include "cpu/quantized_tiles.h"

#include <algorithm>
#include <cstring>
#include <new>
#include <string>

#include "cpu/panel_prefetcher.h"
#include "cpu/super_block_tiles.h"
#include "util/error.h"
#include "weights/safetensors.h"

namespace barellm::cpu {

namespace {

constexpr size_t kAlignment = 64;  // bytes: a register, a cache line

int tile_blocks(const Matrix& w) {
    return (w.scale_count_per_row() + kTileBlockGroups - 1) / kTileBlockGroups;
}

// The bytes of group g of row r as a tile stores them: Q8 unsigned (value + 128, zero past
// the row's end), Q4 as they are.
void stored_group(uint8_t* dest, const Matrix& w, int r, int g) {
    const int group_bytes = tile_row_group_bytes(w.dtype);
    const uint8_t* row = static_cast<const uint8_t*>(w.data) + size_t(r) * w.row_bytes();
    if (w.dtype == DType::Q4_0) {
        std::memcpy(dest, row + size_t(g) * group_bytes, group_bytes);
        return;
    }
    for (int i = 0; i < group_bytes; ++i) {
        const int col = g * group_bytes + i;
        dest[i] = col < w.cols ? uint8_t(row[col] ^ kTileQ8Zero) : kTileQ8Zero;
    }
}

}  // namespace

int tile_count(const Matrix& w) { return (w.rows + kTileRows - 1) / kTileRows; }

size_t tile_bytes(const Matrix& w) {
    if (is_block_type(w.dtype)) return super_block_tile_bytes(w);
    return size_t(tile_blocks(w)) * tile_block_bytes(w.dtype);
}

size_t row_tiles_bytes(const Matrix& w) { return size_t(tile_count(w)) * tile_bytes(w); }

void write_row_tiles(const Matrix& w, uint8_t* tiles) {
    if (is_block_type(w.dtype)) return write_super_block_tiles(w, tiles);
    if (!is_quantized(w.dtype)) throw Error("write_row_tiles: not a Q8 or Q4 matrix");
    const size_t bytes = row_tiles_bytes(w);
    const DType type = w.dtype;
    const int groups = w.scale_count_per_row();
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
                scales[lane] = w.scales[size_t(r) * groups + g];
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
