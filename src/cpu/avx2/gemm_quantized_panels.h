// The Q8 and Q4 prefill GEMM's panels and micro-kernel (out[token][row] = Σ_col
// W[row][col] · x[token][col], x quantized to Q8 per token, each group of 32 columns an exact
// int32 dot product), shared by its two builds:
// - gemm_quantized_avxvnni.cpp, AVX2 + AVX-VNNI: Q8 and Q4 on the 256-bit vpdpbusd; the design
//   of the AVX-512 VNNI GEMM (gemm_quantized_avx512vnni.cpp, whose comment explains the
//   unsigned weights and each group's start) on ymm registers, the weights read from their
//   tiles of 16 rows (cpu/quantized_tiles.h), which the CPU backend makes on this level, or
//   from their rows where a matrix has no tiles;
// - gemm_quantized_avx2.cpp, plain AVX2 (no VNNI, e.g. AMD Zen 3): Q4 on vpmaddubsw, whose
//   int16 sums hold a whole group of nibble products, from the rows.
// kQuantizedRowTile = 16 rows at a time are packed (pack_panel) into a panel of bytes laid out
// for the micro-kernel: per group, per step of four columns, the four bytes of each row side
// by side, 8 rows a register, and the group's scales as f32. From rows that is an 8 × 8
// transpose of 32-bit words; a tile is laid out so already (its registers copied, Q4's nibbles
// expanded to bytes). The panel (16 KB for 1024 columns) stays in L1/L2 while every token of
// the batch meets it. A batch of up to kDirectBatch tokens (a server step of a few decoding
// sequences) skips the panel and reads the tiles as they are, with the same sums. The
// micro-kernel (tile_kernel) holds kQuantizedTokenTile = 3 tokens × 16 rows; see its comment
// for the register budget.
//
// Included by those two files alone, after the intrinsics (immintrin.h, or SIMDe's in the unit
// tests): everything here has internal linkage, each file compiling it for its own
// instructions.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cpu/kernels.h"
#include "cpu/panel_prefetcher.h"
#include "cpu/quantized_tiles.h"
#include "weights/half.h"

