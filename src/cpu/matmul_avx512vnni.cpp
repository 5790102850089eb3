// The decode matvecs on AVX-512 + VNNI for Q8 and Q4 weights: out = W · x for one token,
// x quantized to Q8 (quantize_q8), each group's dot product in integers with vpdpbusd.
//
// vpdpbusd multiplies unsigned bytes by signed bytes, four products into each int32 lane.
// x supplies the signed bytes; the weights are made unsigned:
// - a Q8 weight w (-127..127) becomes w + 128 (its top bit flipped): 128 · Σx too many;
// - a Q4 nibble q (0..15) is unsigned already, but stands for q − 8: 8 · Σx too many.
// That excess depends on x alone: it is computed once per call, and each lane's dot
// product starts from its negative, so the int32 results are exact.
//
// A row is read as one stream, 64 bytes a step:
// - Q8: a step is 64 columns, two groups; lanes 0-7 sum the first group, 8-15 the second.
// - Q4: a step is four blocks (128 columns): the low nibbles of its 64 bytes are columns
//   0-15 of each block, the high nibbles columns 16-31. x is laid out once per call to
//   match (x_low: columns 0-15 of the four blocks, x_high: 16-31), so both halves add into
//   one register, four lanes a block.
// Each lane is then scaled by its group's weight scale × x scale, in f32.
#include <algorithm>
#include <vector>

#include "cpu/avx512.h"
#include "cpu/helpers_avx512.h"

namespace barellm::cpu::avx512 {

namespace {

constexpr int kGroup = kQ8Group;  // columns per scale (Q4's blocks are as wide)
static_assert(kQ4Block == kGroup);
constexpr int kStepBytes = 64;        // weight bytes per step: one register
constexpr int kChunkGroups = kLanes;  // groups whose scales share one register
constexpr int kScaleLookahead = 2;    // rows between a row's scale prefetch and its use
constexpr int kCacheLineBytes = 64;

struct Q8Format {
    static constexpr int kGroupsPerStep = kStepBytes / kGroup;  // 2
    static constexpr int kOffset = 128;                         // w + 128 is unsigned
    static constexpr int kXBytesPerStep = kStepBytes;
    static size_t row_bytes(int cols) { return size_t(cols); }
    // Σ over the step's columns of (w + 128) · x into the lanes of acc; `weights` are the
    // step's 64 bytes (zero past the row's end).
    static __m512i add_products(__m512i acc, __m512i weights, const int8_t* x_step) {
        const __m512i unsigned_weights = _mm512_xor_si512(weights, _mm512_set1_epi8(char(0x80)));
        return _mm512_dpbusd_epi32(acc, unsigned_weights, _mm512_loadu_si512(x_step));
    }
    // x_step[j] for the step's columns in the order add_products reads them: as they are.
    static void lay_out_x(int8_t* x_step, const int8_t* x, int first_col, int n) {
        for (int j = 0; j < kStepBytes; ++j) x_step[j] = first_col + j < n ? x[first_col + j] : 0;
    }
};

struct Q4Format {
    static constexpr int kGroupsPerStep = 2 * kStepBytes / kGroup;  // 4
    static constexpr int kOffset = kQ4Offset;                       // q stands for q - 8
    static constexpr int kXBytesPerStep = 2 * kStepBytes;           // x_low, then x_high
    static constexpr int kHalfBlock = kQ4BlockBytes;                // 16 columns
    static size_t row_bytes(int cols) { return size_t(cols) / 2; }
    static __m512i add_products(__m512i acc, __m512i bytes, const int8_t* x_step) {
        const __m512i low_nibble = _mm512_set1_epi8(0x0f);
        const __m512i low = _mm512_and_si512(bytes, low_nibble);
        const __m512i high = _mm512_and_si512(_mm512_srli_epi16(bytes, 4), low_nibble);
        acc = _mm512_dpbusd_epi32(acc, low, _mm512_loadu_si512(x_step));
        return _mm512_dpbusd_epi32(acc, high, _mm512_loadu_si512(x_step + kStepBytes));
    }
    // Byte j of x_low is column (j / 16) · 32 + j % 16 of the step; x_high 16 columns on.
    static void lay_out_x(int8_t* x_step, const int8_t* x, int first_col, int n) {
        for (int half = 0; half < 2; ++half)
            for (int j = 0; j < kStepBytes; ++j) {
                const int col =
                    first_col + (j / kHalfBlock) * kGroup + half * kHalfBlock + j % kHalfBlock;
                x_step[half * kStepBytes + j] = col < n ? x[col] : 0;
            }
    }
};

// x as one format's steps read it, and each lane's starting value.
struct PreparedX {
    std::vector<int8_t> steps;    // [steps, Format::kXBytesPerStep]
    std::vector<int32_t> starts;  // [steps, 16]: −offset × the sum of the lane's x bytes
};

template <typename Format>
const PreparedX& prepare_x(const QuantizedVector& x) {
    constexpr int kBytesPerLane = 4;
    static thread_local PreparedX prepared;
    const int n = int(x.values.size());
    const int columns_per_step = Format::kGroupsPerStep * kGroup;
    const int steps = (n + columns_per_step - 1) / columns_per_step;
    prepared.steps.resize(size_t(steps) * Format::kXBytesPerStep);
    prepared.starts.resize(size_t(steps) * kLanes);
    for (int s = 0; s < steps; ++s) {
        int8_t* x_step = prepared.steps.data() + size_t(s) * Format::kXBytesPerStep;
        Format::lay_out_x(x_step, x.values.data(), s * columns_per_step, n);
        // A lane reads bytes 4·lane.. of each 64-byte register of the step's x.
        for (int lane = 0; lane < kLanes; ++lane) {
            int sum = 0;
            for (int half = 0; half < Format::kXBytesPerStep; half += kStepBytes)
                for (int k = 0; k < kBytesPerLane; ++k)
                    sum += x_step[half + lane * kBytesPerLane + k];
            prepared.starts[size_t(s) * kLanes + lane] = -Format::kOffset * sum;
        }
    }
    return prepared;
}

// lanes_per_group[l] = the group (within a step) of lane l: l / (16 / groups per step).
template <typename Format>
__m512i lane_groups() {
    constexpr int kLanesPerGroup = kLanes / Format::kGroupsPerStep;
    alignas(64) int32_t groups[kLanes];
    for (int lane = 0; lane < kLanes; ++lane) groups[lane] = lane / kLanesPerGroup;
    return _mm512_load_si512(groups);
}

// One row · x: Σ over groups g of weight scale × x scale × (exact int32 dot of group g).
// row_scales: the row's f16 scales, one a group.
template <typename Format>
float row_dot(const uint8_t* row, const uint16_t* row_scales, const QuantizedVector& x,
              const PreparedX& prepared, int cols) {
    const int groups = (cols + kGroup - 1) / kGroup;
    const size_t row_bytes = Format::row_bytes(cols);
    const __m512i step_lane_groups = lane_groups<Format>();
    // One accumulator: a step's FMA (4 cycles of latency) is shorter than the step.
    __m512 sum = _mm512_setzero_ps();
    int step = 0;
    for (int g = 0; g < groups; g += kChunkGroups) {
        const int chunk = std::min(kChunkGroups, groups - g);
        const __mmask16 present = first_lanes(chunk);
        const __m512 scales =
            _mm512_mul_ps(_mm512_cvtph_ps(_mm256_maskz_loadu_epi16(present, row_scales + g)),
                          _mm512_maskz_loadu_ps(present, x.scales.data() + g));
        for (int k = 0; k < chunk; k += Format::kGroupsPerStep, ++step) {
            const size_t offset = size_t(step) * kStepBytes;
            // The last step of a row may be partial: read only the row's bytes.
            const __m512i weights =
                offset + kStepBytes <= row_bytes
                    ? _mm512_loadu_si512(row + offset)
                    : _mm512_maskz_loadu_epi8(first_bytes(int(row_bytes - offset)), row + offset);
            const __m512i dots = Format::add_products(
                _mm512_loadu_si512(prepared.starts.data() + size_t(step) * kLanes), weights,
                prepared.steps.data() + size_t(step) * Format::kXBytesPerStep);
            const __m512 lane_scales = _mm512_permutexvar_ps(
                _mm512_add_epi32(step_lane_groups, _mm512_set1_epi32(k)), scales);
            sum = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dots), lane_scales, sum);
        }
    }
    return _mm512_reduce_add_ps(sum);
}

