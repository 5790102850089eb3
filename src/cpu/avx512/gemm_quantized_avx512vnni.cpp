// The prefill GEMM on AVX-512 + VNNI for Q8 and Q4 weights: out[token][row] = Σ_col
// W[row][col] · x[token][col], x quantized to Q8 per token (as quantize_q8 does for decode),
// each group of 32 columns an exact int32 dot product by vpdpbusd.
//
// vpdpbusd multiplies unsigned bytes by signed bytes, four products into each int32 lane.
// x supplies the signed bytes; the weights are stored unsigned, value + 128 (a Q8 weight
// with its top bit flipped, a Q4 nibble q, standing for q − 8, plus 120). Each lane's sum
// is then 128 × Σx too large: the dot product of a group starts from −128 × Σx (the token's
// `start`), so the int32 result is exact. It is scaled by weight scale × x scale and added
// to f32 sums.
//
// The layout:
// - x [batch, cols] is quantized once per call into QuantizedBatch (quantize_token), the
//   threads sharing the tokens; its rows are read as they are, four bytes broadcast at a
//   time.
// - The weights are read from their tiles of 16 rows (cpu/quantized_tiles.h): two tiles,
//   kQuantizedRowTile rows, are packed (pack_panel) into a panel of unsigned bytes laid out
//   for the micro-kernel: per group, per step of four columns, the four bytes of each row
//   side by side, 16 rows a register, and the group's scales as f32. The panel (32 KB for
//   1024 columns) stays in L2 while every token of the batch meets it.
//   Batches of up to kDirectBatch tokens skip the panel and read the tiles as they are
//   (TileWeights), which gives the same sums.
// - The micro-kernel (tile_kernel) holds kQuantizedTokenTile tokens × kQuantizedRowTile
//   rows: lanes are rows, two registers of 16 per token. See its comment for the register
//   budget.
#include <algorithm>
#include <vector>

#include "cpu/avx512/avx512.h"
#include "cpu/avx512/helpers_avx512.h"
#include "cpu/panel_prefetcher.h"
#include "cpu/quantized_tiles.h"

namespace barellm::cpu::avx512 {

namespace {

constexpr int kGroup = kQ8Group;  // columns per scale (Q4's blocks are as wide)
static_assert(kQ4Block == kGroup);
constexpr int kBytesPerLane = kTileLaneBytes;                  // columns summed into one int32 lane
constexpr int kGroupSteps = kGroup / kBytesPerLane;            // vpdpbusd steps per group: 8
constexpr int kRowRegisters = kQuantizedRowTile / kLanes;      // registers of rows per token: 2
constexpr int kStepBytes = kQuantizedRowTile * kBytesPerLane;  // panel bytes of one step: 128
constexpr int kGroupBytes = kGroupSteps * kStepBytes;          // panel bytes of one group: 1024
constexpr int kUnsignedOffset = 128;                           // stored weight = value + 128
constexpr uint8_t kZeroWeight = kUnsignedOffset;               // the stored form of 0

// The stored byte of each Q4 nibble q, whose value is q − kQ4Offset: a vpshufb table.
struct NibbleTable {
    alignas(16) uint8_t bytes[16];
};
constexpr NibbleTable unsigned_nibbles() {
    NibbleTable table{};
    for (int q = 0; q < 16; ++q) table.bytes[q] = uint8_t(q - kQ4Offset + kUnsignedOffset);
    return table;
}
constexpr NibbleTable kUnsignedNibbles = unsigned_nibbles();

constexpr size_t kAlignment = 64;  // bytes: one register, one cache line

// The panel of the 32 rows of tiles first_tile and first_tile + 1 (cpu/quantized_tiles.h):
// panel[g][s][r][4] = the unsigned bytes (value + 128) of columns 4s..4s+3 of group g of
// row r (kZeroWeight past the matrix's tiles); scales[g][r] = that row's scale of group g.
// A tile's registers are already laid out so: Q8 copied, Q4 nibbles expanded to bytes.
template <DType kType>
void pack_panel(uint8_t* panel, float* scales, const Matrix& w, int first_tile) {
    const int groups = w.scale_count_per_row();
    for (int h = 0; h < kRowRegisters; ++h) {
        const int t = first_tile + h;
        const uint8_t* tile = t < tile_count(w) ? w.row_tiles + size_t(t) * tile_bytes(w) : nullptr;
        for (int g = 0; g < groups; ++g) {
            uint8_t* group_panel = panel + size_t(g) * kGroupBytes + h * kTileRegisterBytes;
            float* group_scales = scales + g * kQuantizedRowTile + h * kLanes;
            if (!tile) {
                for (int s = 0; s < kGroupSteps; ++s)
                    _mm512_store_si512(group_panel + s * kStepBytes,
                                       _mm512_set1_epi8(char(kZeroWeight)));
                _mm512_store_ps(group_scales, _mm512_setzero_ps());
                continue;
            }
            const uint8_t* values = tile_group_values(tile, kType, g);
            _mm512_store_ps(group_scales,
                            _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(
                                tile_group_scales(tile, kType, g)))));
            if constexpr (kType == DType::Q8_0) {
                for (int s = 0; s < kGroupSteps; ++s)
                    _mm512_store_si512(group_panel + s * kStepBytes,
                                       _mm512_load_si512(values + s * kTileRegisterBytes));
            } else {
                // Register j: columns 4j..4j+3 (low nibbles) and 16+4j..16+4j+3 (high): steps
                // j and j + 4; a nibble q stands for q − 8, stored as q + 120 through a
                // 16-byte table (vpshufb): an 8-bit add would overflow a signed byte.
                const __m512i low_nibble = _mm512_set1_epi8(0x0f);
                const __m512i to_unsigned = _mm512_broadcast_i32x4(
                    _mm_load_si128(reinterpret_cast<const __m128i*>(kUnsignedNibbles.bytes)));
                constexpr int kHighSteps = kGroupSteps / 2;
                for (int j = 0; j < tile_registers(kType); ++j) {
                    const __m512i bytes = _mm512_load_si512(values + j * kTileRegisterBytes);
                    const __m512i low = _mm512_and_si512(bytes, low_nibble);
                    const __m512i high = _mm512_and_si512(_mm512_srli_epi16(bytes, 4), low_nibble);
                    _mm512_store_si512(group_panel + j * kStepBytes,
                                       _mm512_shuffle_epi8(to_unsigned, low));
                    _mm512_store_si512(group_panel + (j + kHighSteps) * kStepBytes,
                                       _mm512_shuffle_epi8(to_unsigned, high));
                }
            }
        }
    }
}

