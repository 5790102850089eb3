// The decode matvecs on AVX-512 + VNNI for Q8 and Q4 weights: out = W · x for one token,
// x quantized to Q8 (quantize_q8), each group's dot product in integers with vpdpbusd.
//
// vpdpbusd multiplies unsigned bytes by signed bytes, four products into each int32 lane.
// x supplies the signed bytes; the weights are made unsigned:
// - a Q8 weight w (-127..127) becomes w + 128 (its top bit flipped): 128 · Σx too many;
// - a Q4 nibble q (0..15) is unsigned already, but stands for q − 8: 8 · Σx too many.
// That excess, offset × (the sum of a lane's four x), depends on x alone: it is computed
// once per call, and each lane's dot product starts from its negative, so the int32
// results are exact. Two groups of 32 columns fill one 512-bit register: lanes 0-7 hold the
// first group's partial sums, lanes 8-15 the second's; each lane is then scaled by its
// group's weight scale × x scale.
#include <algorithm>
#include <vector>

#include "cpu/avx512.h"
#include "cpu/helpers_avx512.h"

namespace barellm::cpu::BARELLM_AVX512_NAMESPACE {

namespace {

constexpr int kGroup = kQ8Group;  // columns per scale (Q4's blocks are as wide)
static_assert(kQ4Block == kGroup);
constexpr int kPairColumns = 2 * kGroup;  // columns per register of products: 64 bytes
constexpr int kChunkGroups = kLanes;      // groups whose scales share one register
constexpr int kBytesPerLane = 4;          // x bytes summed into one int32 lane
constexpr int kQ8Offset = 128;            // Q8 weight + 128 is unsigned

// start[j] = −offset · (x[4j] + x[4j+1] + x[4j+2] + x[4j+3]): the value the int32 lane of
// columns 4j..4j+3 starts from. Zero past the end of x, whole registers of 64 columns.
const int32_t* lane_starts(const QuantizedVector& x, int offset) {
    static thread_local std::vector<int32_t> starts;
    const int n = int(x.values.size());
    const int registers = (n + kPairColumns - 1) / kPairColumns;
    starts.resize(size_t(registers) * kLanes);
    const __m512i offsets = _mm512_set1_epi8(char(offset));
    for (int r = 0; r < registers; ++r) {
        const __m512i values = _mm512_maskz_loadu_epi8(first_bytes(n - r * kPairColumns),
                                                       x.values.data() + r * kPairColumns);
        const __m512i excess = _mm512_dpbusd_epi32(_mm512_setzero_si512(), offsets, values);
        _mm512_storeu_si512(starts.data() + size_t(r) * kLanes,
                            _mm512_sub_epi32(_mm512_setzero_si512(), excess));
    }
    return starts.data();
}

// The permutation sending scale k to lanes 0-7 and scale k + 1 to lanes 8-15.
inline __m512i pair_scale_index(int k) {
    return _mm512_add_epi32(_mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0),
                            _mm512_set1_epi32(k));
}

// The 32 bytes of Q8 weights at columns col.. of a row, made unsigned (w + 128); only the
// first `count` are read.
struct Q8Pairs {
    static int byte_offset(int col) { return col; }
    static __m512i unsigned_weights(const void* row, int col, int count) {
        const __m512i w =
            _mm512_maskz_loadu_epi8(first_bytes(count), static_cast<const int8_t*>(row) + col);
        return _mm512_xor_si512(w, _mm512_set1_epi8(char(0x80)));
    }
};

// The 64 nibbles of two Q4 blocks at columns col.. of a row, in column order; only the
// first `count` columns are read. A block's 16 bytes hold columns 0-15 in their low
// nibbles and 16-31 in their high nibbles.
struct Q4Pairs {
    static int byte_offset(int col) { return col / 2; }
    static __m512i unsigned_weights(const void* row, int col, int count) {
        const __m256i bytes = _mm256_maskz_loadu_epi8(
            __mmask32(first_bytes(count / 2)), static_cast<const uint8_t*>(row) + byte_offset(col));
        const __m256i low_nibble = _mm256_set1_epi8(0x0f);
        const __m256i low = _mm256_and_si256(bytes, low_nibble);
        const __m256i high = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), low_nibble);
        // [low of block 0, low of block 1, high of 0, high of 1] → [low 0, high 0, low 1, high 1]
        const __m512i halves = _mm512_inserti64x4(_mm512_castsi256_si512(low), high, 1);
        return _mm512_shuffle_i32x4(halves, halves, _MM_SHUFFLE(3, 1, 2, 0));
    }
};

// One row · x: Σ over groups g of weight scale × x scale × (exact int32 dot of group g).
// `row` is the row's values, row_scales its f16 scales, next_row where the following row's
// values start (prefetched alongside, a pair's bytes at a time).
template <typename Pairs>
float row_dot(const void* row, const void* next_row, const uint16_t* row_scales,
              const QuantizedVector& x, const int32_t* starts, int cols) {
    const int groups = (cols + kGroup - 1) / kGroup;
    __m512 sum[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int g = 0; g < groups; g += kChunkGroups) {
        const int chunk = std::min(kChunkGroups, groups - g);
        const __mmask16 present = first_lanes(chunk);
        const __m512 scales =
            _mm512_mul_ps(_mm512_cvtph_ps(_mm256_maskz_loadu_epi16(present, row_scales + g)),
                          _mm512_maskz_loadu_ps(present, x.scales.data() + g));
        for (int k = 0; k < chunk; k += 2) {
            const int col = (g + k) * kGroup;
            _mm_prefetch(static_cast<const char*>(next_row) + Pairs::byte_offset(col), _MM_HINT_T0);
            const __m512i values =
                _mm512_maskz_loadu_epi8(first_bytes(cols - col), x.values.data() + col);
            const __m512i dots =
                _mm512_dpbusd_epi32(_mm512_loadu_si512(starts + col / kBytesPerLane),
                                    Pairs::unsigned_weights(row, col, cols - col), values);
            const __m512 scale = _mm512_permutexvar_ps(pair_scale_index(k), scales);
            sum[k / 2 % 2] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dots), scale, sum[k / 2 % 2]);
        }
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(sum[0], sum[1]));
}

}  // namespace

void matmul_rows_q8(float* out, const Matrix& w, const QuantizedVector& x, int first_row,
                    int row_count) {
    const int32_t* starts = lane_starts(x, kQ8Offset);
    const int8_t* values = static_cast<const int8_t*>(w.data);
    const int groups = w.q8_groups();
    for (int r = first_row; r < first_row + row_count; ++r) {
        const int8_t* row = values + size_t(r) * w.cols;
        out[r] =
            row_dot<Q8Pairs>(row, row + w.cols, w.scales + size_t(r) * groups, x, starts, w.cols);
    }
}

void matmul_rows_q4(float* out, const Matrix& w, const QuantizedVector& x, int first_row,
                    int row_count) {
    const int32_t* starts = lane_starts(x, kQ4Offset);
    const uint8_t* values = static_cast<const uint8_t*>(w.data);
    const int blocks = w.q4_blocks();
    for (int r = first_row; r < first_row + row_count; ++r) {
        const uint8_t* row = values + r * w.row_bytes();
        out[r] = row_dot<Q4Pairs>(row, row + w.row_bytes(), w.scales + size_t(r) * blocks, x,
                                  starts, w.cols);
    }
}

}  // namespace barellm::cpu::BARELLM_AVX512_NAMESPACE
