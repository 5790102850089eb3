// Q8 and Q4 weights dequantized to f16: each weight becomes q * scale rounded to f16, the
// scale being its block's f16 scale (kernels.h: DeviceMatrix has the layout). The block types
// (block_units.cuh) too: dequantize_block_rows_kernel computes each weight in f32 and rounds
// it to f16 once; their prefill always multiplies that f16 copy (gemm.cuh). Q8/Q4 have two
// users:
// - the quantized tensor-core GEMM tiles (gemm.cuh: dequantize_stage) turn each K tile of
//   raw bytes into f16 in shared memory, 8 weights at a time (dequantize_eight);
// - on sm_90a, the prefill dequantizes a whole matrix into f16 device memory
//   (dequantize_rows_kernel) and multiplies it on the warpgroup GEMM (gemm_warpgroup.cuh),
//   where that GEMM would take f16 weights of the same shape: at 512 tokens writing and
//   reading back the f16 copy costs less than the quantized tiles' slower products.
// Both give the same f16 values, so the two paths multiply the same numbers.
#pragma once
#include <cstddef>
#include <cstdint>

#include "block_units.cuh"
#include "common.cuh"
#include "cuda_check.h"
#include "kernels.h"

namespace barellm::cuda {

// The f16 bits of 1024: 0x6400 | b is the f16 1024 + b for 0 <= b < 1024.
constexpr uint32_t kF16Magic1024 = 0x6400u;
constexpr float kF16Magic1024Value = 1024.0f;

// Four weights held as the bytes of `bytes` (each q + bias, 0..255; the lowest byte is the
// lowest column) dequantized to f16: q * scale rounded to f16 (scale: f16 bits), as two
// f16x2 words, the lower column in the lower half. On the GPU the bytes become f16 1024 + b
// by bit operations and two f16x2 instructions subtract 1024 + bias (exact) and multiply by
// the scale (one rounding); the CPU emulation computes the same single rounding in f32, where
// q * scale is exact.
__device__ __forceinline__ uint2 dequantize_four(uint32_t bytes, int bias, uint16_t scale) {
#ifdef __CUDA_ARCH__
    const uint32_t magic_pair = kF16Magic1024 << 16 | kF16Magic1024;
    const uint32_t low = (bytes & 0xffu) | (bytes & 0xff00u) << 8 | magic_pair;
    const uint32_t high = (bytes >> 16 & 0xffu) | (bytes >> 8 & 0xff0000u) | magic_pair;
    const __half2 offset = __float2half2_rn(kF16Magic1024Value + float(bias));
    const __half2 scale_pair = __half2half2(__ushort_as_half(scale));
    const __half2 low_values =
        __hmul2(__hsub2(*reinterpret_cast<const __half2*>(&low), offset), scale_pair);
    const __half2 high_values =
        __hmul2(__hsub2(*reinterpret_cast<const __half2*>(&high), offset), scale_pair);
    return uint2{*reinterpret_cast<const uint32_t*>(&low_values),
                 *reinterpret_cast<const uint32_t*>(&high_values)};
#else
    const float s = __half2float(__ushort_as_half(scale));
    uint32_t halves[4];
    for (int i = 0; i < 4; ++i) {
        const int q = int(bytes >> (8 * i) & 0xffu) - bias;
        halves[i] = __half_as_ushort(__float2half_rn(float(q) * s));
    }
    return uint2{halves[0] | halves[1] << 16, halves[2] | halves[3] << 16};
#endif
}

// Weights column .. column + 7 (column a multiple of 8) of a Q8 (W = I8) or Q4 (U8) row
// whose values start at `row` (8-byte aligned; column 0 starts a block) as 8 f16 values in
// column order, `scale` being the f16 bits of their block's scale.
// - Q8: 8 int8 values; q + 128 is the byte with its top bit flipped.
// - Q4: columns c..c+7 of a block are the low (c < 16) or high nibbles of its bytes
//   c % 16 .. c % 16 + 7, each q + kQ4Offset.
template <DType W>
__device__ __forceinline__ uint4 dequantize_eight(const uint8_t* row, int column, uint16_t scale) {
    static_assert(W == DType::Q8_0 || W == DType::Q4_0, "Q8 (I8) or Q4 (U8) weights");
    constexpr uint32_t kSignBits = 0x80808080u, kLowNibbles = 0x0f0f0f0fu;
    constexpr int kQ8Bias = 128, kNibbleBits = 4, kHalfBlock = kQuantizedBlock / 2;
    uint2 bytes;
    int bias;
    if constexpr (W == DType::Q8_0) {
        bytes = *reinterpret_cast<const uint2*>(row + column);
        bytes.x ^= kSignBits;
        bytes.y ^= kSignBits;
        bias = kQ8Bias;
    } else {
        const int block = column / kQuantizedBlock, within = column % kQuantizedBlock;
        bytes = *reinterpret_cast<const uint2*>(row + block * kHalfBlock + within % kHalfBlock);
        const int shift = within / kHalfBlock * kNibbleBits;
        bytes.x = bytes.x >> shift & kLowNibbles;
        bytes.y = bytes.y >> shift & kLowNibbles;
        bias = kQ4Offset;
    }
    const uint2 low = dequantize_four(bytes.x, bias, scale);
    const uint2 high = dequantize_four(bytes.y, bias, scale);
    return uint4{low.x, low.y, high.x, high.y};
}

constexpr int kDequantizeThreads = 256;
constexpr int kDequantizeChunk = 8;  // f16 values a thread writes at a time (16 bytes)

// out[r, c] = W[r, c] as f16 (dequantize_eight) for r < rows, c < out_pitch: W a Q8/Q4
// matrix of w_pitch columns a row (values: w_pitch bytes a row for Q8, w_pitch / 2 for Q4;
// scales [rows, w_pitch / 32]), out f16 [rows, out_pitch] with out_pitch <= w_pitch a
// multiple of 8. Each thread writes 8 consecutive values of a
// row (one 16-byte store; consecutive threads, consecutive chunks).
// Launch: grid dequantize_rows_grid(rows, out_pitch), block kDequantizeThreads.
template <DType W>
__global__ void __launch_bounds__(kDequantizeThreads)
    dequantize_rows_kernel(uint16_t* __restrict__ out, int out_pitch,
                           const uint8_t* __restrict__ values, const uint16_t* __restrict__ scales,
                           int rows, int w_pitch) {
    const size_t row_bytes = W == DType::Q4_0 ? size_t(w_pitch) / 2 : size_t(w_pitch);
    const int chunks_per_row = out_pitch / kDequantizeChunk;
    const size_t chunk = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (chunk >= size_t(rows) * chunks_per_row) return;
    const int row = int(chunk / chunks_per_row);
    const int column = int(chunk % chunks_per_row) * kDequantizeChunk;
    const uint16_t scale =
        scales[size_t(row) * (w_pitch / kQuantizedBlock) + column / kQuantizedBlock];
    *reinterpret_cast<uint4*>(out + size_t(row) * out_pitch + column) =
        dequantize_eight<W>(values + size_t(row) * row_bytes, column, scale);
}

inline dim3 dequantize_rows_grid(int rows, int out_pitch) {
    const size_t chunks = size_t(rows) * (out_pitch / kDequantizeChunk);
    return dim3(unsigned((chunks + kDequantizeThreads - 1) / kDequantizeThreads));
}

// out[r, c] = W[r, c] rounded to f16 (each weight computed in f32 first, as the embedding),
// W of block type D [rows, cols], out f16 [rows, cols] (cols, a multiple of 32, is its pitch).
// Launch: grid ceil(rows * cols / 32 / 256), block 256; each thread writes the 32 values of
// one unit as four 16-byte stores.
template <DType D>
__global__ void __launch_bounds__(kBlockRowsThreads)
    dequantize_block_rows_kernel(uint16_t* __restrict__ out, const void* __restrict__ weights,
                                 int rows, int cols) {
    const int units_per_row = cols / kUnitWeights;
    const size_t index = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (index >= size_t(rows) * units_per_row) return;
    const int row = int(index / units_per_row), unit = int(index % units_per_row);
    const WeightUnit w = decode_unit<D>(load_unit<D>(block_row<D>(weights, row, cols), unit), unit);
#pragma unroll
    for (int g = 0; g < 2; ++g) {
        uint32_t pairs[kGroupWeights / 2];
#pragma unroll
        for (int i = 0; i < kGroupWeights / 2; ++i) {
            pairs[i] = uint32_t(__half_as_ushort(__float2half_rn(unit_weight<D>(w, g, 2 * i)))) |
                       uint32_t(__half_as_ushort(__float2half_rn(unit_weight<D>(w, g, 2 * i + 1))))
                           << 16;
        }
        uint4* target = reinterpret_cast<uint4*>(out + size_t(row) * cols + w.column[g]);
        target[0] = make_uint4(pairs[0], pairs[1], pairs[2], pairs[3]);
        target[1] = make_uint4(pairs[4], pairs[5], pairs[6], pairs[7]);
    }
}

inline dim3 dequantize_block_rows_grid(int rows, int cols) {
    const size_t units = size_t(rows) * (cols / kUnitWeights);
    return dim3(unsigned((units + kBlockRowsThreads - 1) / kBlockRowsThreads));
}

// The row pitch of the f16 matrix a Q8/Q4 matrix of `cols` columns dequantizes to.
inline int dequantized_pitch(int cols) { return padded_cols(cols, DType::F16); }

#ifdef BARELLM_LAUNCH_FUNCTIONS

namespace {

void launch_dequantize_block_rows(uint16_t* out, const DeviceMatrix& w, cudaStream_t stream) {
    check_block_matrix(w, "dequantize_to_f16");
    if (w.rows == 0) return;
    with_block_dtype(w.dtype, [&](auto dtype) {
        launch_kernel(dequantize_block_rows_kernel<decltype(dtype)::value>,
                      dequantize_block_rows_grid(w.rows, w.cols), kBlockRowsThreads, 0, stream, out,
                      w.data, w.rows, w.cols);
    });
    CUDA_CHECK_LAUNCH("dequantize_block_rows_kernel");
}

}  // namespace

size_t dequantized_bytes(int rows, int cols) {
    return size_t(rows) * dequantized_pitch(cols) * sizeof(uint16_t);
}

DeviceMatrix dequantize_to_f16(const DeviceMatrix& w, void* f16, cudaStream_t stream) {
    const bool blocks = is_block_type(w.dtype);
    if (!blocks && (!is_quantized(w.dtype) || w.scales == nullptr))
        throw Error("dequantize_to_f16: not a Q8/Q4 device matrix with scales, nor a block type");
    if (reinterpret_cast<uintptr_t>(f16) % 16 != 0)
        throw Error("dequantize_to_f16: the f16 rows must be 16-byte aligned");
    DeviceMatrix out;
    out.data = f16;
    out.dtype = DType::F16;
    out.rows = w.rows;
    out.cols = w.cols;
    out.pitch = dequantized_pitch(w.cols);
    if (w.rows == 0) return out;
    if (blocks) {  // whole blocks: cols, a multiple of 32, is the f16 pitch
        launch_dequantize_block_rows(static_cast<uint16_t*>(f16), w, stream);
        return out;
    }
    const dim3 grid = dequantize_rows_grid(w.rows, out.pitch);
    const auto launch = [&](auto kernel) {
        launch_kernel(kernel, grid, kDequantizeThreads, 0, stream, static_cast<uint16_t*>(f16),
                      out.pitch, static_cast<const uint8_t*>(w.data), w.scales, w.rows, w.pitch);
    };
    if (w.dtype == DType::Q8_0)
        launch(dequantize_rows_kernel<DType::Q8_0>);
    else
        launch(dequantize_rows_kernel<DType::Q4_0>);
    CUDA_CHECK_LAUNCH("dequantize_rows_kernel");
    return out;
}

#endif  // BARELLM_LAUNCH_FUNCTIONS

}  // namespace barellm::cuda
