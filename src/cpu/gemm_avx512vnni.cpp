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
// - A tile of kQuantizedRowTile weight rows is packed (pack_row_tile) into a panel of
//   unsigned bytes laid out for the micro-kernel: per group, per step of four columns, the four
//   bytes of each row side by side, 16 rows a register (a 16 × 8 transpose of 32-bit words per
//   group), and the group's scales as f32. The panel (32 KB for 1024 columns) stays in L2
//   while every token of the batch meets it.
// - The micro-kernel (tile_kernel) holds kQuantizedTokenTile tokens × kQuantizedRowTile
//   rows: lanes are rows, two registers of 16 per token. See its comment for the register
//   budget.
#include <algorithm>
#include <vector>

#include "cpu/avx512.h"
#include "cpu/helpers_avx512.h"
#include "half.h"

namespace barellm::cpu::avx512 {

namespace {

constexpr int kGroup = kQ8Group;  // columns per scale (Q4's blocks are as wide)
static_assert(kQ4Block == kGroup);
constexpr int kBytesPerLane = 4;                               // columns summed into one int32 lane
constexpr int kGroupSteps = kGroup / kBytesPerLane;            // vpdpbusd steps per group: 8
constexpr int kRowRegisters = kQuantizedRowTile / kLanes;      // registers of rows per token: 2
constexpr int kStepBytes = kQuantizedRowTile * kBytesPerLane;  // panel bytes of one step: 128
constexpr int kGroupBytes = kGroupSteps * kStepBytes;          // panel bytes of one group: 1024
constexpr int kUnsignedOffset = 128;                           // stored weight = value + 128
constexpr uint8_t kZeroWeight = kUnsignedOffset;               // the stored form of 0
constexpr float kQ8Largest = 127.0f;  // |quantized x| ≤ 127, as quantize_q8

constexpr size_t kAlignment = 64;  // bytes: one register, one cache line

// lround(v) (halves away from zero) for each lane, as quantize_q8 rounds: truncate, then
// step away from zero where the part cut off is at least a half (exact in f32 here).
inline __m512i round_half_away(__m512 v) {
    const __m512i whole = _mm512_cvttps_epi32(v);
    const __m512 fraction = _mm512_sub_ps(v, _mm512_cvtepi32_ps(whole));
    const __mmask16 up = _mm512_cmp_ps_mask(fraction, _mm512_set1_ps(0.5f), _CMP_GE_OQ);
    const __mmask16 down = _mm512_cmp_ps_mask(fraction, _mm512_set1_ps(-0.5f), _CMP_LE_OQ);
    const __m512i one = _mm512_set1_epi32(1);
    return _mm512_mask_sub_epi32(_mm512_mask_add_epi32(whole, up, whole, one), down, whole, one);
}

// *dest = group g of a row as 32 unsigned bytes (value + 128) in column order; Q8 columns
// past `cols` (a short last group) are 0. (Stored rather than returned: on SIMDe, without
// -mavx, a returned 256-bit vector changes the ABI, which GCC warns of.)
template <DType kType>
inline void load_unsigned_group(__m256i* dest, const Matrix& w, int row, int g) {
    if constexpr (kType == DType::I8) {
        const int8_t* values = static_cast<const int8_t*>(w.data) + size_t(row) * w.cols;
        const __m256i bytes = _mm256_maskz_loadu_epi8(__mmask32(first_bytes(w.cols - g * kGroup)),
                                                      values + g * kGroup);
        *dest = _mm256_xor_si256(bytes, _mm256_set1_epi8(char(kUnsignedOffset)));
    } else {
        // A block's 16 bytes hold columns 0-15 in their low nibbles, 16-31 in their high.
        const uint8_t* block =
            static_cast<const uint8_t*>(w.data) + size_t(row) * w.row_bytes() + g * kQ4BlockBytes;
        const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block));
        const __m128i low_nibble = _mm_set1_epi8(0x0f);
        const __m128i low = _mm_and_si128(bytes, low_nibble);
        const __m128i high = _mm_and_si128(_mm_srli_epi16(bytes, 4), low_nibble);
        const __m256i nibbles = _mm256_inserti128_si256(_mm256_castsi128_si256(low), high, 1);
        *dest = _mm256_add_epi8(nibbles, _mm256_set1_epi8(char(kUnsignedOffset - kQ4Offset)));
    }
}