namespace barellm::cpu {
namespace {

constexpr int kQuantizedRowTile = 16;   // weight rows packed and computed together: two registers
constexpr int kQuantizedTokenTile = 3;  // tokens per micro-kernel call

constexpr int kGroup = kQ8Group;  // columns per scale (Q4's blocks are as wide)
static_assert(kQ4Block == kGroup);
constexpr int kLanes = 8;                                      // 32-bit lanes per register
constexpr int kBytesPerLane = 4;                               // columns summed into one lane
constexpr int kGroupSteps = kGroup / kBytesPerLane;            // vpdpbusd steps per group: 8
constexpr int kRowRegisters = kQuantizedRowTile / kLanes;      // registers of rows per token: 2
constexpr int kStepBytes = kQuantizedRowTile * kBytesPerLane;  // panel bytes of one step: 64
constexpr int kGroupBytes = kGroupSteps * kStepBytes;          // panel bytes of one group: 512
constexpr int kUnsignedOffset = 128;                           // stored weight = value + 128
constexpr char kZeroWeight = char(kUnsignedOffset);            // the stored form of 0
constexpr size_t kAlignment = 32;                              // bytes: one register
static_assert(kQuantizedRowTile == kTileRows && kStepBytes == kTileRegisterBytes,
              "a tile's register is a panel's step");
// vpmaddubsw's form of Q4: a nibble q stored as is (0..15), its value q − kQ4Offset; each
// group's int32 start is then −kQ4Offset · Σx, the VNNI form's (−128 · Σx, which
// QuantizedBatch::starts holds) divided exactly by kStartDivisor.
constexpr int kStartDivisor = kUnsignedOffset / kQ4Offset;
static_assert(kUnsignedOffset % kQ4Offset == 0);
// vpmaddubsw sums two products of nibble (≤ 15) and x (|x| ≤ 127) into an int16; a group's
// kGroupSteps steps add up to 2 · kGroupSteps of them in one int16, which holds them.
constexpr int kLargestNibble = 15, kLargestX = 127;
static_assert(2 * kGroupSteps * kLargestNibble * kLargestX <= INT16_MAX);

static_assert(kGroupSteps == kLanes, "a group's steps are one 8 x 8 transpose of words");

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

// Batches of up to this many tokens (a server step of a few decoding sequences) read the
// weights from their tiles, with no panel: packing one costs more than the few kernel calls that
// would read it gain. On the Intel Xeon of docs/BENCHMARKS.md at the AVX2 level, 2 threads, a
// 600 MB matrix of 2048 columns (dev/cpu/quantized_gemm_bench.cpp): Q4 at 6, 8 and 12 tokens
// 12.5, 10.0 and 7.6 GB/s from the tiles against 9.8, 8.6 and 7.2 through panels; at 16, 5.9
// against 6.1 (Q8 10.1 against 10.2).
constexpr int kDirectBatch = 16;
// How far ahead of the block being read a batch reading the tiles directly asks for cache
// lines: a few tokens take long enough over each byte that the hardware prefetcher alone
// leaves the loads waiting on memory. Same machine and matrix, 8 tokens: Q8 13.2 GB/s with no
// prefetch, 14.3 with 12 lines, 14.6 with 48; Q4 8.2, 9.5 and 10.0.
constexpr int kTilePrefetchBytes = 48 * kCacheLine;

// Stored weights, value + 128 for vpdpbusd (Q8 and Q4), or Q4's nibbles as they are for
// vpmaddubsw.
enum class GroupDot { Vnni, Maddubs };

template <GroupDot kDot>
constexpr char kStoredZero = kDot == GroupDot::Vnni ? kZeroWeight : char(kQ4Offset);

template <typename Element>
Element* align32(Element* p) {
    const uintptr_t misalignment = reinterpret_cast<uintptr_t>(p) % kAlignment;
    return misalignment ? p + (kAlignment - misalignment) / sizeof(Element) : p;
}

// The 32 stored bytes of group g of row r, in column order.
template <DType kType, GroupDot kDot>
__m256i group_bytes(const Matrix& w, int r, int g) {
    const uint8_t* row = static_cast<const uint8_t*>(w.data) + size_t(r) * w.row_bytes();
    if constexpr (kType == DType::Q8_0) {
        static_assert(kDot == GroupDot::Vnni, "Q8 on vpdpbusd only");
        const __m256i flip = _mm256_set1_epi8(char(0x80));  // w + 128 = w with its top bit flipped
        const int first = g * kGroup, count = std::min(kGroup, w.cols - first);
        if (count == kGroup)
            return _mm256_xor_si256(
                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + first)), flip);
        alignas(kAlignment) uint8_t tail[kGroup] = {};  // a short last group, 0 past the row
        std::memcpy(tail, row + first, count);
        return _mm256_xor_si256(_mm256_load_si256(reinterpret_cast<const __m256i*>(tail)), flip);
    } else {
        // A Q4 block: low nibbles are columns 0-15, high nibbles 16-31; a nibble q stands for
        // q − 8, stored as q + 120 for vpdpbusd through a 16-byte table (an 8-bit add would
        // overflow a signed byte in SIMDe's portable code), as q for vpmaddubsw.
        const __m128i bytes =
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + size_t(g) * kQ4BlockBytes));
        const __m128i low_nibble = _mm_set1_epi8(0x0f);
        __m128i low = _mm_and_si128(bytes, low_nibble);
        __m128i high = _mm_and_si128(_mm_srli_epi16(bytes, 4), low_nibble);
        if constexpr (kDot == GroupDot::Vnni) {
            const __m128i to_unsigned =
                _mm_load_si128(reinterpret_cast<const __m128i*>(kUnsignedNibbles.bytes));
            low = _mm_shuffle_epi8(to_unsigned, low);
            high = _mm_shuffle_epi8(to_unsigned, high);
        }
        return _mm256_set_m128i(high, low);
    }
}

