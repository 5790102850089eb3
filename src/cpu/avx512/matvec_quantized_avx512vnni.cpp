// The decode matvecs on AVX-512 + VNNI for Q8, Q4, IQ4_NL and MXFP4 weights: out = W · x for
// one token, x quantized to Q8 (quantize_q8, as cpu::quantize_q8 but 16 values at a time), each
// group's dot product in integers with vpdpbusd, the weights read from their tiles of 16 rows
// (cpu/quantized_tiles.h).
//
// vpdpbusd multiplies unsigned bytes by signed bytes, four products into each int32 lane.
// x supplies the signed bytes, four of them broadcast to every lane; the weights are
// unsigned:
// - a tile holds a Q8 value w (-127..127) as w + 128: 128 · Σx too many;
// - a Q4 nibble q (0..15) is unsigned already, but stands for q − 8: 8 · Σx too many;
// - an IQ4_NL or MXFP4 nibble picks its level + 128 from a table (vpshufb): 128 · Σx too many.
// That excess depends on x alone: each group's dot product starts from its negative, so
// the int32 result is exact.
//
// Each lane is a row: a tile's 16 dot products of a group fill one register, scaled by the
// 16 weight scales beside them × the group's x scale and added to 16 f32 sums, which are the
// 16 outputs. A tile is one stream of whole cache lines, read front to back; on Intel each
// block of two groups asks for the cache lines tile_prefetch_bytes() ahead of it (into the
// next tile at a tile's end: the tiles lie one after another; a prefetch past the matrix is
// only a hint), which the loads waited for otherwise; on AMD the hardware prefetcher alone
// streams the tiles faster (docs/benchmarks-history.md: "CPU: software prefetch distances
// of the decode matvecs").
#include <algorithm>
#include <vector>

#include "cpu/avx512/avx512.h"
#include "cpu/avx512/helpers_avx512.h"
#include "cpu/quantized_tiles.h"