// Stores the groups of 16 rows (rows[i]: row i's 32 bytes, eight 32-bit words of four
// columns) as eight step registers: dest + s × kStepBytes gets word s of rows 0-15, in row
// order. Three rounds of two-register shuffles transpose the 16 × 8 words:
// - pairs[i] = rows i and i + 8 (128-bit lanes: i words 0-3, i 4-7, i+8 0-3, i+8 4-7);
// - interleaving words, then pairs of words, of rows 4k..4k+3 leaves in each 128-bit lane
//   one word of four consecutive rows;
// - the last round puts the four lanes of rows 0-3, 4-7, 8-11 and 12-15 together.
inline void store_transposed(uint8_t* dest, const __m256i rows[kLanes]) {
    constexpr int kPairs = kLanes / 2;
    __m512i pairs[kPairs];
    for (int i = 0; i < kPairs; ++i)
        pairs[i] = _mm512_inserti64x4(_mm512_castsi256_si512(rows[i]), rows[i + kPairs], 1);
    // quads[q][j]: word j (lanes 0, 2) and j + 4 (lanes 1, 3) of rows 4q..4q+3 (and + 8).
    __m512i quads[2][4];
    for (int q = 0; q < 2; ++q) {
        const __m512i* p = pairs + 4 * q;
        const __m512i low01 = _mm512_unpacklo_epi32(p[0], p[1]);
        const __m512i high01 = _mm512_unpackhi_epi32(p[0], p[1]);
        const __m512i low23 = _mm512_unpacklo_epi32(p[2], p[3]);
        const __m512i high23 = _mm512_unpackhi_epi32(p[2], p[3]);
        quads[q][0] = _mm512_unpacklo_epi64(low01, low23);
        quads[q][1] = _mm512_unpackhi_epi64(low01, low23);
        quads[q][2] = _mm512_unpacklo_epi64(high01, high23);
        quads[q][3] = _mm512_unpackhi_epi64(high01, high23);
    }
    // 64-bit element indices: lanes 0 and 2 of both (words 0-3), or lanes 1 and 3 (4-7).
    const __m512i first_words = _mm512_set_epi64(13, 12, 5, 4, 9, 8, 1, 0);
    const __m512i last_words = _mm512_set_epi64(15, 14, 7, 6, 11, 10, 3, 2);
    for (int j = 0; j < 4; ++j) {
        _mm512_storeu_si512(dest + j * kStepBytes,
                            _mm512_permutex2var_epi64(quads[0][j], first_words, quads[1][j]));
        _mm512_storeu_si512(dest + (j + 4) * kStepBytes,
                            _mm512_permutex2var_epi64(quads[0][j], last_words, quads[1][j]));
    }
}

// panel[g][s][r][4] = the unsigned bytes of columns 4s..4s+3 of group g of row first_row + r
// (kZeroWeight past the matrix's rows); scales[g][r] = that row's scale of group g (0 past).
template <DType kType>
void pack_row_tile(uint8_t* panel, float* scales, const Matrix& w, int first_row, int rows) {
    const int groups = w.scale_count_per_row();
    for (int g = 0; g < groups; ++g)
        for (int half = 0; half < kRowRegisters; ++half) {
            __m256i group_rows[kLanes];
            for (int i = 0; i < kLanes; ++i) {
                const int r = half * kLanes + i;
                if (r < rows)
                    load_unsigned_group<kType>(&group_rows[i], w, first_row + r, g);
                else
                    group_rows[i] = _mm256_set1_epi8(char(kZeroWeight));
            }
            store_transposed(panel + size_t(g) * kGroupBytes + half * kLanes * kBytesPerLane,
                             group_rows);
        }
    for (int r = 0; r < kQuantizedRowTile; ++r)
        for (int g = 0; g < groups; ++g)
            scales[g * kQuantizedRowTile + r] =
                r < rows ? half_to_float(w.scales[size_t(first_row + r) * groups + g]) : 0.0f;
}