// Transposes the 8 × 8 block of 32-bit words in rows[0..7] (rows[i] word j becomes rows[j]
// word i): pairs of rows interleaved, then pairs of pairs, then the 128-bit halves.
inline void transpose8x8_words(__m256i rows[8]) {
    __m256i pairs[8], quads[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i += 2) {
        pairs[i] = _mm256_unpacklo_epi32(rows[i], rows[i + 1]);
        pairs[i + 1] = _mm256_unpackhi_epi32(rows[i], rows[i + 1]);
    }
    // quads[i + j] (i = 0, 4), 128-bit half l: rows i .. i + 3 of word 4l + j.
#pragma GCC unroll 8
    for (int i = 0; i < 8; i += 4) {
        quads[i] = _mm256_unpacklo_epi64(pairs[i], pairs[i + 2]);
        quads[i + 1] = _mm256_unpackhi_epi64(pairs[i], pairs[i + 2]);
        quads[i + 2] = _mm256_unpacklo_epi64(pairs[i + 1], pairs[i + 3]);
        quads[i + 3] = _mm256_unpackhi_epi64(pairs[i + 1], pairs[i + 3]);
    }
    constexpr int kLowHalves = 0x20, kHighHalves = 0x31;
#pragma GCC unroll 8
    for (int j = 0; j < 4; ++j) {
        rows[j] = _mm256_permute2x128_si256(quads[j], quads[4 + j], kLowHalves);
        rows[4 + j] = _mm256_permute2x128_si256(quads[j], quads[4 + j], kHighHalves);
    }
}

// Where the micro-kernel reads the stored weight bytes of a step (register of step s of group
// g, rows 8h..8h+7) and the f32 scales: a packed panel (pack_panel), or a tile as it is
// (vpdpbusd only), for a batch that meets it a few times (no panel worth packing). A group's
// int32 dot starts from x's start (−128 · Σx) divided by kStartDivisor: 1 where weights are
// stored value + 128, kStartDivisor where they are Q4's nibbles as they are (a tile's, which
// saves a table lookup per register). Both give the same exact dots, so a token's sums do not
// depend on which one its batch used.
struct PanelWeights {
    const uint8_t* panel;
    const float* scales;
    __m256i values(int g, int s, int h) const {
        return _mm256_load_si256(reinterpret_cast<const __m256i*>(
            panel + size_t(g) * kGroupBytes + s * kStepBytes + h * kLanes * kBytesPerLane));
    }
    __m256 group_scales(int g, int h) const {
        return _mm256_load_ps(scales + g * kQuantizedRowTile + h * kLanes);
    }
    static constexpr bool kFromMemory = false;  // the panel is in cache already
    static constexpr int kStartDivisor = 1;
};
template <DType kType>
struct TileWeights {
    const uint8_t* tile;
    __m256i values(int g, int s, int h) const {
        const uint8_t* group = tile_group_values(tile, kType, g) + h * kLanes * kTileLaneBytes;
        if constexpr (kType == DType::Q8_0) {
            return _mm256_load_si256(reinterpret_cast<const __m256i*>(group + s * kStepBytes));
        } else {
            // Register j holds steps j (low nibbles) and j + 4 (high).
            constexpr int kHighSteps = kGroupSteps / 2;
            const __m256i bytes = _mm256_load_si256(
                reinterpret_cast<const __m256i*>(group + (s % kHighSteps) * kStepBytes));
            return _mm256_and_si256(s < kHighSteps ? bytes : _mm256_srli_epi16(bytes, 4),
                                    _mm256_set1_epi8(0x0f));
        }
    }
    __m256 group_scales(int g, int h) const {
        return _mm256_cvtph_ps(_mm_load_si128(
            reinterpret_cast<const __m128i*>(tile_group_scales(tile, kType, g) + h * kLanes)));
    }
    static constexpr int kStartDivisor = kType == DType::Q4_0 ? cpu::kStartDivisor : 1;
    // The block of scales and values of group g (and its neighbour).
    static constexpr bool kFromMemory = true;
    static constexpr int kBlockBytes = int(tile_block_bytes(kType));
    const uint8_t* block(int g) const { return tile_group_block(tile, kType, g); }
};