// How far ahead of the block being read a batch reading the tiles directly prefetches. A few
// tokens take long enough over each byte that the hardware prefetcher leaves the loads waiting
// on memory: on Zen 4, 8 tokens of Q4 weights on 2 threads read 15.5 GB/s without this, 28-30
// with it (Q8: 30 and 35; a matrix of 600 MB, 2048 and 5632 columns; 2048 and 4096 bytes ahead
// did as well or a little worse).
constexpr int kTilePrefetchBytes = 48 * kCacheLine;

// Where the micro-kernel reads the unsigned weight bytes (registers of step s of group g,
// rows 16h..16h+15) and the f32 scales of two tiles: a packed panel (pack_panel), or the
// tiles as they are, for a batch that meets them once (no panel worth packing). Both give the
// same values, so a token's sums do not depend on which one its batch used.
struct PanelWeights {
    const uint8_t* panel;
    const float* scales;
    __m512i values(int g, int s, int h) const {
        return _mm512_load_si512(panel + size_t(g) * kGroupBytes + s * kStepBytes +
                                 h * kLanes * kBytesPerLane);
    }
    __m512 group_scales(int g, int h) const {
        return _mm512_load_ps(scales + g * kQuantizedRowTile + h * kLanes);
    }
    static constexpr bool kFromMemory = false;  // the panel is in L2 already
};
template <DType kType>
struct TileWeights {
    const uint8_t* tiles[kRowRegisters];
    __m512i values(int g, int s, int h) const {
        const uint8_t* group = tile_group_values(tiles[h], kType, g);
        if constexpr (kType == DType::Q8_0) {
            return _mm512_load_si512(group + s * kTileRegisterBytes);
        } else {
            // As pack_panel: register j holds steps j (low nibbles) and j + 4 (high).
            constexpr int kHighSteps = kGroupSteps / 2;
            const __m512i bytes = _mm512_load_si512(group + (s % kHighSteps) * kTileRegisterBytes);
            const __m512i nibbles = _mm512_and_si512(
                s < kHighSteps ? bytes : _mm512_srli_epi16(bytes, 4), _mm512_set1_epi8(0x0f));
            return _mm512_shuffle_epi8(
                _mm512_broadcast_i32x4(
                    _mm_load_si128(reinterpret_cast<const __m128i*>(kUnsignedNibbles.bytes))),
                nibbles);
        }
    }
    __m512 group_scales(int g, int h) const {
        return _mm512_cvtph_ps(_mm256_load_si256(
            reinterpret_cast<const __m256i*>(tile_group_scales(tiles[h], kType, g))));
    }
    // The block of scales and values of group g (and its neighbour) of rows 16h..16h+15.
    static constexpr bool kFromMemory = true;
    static constexpr int kBlockBytes = int(tile_block_bytes(kType));
    const uint8_t* block(int g, int h) const { return tile_group_block(tiles[h], kType, g); }
};