template <typename Format>
void rows_kernel(float* out, const Matrix& w, const QuantizedVector& x, int first_row,
                 int row_count) {
    const PreparedX& prepared = prepare_x<Format>(x);
    const uint8_t* values = static_cast<const uint8_t*>(w.data);
    const int groups = w.scale_count_per_row();
    const size_t scale_bytes = size_t(groups) * sizeof(uint16_t);
    for (int r = first_row; r < first_row + row_count; ++r) {
        // The scales are a second, slow stream (a line per 32 groups) that the hardware
        // prefetcher does not follow: fetch those of a row a few rows ahead.
        const char* ahead =
            reinterpret_cast<const char*>(w.scales + size_t(r + kScaleLookahead) * groups);
        for (size_t line = 0; line < scale_bytes; line += kCacheLineBytes)
            _mm_prefetch(ahead + line, _MM_HINT_T0);
        out[r] = row_dot<Format>(values + r * w.row_bytes(), w.scales + size_t(r) * groups, x,
                                 prepared, w.cols);
    }
}

}  // namespace

void matmul_rows_q8(float* out, const Matrix& w, const QuantizedVector& x, int first_row,
                    int row_count) {
    rows_kernel<Q8Format>(out, w, x, first_row, row_count);
}

void matmul_rows_q4(float* out, const Matrix& w, const QuantizedVector& x, int first_row,
                    int row_count) {
    rows_kernel<Q4Format>(out, w, x, first_row, row_count);
}

}  // namespace barellm::cpu::avx512