// The panel of rows first_row .. first_row + 15: panel[g][s][r][4] = the stored bytes of
// columns 4s..4s+3 of group g of row r (the stored zero past the matrix); scales[g][r] = that
// row's scale of group g (0 past the matrix). From the matrix's tile where it has tiles
// (vpdpbusd's form: Q4's nibbles q stored as q + 120 through the 16-byte table), else from its
// rows.
template <DType kType, GroupDot kDot>
void pack_panel(uint8_t* panel, float* scales, const Matrix& w, int first_row) {
    const int groups = w.scale_count_per_row();
    if constexpr (kDot == GroupDot::Vnni)
        if (w.row_tiles) {
            const TileWeights<kType> tile{w.row_tiles +
                                          size_t(first_row / kTileRows) * tile_bytes(w)};
            for (int g = 0; g < groups; ++g)
                for (int h = 0; h < kRowRegisters; ++h) {
                    for (int s = 0; s < kGroupSteps; ++s) {
                        __m256i values = tile.values(g, s, h);
                        if constexpr (kType == DType::Q4_0)
                            values = _mm256_shuffle_epi8(
                                _mm256_broadcastsi128_si256(_mm_load_si128(
                                    reinterpret_cast<const __m128i*>(kUnsignedNibbles.bytes))),
                                values);
                        _mm256_store_si256(
                            reinterpret_cast<__m256i*>(panel + size_t(g) * kGroupBytes +
                                                       s * kStepBytes + h * kLanes * kBytesPerLane),
                            values);
                    }
                    _mm256_store_ps(scales + g * kQuantizedRowTile + h * kLanes,
                                    tile.group_scales(g, h));
                }
            return;
        }
    for (int h = 0; h < kRowRegisters; ++h)
        for (int g = 0; g < groups; ++g) {
            __m256i rows[kLanes];
            for (int i = 0; i < kLanes; ++i) {
                const int r = first_row + h * kLanes + i;
                const bool inside = r < w.rows;
                rows[i] = inside ? group_bytes<kType, kDot>(w, r, g)
                                 : _mm256_set1_epi8(kStoredZero<kDot>);
                scales[g * kQuantizedRowTile + h * kLanes + i] =
                    inside ? half_to_float(w.scales[size_t(r) * groups + g]) : 0.0f;
            }
            transpose8x8_words(rows);
            uint8_t* group_panel = panel + size_t(g) * kGroupBytes + h * kLanes * kBytesPerLane;
            for (int s = 0; s < kGroupSteps; ++s)
                _mm256_store_si256(reinterpret_cast<__m256i*>(group_panel + s * kStepBytes),
                                   rows[s]);
        }
}

