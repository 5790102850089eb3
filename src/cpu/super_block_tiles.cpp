// Q4_K matrices in tiles of 16 rows (the layout: cpu/super_block_tiles.h).
#include "cpu/super_block_tiles.h"

#include <cstring>

#include "util/error.h"

namespace barellm::cpu {

namespace {

int super_blocks(const Matrix& w) { return w.cols / kSuperBlock; }

// Row `lane` of a tile's super-block `tile_block` from the block as the file has it.
void write_row(uint8_t* tile_block, int lane, const BlockQ4_K& block) {
    std::memcpy(tile_block + kQ4KTileDOffset + 2 * lane, &block.d, sizeof block.d);
    std::memcpy(tile_block + kQ4KTileDMinOffset + 2 * lane, &block.dmin, sizeof block.dmin);
    for (int j = 0; j < kKSubBlocks; ++j) {
        int scale, min;
        k_scale_min(block.scales, j, &scale, &min);
        tile_block[kQ4KTileScalesOffset + kTileRows * j + lane] = uint8_t(scale);
        tile_block[kQ4KTileMinsOffset + 2 * kTileRows * (j / 2) + 2 * lane + j % 2] = uint8_t(min);
    }
    for (int c = 0; c < kQ4KChunks; ++c)
        for (int k = 0; k < kQ4KChunkRegisters; ++k)
            std::memcpy(tile_block + kQ4KTileValuesOffset + c * kQ4KTileChunkBytes +
                            k * kTileRegisterBytes + lane * kTileLaneBytes,
                        block.qs + c * kQ4KChunkBytes + k * kTileLaneBytes, kTileLaneBytes);
}

}  // namespace

size_t q4_k_tile_bytes(const Matrix& w) { return size_t(super_blocks(w)) * kQ4KTileBlockBytes; }

void write_q4_k_tiles(const Matrix& w, uint8_t* tiles) {
    if (w.dtype != DType::Q4_K) throw Error("write_q4_k_tiles: not a Q4_K matrix");
    std::memset(tiles, 0, row_tiles_bytes(w));
    for (int r = 0; r < w.rows; ++r) {
        uint8_t* tile = tiles + size_t(r / kTileRows) * q4_k_tile_bytes(w);
        for (int b = 0; b < super_blocks(w); ++b) {
            // The file's blocks are only 2-byte aligned: copied out before being read.
            BlockQ4_K block;
            std::memcpy(&block, w.row_data(r) + size_t(b) * sizeof block, sizeof block);
            write_row(tile + size_t(b) * kQ4KTileBlockBytes, r % kTileRows, block);
        }
    }
}

}  // namespace barellm::cpu