// out[first_token + k][row] = Σ_g weight scale[g][row] × x scale[k][g] × (exact int32 dot of
// group g) for TOKENS tokens and ROW_REGISTERS × 16 rows (store_masks[h]: those of rows
// 16h..16h+15 that exist); out has `stride` floats a token.
//
// Register tile, two shapes:
// - TOKENS ≤ kQuantizedTokenTile = 6 tokens × kQuantizedRowTile = 32 rows (two registers of
//   16 rows): 12 int32 dot registers and 12 f32 sum registers, plus the step's two weight
//   registers and one broadcast of x: 27 of the 32. Each step (four columns) loads two
//   weight registers and broadcasts four bytes of each token's x: 12 vpdpbusd for 2 + 6 loads.
// - TOKENS ≤ kWideTokenTile = 12 tokens × 16 rows (one register): 12 + 12 + 2 registers. A
//   step of a few decoding sequences (7 to 16 tokens) meets Q4 weights through it, each
//   register of nibbles expanded to bytes once for all its tokens instead of once per 6
//   (12 tokens in one call read 24 GB/s of a 600 MB matrix on Zen 4's 2 threads, in two calls
//   of 6 19.5: dev/cpu/quantized_gemm_bench.cpp).
// After a group's eight steps its dots are converted, scaled and added to the sums.
template <int TOKENS, int ROW_REGISTERS, typename Weights>
void tile_kernel(float* out, int stride, const __mmask16 store_masks[ROW_REGISTERS],
                 const Weights& w, const QuantizedBatch& x, int first_token) {
    const int8_t* values[TOKENS];
    const float* x_scales[TOKENS];
    const int32_t* starts[TOKENS];
#pragma GCC unroll 16
    for (int k = 0; k < TOKENS; ++k) {
        values[k] = x.values.data() + size_t(first_token + k) * x.padded_cols;
        x_scales[k] = x.scales.data() + size_t(first_token + k) * x.groups;
        starts[k] = x.starts.data() + size_t(first_token + k) * x.groups;
    }
    __m512 sums[TOKENS][ROW_REGISTERS];
#pragma GCC unroll 16
    for (int k = 0; k < TOKENS; ++k)
#pragma GCC unroll 8
        for (int h = 0; h < ROW_REGISTERS; ++h) sums[k][h] = _mm512_setzero_ps();
    for (int g = 0; g < x.groups; ++g) {
        // Weights read from memory: the cache lines kTilePrefetchBytes ahead of each block
        // are asked for (into the next tile at a tile's end: the tiles lie one after another).
        if constexpr (Weights::kFromMemory)
            if (g % kTileBlockGroups == 0)
#pragma GCC unroll 8
                for (int h = 0; h < ROW_REGISTERS; ++h)
                    prefetch_ahead(w.block(g, h), kTilePrefetchBytes, Weights::kBlockBytes);
        __m512i dots[TOKENS][ROW_REGISTERS];
#pragma GCC unroll 16
        for (int k = 0; k < TOKENS; ++k)
#pragma GCC unroll 8
            for (int h = 0; h < ROW_REGISTERS; ++h) dots[k][h] = _mm512_set1_epi32(starts[k][g]);
#pragma GCC unroll 8
        for (int s = 0; s < kGroupSteps; ++s) {
            __m512i weights[ROW_REGISTERS];
#pragma GCC unroll 8
            for (int h = 0; h < ROW_REGISTERS; ++h) weights[h] = w.values(g, s, h);
#pragma GCC unroll 16
            for (int k = 0; k < TOKENS; ++k) {
                const __m512i x_word = broadcast_word(values[k] + g * kGroup + s * kBytesPerLane);
#pragma GCC unroll 8
                for (int h = 0; h < ROW_REGISTERS; ++h)
                    dots[k][h] = _mm512_dpbusd_epi32(dots[k][h], weights[h], x_word);
            }
        }
        __m512 weight_scales[ROW_REGISTERS];
#pragma GCC unroll 8
        for (int h = 0; h < ROW_REGISTERS; ++h) weight_scales[h] = w.group_scales(g, h);
#pragma GCC unroll 16
        for (int k = 0; k < TOKENS; ++k) {
            const __m512 x_scale = _mm512_set1_ps(x_scales[k][g]);
#pragma GCC unroll 8
            for (int h = 0; h < ROW_REGISTERS; ++h)
                sums[k][h] =
                    _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(dots[k][h]), weight_scales[h]),
                                    x_scale, sums[k][h]);
        }
    }