// The four bytes of x at p, in every 32-bit lane.
inline __m512i broadcast_word(const int8_t* p) {
    return _mm512_broadcastd_epi32(_mm_loadu_si32(p));
}

// out[first_token + k][row] = Σ_g panel scale[g][row] × x scale[k][g] × (exact int32 dot of
// group g) for TOKENS tokens and the tile's rows (store_masks[h]: those of rows 16h..16h+15
// that exist); out has `stride` floats a token.
//
// Register tile: TOKENS ≤ kQuantizedTokenTile = 6 tokens × kQuantizedRowTile = 32 rows (two
// registers of 16 rows): 12 int32 dot registers and 12 f32 sum registers, plus the step's two
// weight registers and one broadcast of x: 27 of the 32. Each step (four columns) loads two panel
// registers and broadcasts four bytes of each token's x: 12 vpdpbusd for 2 + 6 loads.
// After a group's eight steps its dots are converted, scaled and added to the sums.
template <int TOKENS>
void tile_kernel(float* out, int stride, const __mmask16 store_masks[kRowRegisters],
                 const uint8_t* panel, const float* panel_scales, const QuantizedBatch& x,
                 int first_token) {
    const int8_t* values[TOKENS];
    const float* x_scales[TOKENS];
    const int32_t* starts[TOKENS];
#pragma GCC unroll 8
    for (int k = 0; k < TOKENS; ++k) {
        values[k] = x.values.data() + size_t(first_token + k) * x.padded_cols;
        x_scales[k] = x.scales.data() + size_t(first_token + k) * x.groups;
        starts[k] = x.starts.data() + size_t(first_token + k) * x.groups;
    }
    __m512 sums[TOKENS][kRowRegisters];
#pragma GCC unroll 8
    for (int k = 0; k < TOKENS; ++k)
#pragma GCC unroll 8
        for (int h = 0; h < kRowRegisters; ++h) sums[k][h] = _mm512_setzero_ps();
    for (int g = 0; g < x.groups; ++g) {
        __m512i dots[TOKENS][kRowRegisters];
#pragma GCC unroll 8
        for (int k = 0; k < TOKENS; ++k)
#pragma GCC unroll 8
            for (int h = 0; h < kRowRegisters; ++h) dots[k][h] = _mm512_set1_epi32(starts[k][g]);
        const uint8_t* group_panel = panel + size_t(g) * kGroupBytes;
#pragma GCC unroll 8
        for (int s = 0; s < kGroupSteps; ++s) {
            __m512i weights[kRowRegisters];
#pragma GCC unroll 8
            for (int h = 0; h < kRowRegisters; ++h)
                weights[h] =
                    _mm512_load_si512(group_panel + s * kStepBytes + h * kLanes * kBytesPerLane);
#pragma GCC unroll 8
            for (int k = 0; k < TOKENS; ++k) {
                const __m512i x_word = broadcast_word(values[k] + g * kGroup + s * kBytesPerLane);
#pragma GCC unroll 8
                for (int h = 0; h < kRowRegisters; ++h)
                    dots[k][h] = _mm512_dpbusd_epi32(dots[k][h], weights[h], x_word);
            }
        }
        __m512 weight_scales[kRowRegisters];
#pragma GCC unroll 8
        for (int h = 0; h < kRowRegisters; ++h)
            weight_scales[h] = _mm512_load_ps(panel_scales + g * kQuantizedRowTile + h * kLanes);
#pragma GCC unroll 8
        for (int k = 0; k < TOKENS; ++k) {
            const __m512 x_scale = _mm512_set1_ps(x_scales[k][g]);
#pragma GCC unroll 8
            for (int h = 0; h < kRowRegisters; ++h)
                sums[k][h] =
                    _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(dots[k][h]), weight_scales[h]),
                                    x_scale, sums[k][h]);
        }
    }
#pragma GCC unroll 8
    for (int k = 0; k < TOKENS; ++k)
#pragma GCC unroll 8
        for (int h = 0; h < kRowRegisters; ++h)
            _mm512_mask_storeu_ps(out + size_t(first_token + k) * stride + h * kLanes,
                                  store_masks[h], sums[k][h]);
}

