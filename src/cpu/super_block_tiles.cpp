// Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and IQ4_XS matrices in tiles of 16 rows (the layout:
// cpu/super_block_tiles.h).
#include "cpu/super_block_tiles.h"

#include <cstring>

#include "util/error.h"

namespace barellm::cpu {

namespace {

int super_blocks(const Matrix& w) { return w.cols / kSuperBlock; }

// The d, dmin, scales and mins of row `lane` of a Q4_K or Q5_K tile's super-block `tile_block`.
template <typename KBlock>
void write_row_scales(uint8_t* tile_block, int lane, const KBlock& block) {
    std::memcpy(tile_block + kQ4KTileDOffset + 2 * lane, &block.d, sizeof block.d);
    std::memcpy(tile_block + kQ4KTileDMinOffset + 2 * lane, &block.dmin, sizeof block.dmin);
    for (int j = 0; j < kKSubBlocks; ++j) {
        int scale, min;
        k_scale_min(block.scales, j, &scale, &min);
        tile_block[kQ4KTileScalesOffset + kTileRows * j + lane] = uint8_t(scale);
        tile_block[kQ4KTileMinsOffset + 2 * kTileRows * (j / 2) + 2 * lane + j % 2] = uint8_t(min);
    }
}

// Row `lane` of a tile's super-block `tile_block` from the block as the file has it.
void write_row(uint8_t* tile_block, int lane, const BlockQ4_K& block) {
    write_row_scales(tile_block, lane, block);
    for (int c = 0; c < kQ4KChunks; ++c)
        for (int k = 0; k < kQ4KChunkRegisters; ++k)
            std::memcpy(tile_block + kQ4KTileValuesOffset + c * kQ4KTileChunkBytes +
                            k * kTileRegisterBytes + lane * kTileLaneBytes,
                        block.qs + c * kQ4KChunkBytes + k * kTileLaneBytes, kTileLaneBytes);
}

void write_row(uint8_t* tile_block, int lane, const BlockQ5_K& block) {
    write_row_scales(tile_block, lane, block);
    for (int c = 0; c < kQ4KChunks; ++c)
        for (int column = 0; column < kQ4KChunkBytes; ++column) {
            constexpr int kNibbleBits = 4;
            const int packed = block.qs[c * kQ4KChunkBytes + column];
            const int first = (packed & 15) | (block.qh[column] >> (2 * c) & 1) << kNibbleBits;
            const int second = (packed >> kNibbleBits) | (block.qh[column] >> (2 * c + 1) & 1)
                                                             << kNibbleBits;
            // Register k = column / 4 of the chunk, byte column % 4 of lane `lane`.
            const int at = column / kTileLaneBytes * kTileRegisterBytes + lane * kTileLaneBytes +
                           column % kTileLaneBytes;
            tile_block[kQ5KTileValuesOffset + c * kQ4KTileChunkBytes + at] =
                uint8_t(first | (second & ((1 << kQ5KSecondLowBits) - 1)) << kQ5KLowBits);
            tile_block[kQ5KTileHighOffset + at] |=  // the tiles start zeroed
                uint8_t((second >> kQ5KSecondLowBits) << (2 * c));
        }
}

void write_row(uint8_t* tile_block, int lane, const BlockQ6_K& block) {
    std::memcpy(tile_block + kQ6KTileDOffset + 2 * lane, &block.d, sizeof block.d);
    for (int i = 0; i < kQ6KSubBlocks; ++i) {
        tile_block[kQ6KTileScalesOffset + kTileRows * i + lane] = uint8_t(block.scales[i]);
        uint8_t* registers =
            tile_block + kQ6KTileValuesOffset + i * kQ6KTileSubBlockBytes + lane * kTileLaneBytes;
        for (int m = 0; m < kTileLaneBytes; ++m) {
            // Column 16i + 12 + m, spread two bits a register over the top of the other three.
            const int spread = q6k_value(block, kQ6SubBlock * i + 12 + m);
            for (int s = 0; s < 3; ++s)
                registers[s * kTileRegisterBytes + m] = uint8_t(
                    q6k_value(block, kQ6SubBlock * i + 4 * s + m) | (spread >> (2 * s) & 3) << 6);
        }
    }
}

void write_row(uint8_t* tile_block, int lane, const BlockQ2_K& block) {
    std::memcpy(tile_block + kQ2KTileDOffset + 2 * lane, &block.d, sizeof block.d);
    std::memcpy(tile_block + kQ2KTileDMinOffset + 2 * lane, &block.dmin, sizeof block.dmin);
    for (int i = 0; i < kQ2KSubBlocks; ++i) {
        tile_block[kQ2KTileScalesOffset + 2 * kTileRows * (i / 2) + 2 * lane + i % 2] =
            block.scales[i];
        uint8_t* lane_bytes =
            tile_block + kQ2KTileValuesOffset + i * kTileRegisterBytes + lane * kTileLaneBytes;
        for (int m = 0; m < kTileLaneBytes; ++m)
            for (int s = 0; s < kTileLaneBytes; ++s)
                lane_bytes[m] |= uint8_t(q2k_value(block, kQ6SubBlock * i + 4 * s + m)
                                         << (kQ2KLevelBits * s));  // the tiles start zeroed
    }
}

void write_row(uint8_t* tile_block, int lane, const BlockQ3_K& block) {
    std::memcpy(tile_block + kQ3KTileDOffset + 2 * lane, &block.d, sizeof block.d);
    for (int i = 0; i < kQ3KSubBlocks; ++i)
        tile_block[kQ3KTileScalesOffset + kTileRows * i + lane] =
            uint8_t(int8_t(q3k_scale(block, i) - kQ3KScaleBias));
    constexpr int kLevelBits = 3, kSpareShift = 2 * kLevelBits;  // bits 6-7: the spare pair
    for (int pair = 0; pair < kQ3KSubBlocks / 2; ++pair) {
        uint8_t* registers =
            tile_block + kQ3KTileValuesOffset + pair * kQ3KTilePairBytes + lane * kTileLaneBytes;
        const int a = kQ6SubBlock * 2 * pair, b = a + kQ6SubBlock;  // sub-blocks A, B
        for (int m = 0; m < kTileLaneBytes; ++m) {
            auto q = [&](int column) { return q3k_value(block, column); };
            const int b8 = q(b + 8 + m), b12 = q(b + 12 + m);
            registers[m] = uint8_t(q(a + m) | q(a + 4 + m) << kLevelBits | (b8 & 3) << kSpareShift);
            registers[kTileRegisterBytes + m] =
                uint8_t(q(a + 8 + m) | q(a + 12 + m) << kLevelBits | (b8 >> 2) << kSpareShift |
                        (b12 & 1) << (kSpareShift + 1));
            registers[2 * kTileRegisterBytes + m] =
                uint8_t(q(b + m) | q(b + 4 + m) << kLevelBits | (b12 >> 1) << kSpareShift);
        }
    }
}

void write_row(uint8_t* tile_block, int lane, const BlockIQ4_XS& block) {
    std::memcpy(tile_block + kIq4XSTileDOffset + 2 * lane, &block.d, sizeof block.d);
    for (int j = 0; j < kIq4XSSubBlocks; ++j) {
        tile_block[kIq4XSTileScalesOffset + kTileRows * j + lane] =
            uint8_t(int8_t(iq4_xs_scale(block, j)));
        for (int k = 0; k < kIq4XSSubBlockRegisters; ++k)
            std::memcpy(tile_block + kIq4XSTileValuesOffset + j * kIq4XSTileSubBlockBytes +
                            k * kTileRegisterBytes + lane * kTileLaneBytes,
                        block.qs + kSubBlock / 2 * j + k * kTileLaneBytes, kTileLaneBytes);
    }
}

template <typename Block>
void write_tiles(const Matrix& w, uint8_t* tiles) {
    const size_t bytes_per_tile = super_block_tile_bytes(w);
    for (int r = 0; r < w.rows; ++r) {
        uint8_t* tile = tiles + size_t(r / kTileRows) * bytes_per_tile;
        for (int b = 0; b < super_blocks(w); ++b) {
            // The file's blocks are only 2-byte aligned: copied out before being read.
            Block block;
            std::memcpy(&block, w.row_data(r) + size_t(b) * sizeof block, sizeof block);
            write_row(tile + size_t(b) * super_block_tile_bytes(w.dtype), r % kTileRows, block);
        }
    }
}

}  // namespace

size_t super_block_tile_bytes(const Matrix& w) {
    return size_t(super_blocks(w)) * super_block_tile_bytes(w.dtype);
}

void write_super_block_tiles(const Matrix& w, uint8_t* tiles) {
    std::memset(tiles, 0, row_tiles_bytes(w));
    if (w.dtype == DType::Q2_K)
        write_tiles<BlockQ2_K>(w, tiles);
    else if (w.dtype == DType::Q3_K)
        write_tiles<BlockQ3_K>(w, tiles);
    else if (w.dtype == DType::Q4_K)
        write_tiles<BlockQ4_K>(w, tiles);
    else if (w.dtype == DType::Q5_K)
        write_tiles<BlockQ5_K>(w, tiles);
    else if (w.dtype == DType::Q6_K)
        write_tiles<BlockQ6_K>(w, tiles);
    else if (w.dtype == DType::IQ4_XS)
        write_tiles<BlockIQ4_XS>(w, tiles);
    else
        throw Error("write_super_block_tiles: not a Q2_K, Q3_K, Q4_K, Q5_K, Q6_K or IQ4_XS matrix");
}

void pair_sums_of_32(std::vector<int32_t>* pairs, const Q8KVector& x) {
    const size_t count = x.values.size() / (2 * kSubBlock);
    pairs->resize(count);
    for (size_t p = 0; p < count; ++p) {
        const int16_t* sums = x.sums.data() + 4 * p;  // four sums of 16
        const int first = sums[0] + sums[1], second = sums[2] + sums[3];
        (*pairs)[p] = int32_t(uint32_t(uint16_t(first)) | uint32_t(uint16_t(second)) << 16);
    }
}

void pair_sums_of_16(std::vector<int32_t>* pairs, const Q8KVector& x) {
    const size_t count = x.sums.size() / 2;
    pairs->resize(count);
    for (size_t p = 0; p < count; ++p)
        (*pairs)[p] = int32_t(uint32_t(uint16_t(x.sums[2 * p])) |
                              uint32_t(uint16_t(x.sums[2 * p + 1])) << 16);
}

TilePrefetch super_block_prefetch(DType type) {
    static const bool amd = cpu_prefetches_tiles_unaided();
    static const bool avx512 = detect_simd_level() == SimdLevel::Avx512;
    if (!amd) return {super_block_tile_bytes(type), /*into_l2=*/true};
    // Zen 3 (AMD without AVX-512): the next super-block, into L1. Zen 4: none.
    if (avx512) return {};
    return {super_block_tile_bytes(type), /*into_l2=*/false};
}

const TileTokenX* tile_tokens(const Q8KVector* x, int tokens, TileSums sums_of) {
    static thread_local std::vector<std::vector<int32_t>> sums;
    static thread_local std::vector<TileTokenX> token_x;
    if (sums.size() < size_t(tokens)) sums.resize(tokens);
    token_x.resize(tokens);
    for (int t = 0; t < tokens; ++t) {
        sums_of(&sums[t], x[t]);
        token_x[t] = {x[t].values.data(), x[t].d.data(), sums[t].data()};
    }
    return token_x.data();
}

}  // namespace barellm::cpu