#pragma GCC unroll 16
    for (int k = 0; k < TOKENS; ++k)
#pragma GCC unroll 8
        for (int h = 0; h < ROW_REGISTERS; ++h)
            _mm512_mask_storeu_ps(out + size_t(first_token + k) * stride + h * kLanes,
                                  store_masks[h], sums[k][h]);
}

// tile_kernel for `tokens` (1 ≤ tokens ≤ kQuantizedTokenTile) tokens from first_token on, on
// 32 rows.
template <typename Weights>
void run_tile_kernel(int tokens, float* out, int stride, const __mmask16* store_masks,
                     const Weights& w, const QuantizedBatch& x, int first_token) {
    using Kernel =
        void (*)(float*, int, const __mmask16*, const Weights&, const QuantizedBatch&, int);
    static constexpr Kernel kernels[kQuantizedTokenTile] = {
        tile_kernel<1, kRowRegisters, Weights>, tile_kernel<2, kRowRegisters, Weights>,
        tile_kernel<3, kRowRegisters, Weights>, tile_kernel<4, kRowRegisters, Weights>,
        tile_kernel<5, kRowRegisters, Weights>, tile_kernel<6, kRowRegisters, Weights>};
    kernels[tokens - 1](out, stride, store_masks, w, x, first_token);
}

constexpr int kWideTokenTile = 12;  // tokens per call of the one-register (16-row) kernel

// tile_kernel for `tokens` (1 ≤ tokens ≤ kWideTokenTile) tokens from first_token on, on the 16
// rows of one tile (Weights' h = 0).
template <typename Weights>
void run_wide_tile_kernel(int tokens, float* out, int stride, __mmask16 store_mask,
                          const Weights& w, const QuantizedBatch& x, int first_token) {
    using Kernel =
        void (*)(float*, int, const __mmask16*, const Weights&, const QuantizedBatch&, int);
    static constexpr Kernel kernels[kWideTokenTile] = {
        tile_kernel<1, 1, Weights>,  tile_kernel<2, 1, Weights>,  tile_kernel<3, 1, Weights>,
        tile_kernel<4, 1, Weights>,  tile_kernel<5, 1, Weights>,  tile_kernel<6, 1, Weights>,
        tile_kernel<7, 1, Weights>,  tile_kernel<8, 1, Weights>,  tile_kernel<9, 1, Weights>,
        tile_kernel<10, 1, Weights>, tile_kernel<11, 1, Weights>, tile_kernel<12, 1, Weights>};
    kernels[tokens - 1](out, stride, &store_mask, w, x, first_token);
}

// Batches of up to this many tokens (a step of a few decoding sequences) read the weights
// from their tiles, with no panel: packing one costs more than the few kernel calls that
// would read it gain (measured on TinyLlama's shapes, q8 and q4, 2 to 16 tokens).
constexpr int kDirectBatch = 16;