namespace barellm::cpu::avx512 {

namespace {

constexpr int kGroup = kQ8Group;  // columns per scale (Q4's blocks are as wide)
static_assert(kQ4Block == kGroup && kTileRows == kLanes);
constexpr int kHalfGroup = kGroup / 2;  // Q4: the high nibbles are columns 16-31

// The group's 16 exact int32 dot products, one a row: `values` are the group's registers in
// the tile, x_group its 32 values; `levels` the table of IQ4_NL's or MXFP4's levels + 128. Two
// accumulators halve the chain of dependent vpdpbusd.
template <DType kType>
inline __m512i group_dots(const uint8_t* values, const int8_t* x_group, int32_t start,
                          __m512i levels) {
    __m512i even = _mm512_set1_epi32(start), odd = _mm512_setzero_si512();
    if constexpr (kType == DType::Q8_0) {
        // Register j: columns 4j..4j+3.
        for (int j = 0; j < tile_registers(kType); j += 2) {
            even = _mm512_dpbusd_epi32(even, _mm512_load_si512(values + j * kTileRegisterBytes),
                                       broadcast_word(x_group + j * kTileLaneBytes));
            odd = _mm512_dpbusd_epi32(odd, _mm512_load_si512(values + (j + 1) * kTileRegisterBytes),
                                      broadcast_word(x_group + (j + 1) * kTileLaneBytes));
        }
    } else {
        // Register j: columns 4j..4j+3 in the low nibbles, 16+4j..16+4j+3 in the high.
        const __m512i low_nibble = _mm512_set1_epi8(0x0f);
        for (int j = 0; j < tile_registers(kType); ++j) {
            const __m512i bytes = _mm512_load_si512(values + j * kTileRegisterBytes);
            __m512i low = _mm512_and_si512(bytes, low_nibble);
            __m512i high = _mm512_and_si512(_mm512_srli_epi16(bytes, 4), low_nibble);
            if constexpr (looks_up_levels(kType)) {
                low = _mm512_shuffle_epi8(levels, low);
                high = _mm512_shuffle_epi8(levels, high);
            }
            even = _mm512_dpbusd_epi32(even, low, broadcast_word(x_group + j * kTileLaneBytes));
            odd = _mm512_dpbusd_epi32(odd, high,
                                      broadcast_word(x_group + kHalfGroup + j * kTileLaneBytes));
        }
    }
    return _mm512_add_epi32(even, odd);
}

template <DType kType>
void rows_kernel(float* out, const Matrix& w, const QuantizedVector& x, int first_row,
                 int row_count) {
    constexpr int kOffset = tile_offset(kType);
    const __m512i levels = kType == DType::IQ4_NL  ? unsigned_levels(kIq4Values)
                           : kType == DType::MXFP4 ? unsigned_levels(kMxfp4Values)
                                                   : _mm512_setzero_si512();
    const std::vector<int8_t>& x_values = padded_tile_x(x);
    const int groups = tile_groups(w);
    const size_t bytes_per_tile = tile_bytes(w);
    const int prefetch_bytes = tile_prefetch_bytes();
    const int end_row = first_row + row_count;
    // Whole tiles; a tile the run shares with another thread's is computed by both, each
    // storing its own rows.
    for (int t = first_row / kTileRows; t * kTileRows < end_row; ++t) {
        const uint8_t* tile = w.row_tiles + size_t(t) * bytes_per_tile;
        __m512 sums = _mm512_setzero_ps();
        for (int g = 0; g < groups; ++g) {
            if (prefetch_bytes > 0 && g % kTileBlockGroups == 0)
                prefetch_ahead(tile_group_block(tile, kType, g), prefetch_bytes,
                               int(tile_block_bytes(kType)));
            const __m512 weight_scales = group_tile_scales<kType>(tile, g);
            const __m512i dots =
                group_dots<kType>(tile_group_values(tile, kType, g), x_values.data() + g * kGroup,
                                  tile_group_start(x, g, kOffset), levels);
            sums = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dots),
                                   _mm512_mul_ps(weight_scales, _mm512_set1_ps(x.scales[g])), sums);
        }
        const int tile_row = t * kTileRows;
        _mm512_mask_storeu_ps(out + tile_row, lanes_in(tile_row, first_row, end_row), sums);
    }
}

}  // namespace

void quantize_q8(QuantizedVector* out, const float* x, int n) {
    resize_quantized_vector(out, n);
    const int groups = int(out->scales.size());
    quantize_groups(x, n, groups, out->scales.data(), [&](int g, __m128i low, __m128i high) {
        alignas(16) int8_t values[kGroup];
        _mm_store_si128(reinterpret_cast<__m128i*>(values), low);
        _mm_store_si128(reinterpret_cast<__m128i*>(values + kLanes), high);
        const int first = g * kGroup;
        std::copy(values, values + std::min(kGroup, n - first), out->values.begin() + first);
        out->group_sums[g] = float(sum_of_16_bytes(low) + sum_of_16_bytes(high));
    });
    order_q4_pairs(out);
}

void matvec_rows_q8(float* out, const Matrix& w, const QuantizedVector& x, int first_row,
                    int row_count) {
    rows_kernel<DType::Q8_0>(out, w, x, first_row, row_count);
}

void matvec_rows_q4(float* out, const Matrix& w, const QuantizedVector& x, int first_row,
                    int row_count) {
    rows_kernel<DType::Q4_0>(out, w, x, first_row, row_count);
}

void matvec_rows_lookup_blocks(float* out, const Matrix& w, const QuantizedVector& x, int first_row,
                               int row_count) {
    (w.dtype == DType::MXFP4 ? rows_kernel<DType::MXFP4>
                             : rows_kernel<DType::IQ4_NL>)(out, w, x, first_row, row_count);
}

}  // namespace barellm::cpu::avx512