// out[first_token + k][row] = Σ_g (exact int32 dot of group g) × (weight scale[g][row] × x
// scale[k][g]) for TOKENS tokens and 16 rows (store_masks[h]: those of rows 8h..8h+7 to write),
// summed in the order of the AVX-VNNI decode matvec (matvec_quantized_avxvnni.cpp), so that a
// token's bits are the same alone or in a batch; out has `stride` floats a token.
//
// Register tile: TOKENS ≤ kQuantizedTokenTile = 3 tokens × 16 rows (two registers of 8): 6
// int32 dot registers and 6 f32 sum registers, plus the step's two weight registers and one
// broadcast of x: 15 of the 16. Each step (four columns) loads two panel registers and
// broadcasts four bytes of each token's x: 6 vpdpbusd for 2 + 3 loads. After a group's eight
// steps its dots are converted, scaled and added to the sums. Weights read from memory (a tile,
// not a panel) ask for the cache lines kTilePrefetchBytes ahead of each block of two groups.
// With vpmaddubsw (kDot Maddubs, Q4) each step adds its pairs of products to int16 sums, in
// the registers of the dots, and the group's end widens them to int32 with vpmaddwd (exact:
// kLargestNibble above) and adds the group's start.
template <int TOKENS, GroupDot kDot, typename Weights>
void tile_kernel(float* out, int stride, const __m256i store_masks[kRowRegisters], const Weights& w,
                 const QuantizedBatch& x, int first_token) {
    const int8_t* values[TOKENS];
    const float* x_scales[TOKENS];
    const int32_t* starts[TOKENS];
#pragma GCC unroll 4
    for (int k = 0; k < TOKENS; ++k) {
        values[k] = x.values.data() + size_t(first_token + k) * x.padded_cols;
        x_scales[k] = x.scales.data() + size_t(first_token + k) * x.groups;
        starts[k] = x.starts.data() + size_t(first_token + k) * x.groups;
    }
    __m256 sums[TOKENS][kRowRegisters];
#pragma GCC unroll 4
    for (int k = 0; k < TOKENS; ++k)
#pragma GCC unroll 4
        for (int h = 0; h < kRowRegisters; ++h) sums[k][h] = _mm256_setzero_ps();
    for (int g = 0; g < x.groups; ++g) {
        if constexpr (Weights::kFromMemory)
            if (g % kTileBlockGroups == 0)
                prefetch_ahead(w.block(g), kTilePrefetchBytes, Weights::kBlockBytes);
        __m256i dots[TOKENS][kRowRegisters];
#pragma GCC unroll 4
        for (int k = 0; k < TOKENS; ++k)
#pragma GCC unroll 4
            for (int h = 0; h < kRowRegisters; ++h)
                dots[k][h] = kDot == GroupDot::Vnni
                                 ? _mm256_set1_epi32(starts[k][g] / Weights::kStartDivisor)
                                 : _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int s = 0; s < kGroupSteps; ++s) {
            __m256i weights[kRowRegisters];
#pragma GCC unroll 4
            for (int h = 0; h < kRowRegisters; ++h) weights[h] = w.values(g, s, h);
#pragma GCC unroll 4
            for (int k = 0; k < TOKENS; ++k) {
                int32_t word;
                std::memcpy(&word, values[k] + g * kGroup + s * kBytesPerLane, sizeof(word));
                const __m256i x_word = _mm256_set1_epi32(word);
#pragma GCC unroll 4
                for (int h = 0; h < kRowRegisters; ++h) {
                    if constexpr (kDot == GroupDot::Vnni)
                        dots[k][h] = _mm256_dpbusd_avx_epi32(dots[k][h], weights[h], x_word);
                    else
                        dots[k][h] =
                            _mm256_add_epi16(dots[k][h], _mm256_maddubs_epi16(weights[h], x_word));
                }
            }
        }
        if constexpr (kDot == GroupDot::Maddubs) {
            const __m256i ones = _mm256_set1_epi16(1);
#pragma GCC unroll 4
            for (int k = 0; k < TOKENS; ++k)
#pragma GCC unroll 4
                for (int h = 0; h < kRowRegisters; ++h)
                    dots[k][h] = _mm256_add_epi32(_mm256_madd_epi16(dots[k][h], ones),
                                                  _mm256_set1_epi32(starts[k][g] / kStartDivisor));
        }
        __m256 weight_scales[kRowRegisters];
#pragma GCC unroll 4
        for (int h = 0; h < kRowRegisters; ++h) weight_scales[h] = w.group_scales(g, h);
#pragma GCC unroll 4
        for (int k = 0; k < TOKENS; ++k) {
            const __m256 x_scale = _mm256_set1_ps(x_scales[k][g]);
#pragma GCC unroll 4
            for (int h = 0; h < kRowRegisters; ++h)
                sums[k][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dots[k][h]),
                                             _mm256_mul_ps(weight_scales[h], x_scale), sums[k][h]);
        }
    }
#pragma GCC unroll 4
    for (int k = 0; k < TOKENS; ++k)