template <DType kType>
void gemm_rows_typed(float* out, const Matrix& w, const QuantizedBatch& x, int first_row,
                     int row_count) {
    // One tile's panel and scales, 64-byte aligned, kept from call to call.
    static thread_local std::vector<uint8_t> panel_storage;
    static thread_local std::vector<float> scale_storage;
    panel_storage.resize(size_t(x.groups) * kGroupBytes + kAlignment);
    scale_storage.resize(size_t(x.groups) * kQuantizedRowTile + kAlignment / sizeof(float));
    uint8_t* panel = align64(panel_storage.data());
    float* scales = align64(scale_storage.data());
    const int end_row = first_row + row_count;
    // A small batch (kDirectBatch) reads the tiles as they are. Q4 weights meet more tokens
    // than one 32-row call holds a tile at a time, in as few calls as the 16-row kernel
    // allows, each register of nibbles expanded once a call.
    if (kType == DType::Q4_0 && x.batch > kQuantizedTokenTile && x.batch <= kDirectBatch) {
        const int calls = (x.batch + kWideTokenTile - 1) / kWideTokenTile;
        const int call_tokens = (x.batch + calls - 1) / calls;
        for (int tile_row = first_row / kTileRows * kTileRows; tile_row < end_row;
             tile_row += kTileRows) {
            const uint8_t* tile = w.row_tiles + size_t(tile_row / kTileRows) * tile_bytes(w);
            const __mmask16 store_mask = lanes_in(tile_row, first_row, end_row);
            for (int token = 0; token < x.batch; token += call_tokens)
                run_wide_tile_kernel(std::min(call_tokens, x.batch - token), out + tile_row, w.rows,
                                     store_mask, TileWeights<kType>{{tile, tile}}, x, token);
        }
        return;
    }
    // Otherwise a small batch goes 32 rows a call. A second tile past the matrix's end stands
    // in as the first, its rows not stored.
    if (x.batch <= kDirectBatch) {
        for (int tile_row = first_row / kTileRows * kTileRows; tile_row < end_row;
             tile_row += kQuantizedRowTile) {
            const int tile = tile_row / kTileRows;
            const uint8_t* first = w.row_tiles + size_t(tile) * tile_bytes(w);
            const uint8_t* second = tile + 1 < tile_count(w) ? first + tile_bytes(w) : first;
            const __mmask16 store_masks[kRowRegisters] = {
                lanes_in(tile_row, first_row, end_row),
                lanes_in(tile_row + kLanes, first_row, end_row)};
            for (int token = 0; token < x.batch; token += kQuantizedTokenTile)
                run_tile_kernel(std::min(kQuantizedTokenTile, x.batch - token), out + tile_row,
                                w.rows, store_masks, TileWeights<kType>{{first, second}}, x, token);
        }
        return;
    }
    // Panels of two whole tiles; one the run shares with another thread's is computed by
    // both, each storing its own rows.
    for (int tile_row = first_row / kTileRows * kTileRows; tile_row < end_row;
         tile_row += kQuantizedRowTile) {
        pack_panel<kType>(panel, scales, w, tile_row / kTileRows);
        const __mmask16 store_masks[kRowRegisters] = {
            lanes_in(tile_row, first_row, end_row),
            lanes_in(tile_row + kLanes, first_row, end_row)};
        for (int token = 0; token < x.batch; token += kQuantizedTokenTile)
            run_tile_kernel(std::min(kQuantizedTokenTile, x.batch - token), out + tile_row, w.rows,
                            store_masks, PanelWeights{panel, scales}, x, token);
    }
}

}  // namespace

void quantize_token(QuantizedBatch* x, const float* x_row, int cols, int token) {
    int8_t* values = x->values.data() + size_t(token) * x->padded_cols;
    float* scales = x->scales.data() + size_t(token) * x->groups;
    int32_t* starts = x->starts.data() + size_t(token) * x->groups;
    int32_t* half_sums = x->half_sums.data() + size_t(token) * x->groups * 2;
    // The whole group is stored: past cols, its zeros are the padding.
    quantize_groups(x_row, cols, x->groups, scales, [&](int g, __m128i low, __m128i high) {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(values + g * kGroup), low);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(values + g * kGroup + kLanes), high);
        half_sums[2 * g] = sum_of_16_bytes(low);
        half_sums[2 * g + 1] = sum_of_16_bytes(high);
        starts[g] = -kUnsignedOffset * (half_sums[2 * g] + half_sums[2 * g + 1]);
    });
}

void gemm_rows_quantized(float* out, const Matrix& w, const QuantizedBatch& x, int first_row,
                         int row_count) {
    if (w.dtype == DType::Q8_0)
        gemm_rows_typed<DType::Q8_0>(out, w, x, first_row, row_count);
    else
        gemm_rows_typed<DType::Q4_0>(out, w, x, first_row, row_count);
}

}  // namespace barellm::cpu::avx512
