// The decode matvecs on AVX2 + AVX-VNNI for Q8 and Q4 weights: out = W · x for one token, x
// quantized to Q8 (cpu::quantize_q8), each group's dot product in integers with the 256-bit
// vpdpbusd, the weights read from their tiles of 16 rows (cpu/quantized_tiles.h).
//
// The design of the AVX-512 VNNI matvec (matvec_quantized_avx512vnni.cpp, whose comment explains
// the unsigned weights and each group's start), on ymm registers: a tile's 64-byte register is
// two halves of 8 rows, one ymm each, so a group's dot products of a tile fill two registers,
// and each broadcast word of x serves both. Each lane is a row: no horizontal sums, and 8 rows
// scaled by one multiply.
//
// A token's sums are those of the AVX-VNNI GEMM (gemm_quantized_panels.h) to the bit: the same
// exact int32 dot of each group, then sum += dot × (weight scale × x scale) in the same order. So
// a sequence's logits do not depend on whether the server's step decoded it alone or beside
// others.
#ifdef BARELLM_SIMDE
#include "simde_avx512.h"  // tests/simde/: SIMDe's AVX2, and vpdpbusd
#else
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstring>
#include <vector>

#include "cpu/avx2/avxvnni.h"
#include "cpu/panel_prefetcher.h"
#include "cpu/quantized_tiles.h"

namespace barellm::cpu::avxvnni {

namespace {

constexpr int kGroup = kQ8Group;  // columns per scale (Q4's blocks are as wide)
static_assert(kQ4Block == kGroup);
constexpr int kHalfGroup = kGroup / 2;  // Q4: the high nibbles are columns 16-31
constexpr int kLanes = 8;               // 32-bit lanes of a ymm register: rows of a half tile
constexpr int kTileHalves = kTileRows / kLanes;              // 2
constexpr int kHalfRegisterBytes = kLanes * kTileLaneBytes;  // 32
static_assert(kTileHalves * kHalfRegisterBytes == kTileRegisterBytes);

// How far ahead of the block being read each block of two groups asks for cache lines: the
// AVX-512 matvec's distance (measured there on Intel, where the loads waited for memory
// without it); 0 where the hardware prefetcher streams the tiles alone.
int tile_prefetch_bytes() {
    static const int bytes = cpu_prefetches_tiles_unaided() ? 0 : 12 * kCacheLine;
    return bytes;
}

// The four bytes at p in every 32-bit lane.
inline __m256i broadcast_word(const int8_t* p) {
    int32_t word;
    std::memcpy(&word, p, sizeof word);
    return _mm256_set1_epi32(word);
}

// Half h (rows 8h..8h+7) of a tile register, or of a group's 16 f16 scales, as f32.
inline __m256i half_register(const uint8_t* reg, int h) {
    return _mm256_load_si256(reinterpret_cast<const __m256i*>(reg + h * kHalfRegisterBytes));
}
inline __m256 half_scales(const uint16_t* scales, int h) {
    return _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(scales + h * kLanes)));
}

// x as the kernel reads it: its values padded with zeros to whole groups, and each group's
// start, −offset × Σ of its values (offset 128 for Q8, 8 for Q4).
struct TileX {
    std::vector<int8_t> values;
    std::vector<int32_t> starts;
};

const TileX& prepare_x(const QuantizedVector& x, int offset) {
    static thread_local TileX prepared;
    const int groups = int(x.scales.size());
    prepared.values.assign(size_t(groups) * kGroup, 0);
    std::copy(x.values.begin(), x.values.end(), prepared.values.begin());
    prepared.starts.resize(groups);
    for (int g = 0; g < groups; ++g) prepared.starts[g] = -offset * int(x.group_sums[g]);
    return prepared;
}

// The group's 16 exact int32 dot products of a tile, rows 8h..8h+7 in dots[h]: `values` are
// the group's registers in the tile, x_group its 32 values. Two accumulators a half halve the
// chain of dependent vpdpbusd.
template <DType kType>
inline void group_dots(__m256i dots[kTileHalves], const uint8_t* values, const int8_t* x_group,
                       int32_t start) {
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
                const __m256i low = _mm256_and_si256(bytes, low_nibble);
                const __m256i high = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), low_nibble);
                even[h] = _mm256_dpbusd_avx_epi32(even[h], low, x_low);
                odd[h] = _mm256_dpbusd_avx_epi32(odd[h], high, x_high);
            }
        }
    }
    for (int h = 0; h < kTileHalves; ++h) dots[h] = _mm256_add_epi32(even[h], odd[h]);
}

// Sums of rows row_base..row_base + 7 into out, those of [first, end).
inline void store_rows(float* out, __m256 sums, int row_base, int first, int end) {
    if (row_base >= first && row_base + kLanes <= end) {
        _mm256_storeu_ps(out + row_base, sums);
        return;
    }
    alignas(32) float lanes[kLanes];
    _mm256_store_ps(lanes, sums);
    for (int lane = std::max(0, first - row_base); lane < std::min(kLanes, end - row_base); ++lane)
        out[row_base + lane] = lanes[lane];
}

template <DType kType>
void rows_kernel(float* out, const Matrix& w, const QuantizedVector& x, int first_row,
                 int row_count) {
    constexpr int kOffset = kType == DType::Q8_0 ? kTileQ8Zero : kQ4Offset;
    const TileX& prepared = prepare_x(x, kOffset);
    const int groups = w.scale_count_per_row();
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
            group_dots<kType>(dots, tile_group_values(tile, kType, g),
                              prepared.values.data() + g * kGroup, prepared.starts[g]);
            const __m256 x_scale = _mm256_set1_ps(x.scales[g]);
            for (int h = 0; h < kTileHalves; ++h)
                sums[h] = _mm256_fmadd_ps(
                    _mm256_cvtepi32_ps(dots[h]),
                    _mm256_mul_ps(half_scales(tile_group_scales(tile, kType, g), h), x_scale),
                    sums[h]);
        }
        for (int h = 0; h < kTileHalves; ++h)
            store_rows(out, sums[h], t * kTileRows + h * kLanes, first_row, end_row);
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

}  // namespace barellm::cpu::avxvnni