#pragma GCC unroll 4
        for (int h = 0; h < kRowRegisters; ++h)
            _mm256_maskstore_ps(out + size_t(first_token + k) * stride + h * kLanes, store_masks[h],
                                sums[k][h]);
}

template <GroupDot kDot, typename Weights>
using TileKernel = void (*)(float*, int, const __m256i*, const Weights&, const QuantizedBatch&,
                            int);
template <GroupDot kDot, typename Weights>
constexpr TileKernel<kDot, Weights> kTileKernels[kQuantizedTokenTile] = {
    tile_kernel<1, kDot, Weights>, tile_kernel<2, kDot, Weights>, tile_kernel<3, kDot, Weights>};

// tile_kernel for `tokens` (1 ≤ tokens) tokens from token 0 on, kQuantizedTokenTile a call.
template <GroupDot kDot, typename Weights>
void run_tile_kernels(float* out, int stride, const __m256i store_masks[kRowRegisters],
                      const Weights& w, const QuantizedBatch& x) {
    for (int token = 0; token < x.batch; token += kQuantizedTokenTile)
        kTileKernels<kDot, Weights>[std::min(kQuantizedTokenTile, x.batch - token) - 1](
            out, stride, store_masks, w, x, token);
}

// The lanes i of 8 with base + i in [first, end), as a maskstore mask.
inline __m256i lanes_in(int base, int first, int end) {
    const __m256i index =
        _mm256_add_epi32(_mm256_set1_epi32(base), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    const __m256i at_or_after_first = _mm256_cmpgt_epi32(index, _mm256_set1_epi32(first - 1));
    const __m256i before_end = _mm256_cmpgt_epi32(_mm256_set1_epi32(end), index);
    return _mm256_and_si256(at_or_after_first, before_end);
}

// out[token][row] for every token of x and the rows [first_row, first_row + row_count) of w,
// out having w.rows floats a token.
template <DType kType, GroupDot kDot>
void gemm_rows_typed(float* out, const Matrix& w, const QuantizedBatch& x, int first_row,
                     int row_count) {
    const int end_row = first_row + row_count;
    // A small batch reads the tiles as they are: one tile a run of calls.
    if constexpr (kDot == GroupDot::Vnni)
        if (w.row_tiles && x.batch <= kDirectBatch) {
            for (int tile_row = first_row / kTileRows * kTileRows; tile_row < end_row;
                 tile_row += kTileRows) {
                const __m256i store_masks[kRowRegisters] = {
                    lanes_in(tile_row, first_row, end_row),
                    lanes_in(tile_row + kLanes, first_row, end_row)};
                run_tile_kernels<kDot>(
                    out + tile_row, w.rows, store_masks,
                    TileWeights<kType>{w.row_tiles + size_t(tile_row / kTileRows) * tile_bytes(w)},
                    x);
            }
            return;
        }
    // One panel and its scales, 32-byte aligned, kept from call to call.
    static thread_local std::vector<uint8_t> panel_storage;
    static thread_local std::vector<float> scale_storage;
    panel_storage.resize(size_t(x.groups) * kGroupBytes + kAlignment);
    scale_storage.resize(size_t(x.groups) * kQuantizedRowTile + kAlignment / sizeof(float));
    uint8_t* panel = align32(panel_storage.data());
    float* scales = align32(scale_storage.data());
    // Panels of 16 rows from a multiple of 16; one the run shares with another thread's is
    // computed by both, each storing its own rows.
    for (int panel_row = first_row / kQuantizedRowTile * kQuantizedRowTile; panel_row < end_row;
         panel_row += kQuantizedRowTile) {
        pack_panel<kType, kDot>(panel, scales, w, panel_row);
        const __m256i store_masks[kRowRegisters] = {
            lanes_in(panel_row, first_row, end_row),
            lanes_in(panel_row + kLanes, first_row, end_row)};
        run_tile_kernels<kDot>(out + panel_row, w.rows, store_masks, PanelWeights{panel, scales},
                               x);
    }
}

}  // namespace
}  // namespace barellm::cpu
