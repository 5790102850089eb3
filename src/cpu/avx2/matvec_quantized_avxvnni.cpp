// The decode matvecs on AVX2 + AVX-VNNI for Q8, Q4, IQ4_NL and MXFP4 weights: out = W · x for one
// token, x quantized to Q8 (cpu::quantize_q8), each group's dot product in integers with the
// 256-bit vpdpbusd, the weights read from their tiles of 16 rows (cpu/quantized_tiles.h).
//
// The design of the AVX-512 VNNI matvec (matvec_quantized_avx512vnni.cpp, whose comment explains
// the unsigned weights and each group's start), on ymm registers: a tile's 64-byte register is
// two halves of 8 rows, one ymm each, so a group's dot products of a tile fill two registers,
// and each broadcast word of x serves both. Each lane is a row: no horizontal sums, and 8 rows
// scaled by one multiply.
//
// A token's Q8 and Q4 sums are those of the AVX-VNNI GEMM (gemm_quantized_panels.h) to the bit:
// the same exact int32 dot of each group, then sum += dot × (weight scale × x scale) in the same
// order. So a sequence's Q8 and Q4 products have the same bits whether the server's step decoded
// it alone or beside others.
#include "cpu/avx2/avxvnni.h"
#include "cpu/avx2/block_levels_avx2.h"
#include "cpu/avx2/intrinsics_avx2.h"
#include "cpu/panel_prefetcher.h"
#include "cpu/quantized_tiles.h"

namespace barellm::cpu::avxvnni {

namespace {

using avx2::broadcast_word;
using avx2::group_tile_halves;
using avx2::kTileHalfBytes;
using avx2::kTileHalfRows;
using avx2::kTileHalves;
using avx2::store_rows;
using avx2::tile_halves;

constexpr int kGroup = kQ8Group;  // columns per scale (Q4's blocks are as wide)
static_assert(kQ4Block == kGroup);
constexpr int kHalfGroup = kGroup / 2;  // Q4: the high nibbles are columns 16-31

// Half h (rows 8h..8h+7) of a tile register.
inline __m256i half_register(const uint8_t* reg, int h) {
    return _mm256_load_si256(reinterpret_cast<const __m256i*>(reg + h * kTileHalfBytes));
}

// The group's 16 exact int32 dot products of a tile, rows 8h..8h+7 in dots[h]: `values` are
// the group's registers in the tile, x_group its 32 values; `levels` the table of IQ4_NL's or
// MXFP4's levels + 128. Two accumulators a half halve the chain of dependent vpdpbusd.
template <DType kType>
inline void group_dots(__m256i dots[kTileHalves], const uint8_t* values, const int8_t* x_group,
                       int32_t start, __m256i levels) {
    __m256i even[kTileHalves], odd[kTileHalves];
    for (int h = 0; h < kTileHalves; ++h) {
        even[h] = _mm256_set1_epi32(start);
        odd[h] = _mm256_setzero_si256();
    }
    if constexpr (kType == DType::Q8_0) {
        // Register j: columns 4j..4j+3.
        for (int j = 0; j < tile_registers(kType); j += 2) {
            const __m256i x_even = broadcast_word(x_group + j * kTileLaneBytes);
            const __m256i x_odd = broadcast_word(x_group + (j + 1) * kTileLaneBytes);
            for (int h = 0; h < kTileHalves; ++h) {
                even[h] = _mm256_dpbusd_avx_epi32(
                    even[h], half_register(values + j * kTileRegisterBytes, h), x_even);
                odd[h] = _mm256_dpbusd_avx_epi32(
                    odd[h], half_register(values + (j + 1) * kTileRegisterBytes, h), x_odd);
            }
        }
    } else {
        // Register j: columns 4j..4j+3 in the low nibbles, 16+4j..16+4j+3 in the high.
        const __m256i low_nibble = _mm256_set1_epi8(0x0f);
        for (int j = 0; j < tile_registers(kType); ++j) {
            const __m256i x_low = broadcast_word(x_group + j * kTileLaneBytes);
            const __m256i x_high = broadcast_word(x_group + kHalfGroup + j * kTileLaneBytes);
            for (int h = 0; h < kTileHalves; ++h) {
                const __m256i bytes = half_register(values + j * kTileRegisterBytes, h);
                __m256i low = _mm256_and_si256(bytes, low_nibble);
                __m256i high = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), low_nibble);
                if constexpr (looks_up_levels(kType)) {
                    low = _mm256_shuffle_epi8(levels, low);
                    high = _mm256_shuffle_epi8(levels, high);
                }
                even[h] = _mm256_dpbusd_avx_epi32(even[h], low, x_low);
                odd[h] = _mm256_dpbusd_avx_epi32(odd[h], high, x_high);
            }
        }
    }
    for (int h = 0; h < kTileHalves; ++h) dots[h] = _mm256_add_epi32(even[h], odd[h]);
}

// IQ4_NL's or MXFP4's table of levels + 128 (their sign bits flipped: unsigned), in both 128-bit
// lanes; nothing for the other types.
template <DType kType>
inline __m256i unsigned_levels() {
    if constexpr (!looks_up_levels(kType)) return _mm256_setzero_si256();
    const __m256i table = kType == DType::MXFP4 ? avx2::mxfp4_table() : avx2::iq4_table();
    static_assert(kTileLevelExcess == 128);  // + 128: the sign bit flipped
    return _mm256_xor_si256(table, _mm256_set1_epi8(char(kTileLevelExcess)));
}

template <DType kType>
void rows_kernel(float* out, const Matrix& w, const QuantizedVector& x, int first_row,
                 int row_count) {
    constexpr int kOffset = tile_offset(kType);
    const __m256i levels = unsigned_levels<kType>();
    const std::vector<int8_t>& x_values = padded_tile_x(x);
    const int groups = tile_groups(w);
    const size_t bytes_per_tile = tile_bytes(w);
    const int prefetch_bytes = tile_prefetch_bytes();
    const int end_row = first_row + row_count;
    // Whole tiles; a tile the run shares with another thread's is computed by both, each
    // storing its own rows.
    for (int t = first_row / kTileRows; t * kTileRows < end_row; ++t) {
        const uint8_t* tile = w.row_tiles + size_t(t) * bytes_per_tile;
        __m256 sums[kTileHalves] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
        for (int g = 0; g < groups; ++g) {
            if (prefetch_bytes > 0 && g % kTileBlockGroups == 0)
                prefetch_ahead(tile_group_block(tile, kType, g), prefetch_bytes,
                               int(tile_block_bytes(kType)));
            __m256i dots[kTileHalves];
            group_dots<kType>(dots, tile_group_values(tile, kType, g), x_values.data() + g * kGroup,
                              tile_group_start(x, g, kOffset), levels);
            const __m256 x_scale = _mm256_set1_ps(x.scales[g]);
            for (int h = 0; h < kTileHalves; ++h)
                sums[h] = _mm256_fmadd_ps(
                    _mm256_cvtepi32_ps(dots[h]),
                    _mm256_mul_ps(group_tile_halves<kType>(tile, g, h), x_scale), sums[h]);
        }
        for (int h = 0; h < kTileHalves; ++h)
            store_rows(out, sums[h], t * kTileRows + h * kTileHalfRows, first_row, end_row);
    }
}

}  // namespace

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

}  // namespace barellm::cpu::avxvnni