using TileKernel = void (*)(float*, int, const __mmask16*, const uint8_t*, const float*,
                            const QuantizedBatch&, int);
constexpr TileKernel kTileKernels[kQuantizedTokenTile] = {
    tile_kernel<1>, tile_kernel<2>, tile_kernel<3>, tile_kernel<4>, tile_kernel<5>, tile_kernel<6>};

template <DType kType>
void matmul_batch_rows_typed(float* out, const Matrix& w, const QuantizedBatch& x, int first_row,
                             int row_count) {
    // One tile's panel and scales, 64-byte aligned, kept from call to call.
    static thread_local std::vector<uint8_t> panel_storage;
    static thread_local std::vector<float> scale_storage;
    panel_storage.resize(size_t(x.groups) * kGroupBytes + kAlignment);
    scale_storage.resize(size_t(x.groups) * kQuantizedRowTile + kAlignment / sizeof(float));
    uint8_t* panel = align64(panel_storage.data());
    float* scales = align64(scale_storage.data());
    const int end_row = first_row + row_count;
    for (int tile_row = first_row; tile_row < end_row; tile_row += kQuantizedRowTile) {
        const int rows = std::min(kQuantizedRowTile, end_row - tile_row);
        pack_row_tile<kType>(panel, scales, w, tile_row, rows);
        const __mmask16 store_masks[kRowRegisters] = {first_lanes(rows),
                                                      first_lanes(std::max(0, rows - kLanes))};
        for (int token = 0; token < x.batch; token += kQuantizedTokenTile)
            kTileKernels[std::min(kQuantizedTokenTile, x.batch - token) - 1](
                out + tile_row, w.rows, store_masks, panel, scales, x, token);
    }
}

}  // namespace

void resize_quantized_batch(QuantizedBatch* x, int batch, int cols) {
    x->batch = batch;
    x->groups = (cols + kGroup - 1) / kGroup;
    x->padded_cols = x->groups * kGroup;
    x->values.resize(size_t(batch) * x->padded_cols);
    x->scales.resize(size_t(batch) * x->groups);
    x->starts.resize(size_t(batch) * x->groups);
}

void quantize_token(QuantizedBatch* x, const float* x_row, int cols, int token) {
    int8_t* values = x->values.data() + size_t(token) * x->padded_cols;
    float* scales = x->scales.data() + size_t(token) * x->groups;
    int32_t* starts = x->starts.data() + size_t(token) * x->groups;
    for (int g = 0; g < x->groups; ++g) {
        const int first = g * kGroup, count = std::min(kGroup, cols - first);
        const __m512 low = _mm512_maskz_loadu_ps(first_lanes(count), x_row + first);
        const __m512 high =
            _mm512_maskz_loadu_ps(first_lanes(std::max(0, count - kLanes)), x_row + first + kLanes);
        const float largest =
            _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(low), _mm512_abs_ps(high)));
        const float scale = largest / kQ8Largest;
        const float inverse = scale > 0.0f ? 1.0f / scale : 0.0f;
        const __m512i low_values = round_half_away(_mm512_mul_ps(low, _mm512_set1_ps(inverse)));
        const __m512i high_values = round_half_away(_mm512_mul_ps(high, _mm512_set1_ps(inverse)));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(values + first),
                         _mm512_cvtepi32_epi8(low_values));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(values + first + kLanes),
                         _mm512_cvtepi32_epi8(high_values));
        scales[g] = scale;
        starts[g] =
            -kUnsignedOffset * _mm512_reduce_add_epi32(_mm512_add_epi32(low_values, high_values));
    }
}

void matmul_batch_rows_quantized(float* out, const Matrix& w, const QuantizedBatch& x,
                                 int first_row, int row_count) {
    if (w.dtype == DType::I8)
        matmul_batch_rows_typed<DType::I8>(out, w, x, first_row, row_count);
    else
        matmul_batch_rows_typed<DType::U8>(out, w, x, first_row, row_count);
}

}  // namespace barellm::cpu::avx512
