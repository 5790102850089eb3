// Scalar dequantization of the block types (weight_blocks.h), written to read like
// docs/FORMAT.md's description of each block.
#include "weights/weight_blocks.h"

#include <cstring>

#include "weights/half.h"
#include "weights/iq_grids.h"

namespace barellm {

bool is_block_type(DType dtype) { return block_weights(dtype) != 0; }

namespace {

// The 4-bit value of weight j (0..31) of a 32-weight block's 16 bytes.
int nibble(const uint8_t* qs, int j) { return j < 16 ? qs[j] & 15 : qs[j - 16] >> 4; }

// The fifth bit of weight j of a Q5_0/Q5_1 block.
int fifth_bit(const uint8_t* qh, int j) {
    uint32_t bits;
    std::memcpy(&bits, qh, sizeof bits);
    return (bits >> j) & 1;
}

void dequantize(const BlockQ4_1& b, float* out) {
    const float d = half_to_float(b.d), m = half_to_float(b.m);
    for (int j = 0; j < kSmallBlock; ++j) out[j] = d * nibble(b.qs, j) + m;
}

void dequantize(const BlockQ5_0& b, float* out) {
    const float d = half_to_float(b.d);
    for (int j = 0; j < kSmallBlock; ++j)
        out[j] = d * ((nibble(b.qs, j) | fifth_bit(b.qh, j) << 4) - 16);
}

void dequantize(const BlockQ5_1& b, float* out) {
    const float d = half_to_float(b.d), m = half_to_float(b.m);
    for (int j = 0; j < kSmallBlock; ++j)
        out[j] = d * (nibble(b.qs, j) | fifth_bit(b.qh, j) << 4) + m;
}

void dequantize(const BlockQ2_K& b, float* out) {
    const float d = half_to_float(b.d), dmin = half_to_float(b.dmin);
    for (int i = 0; i < kSuperBlock / kQ6SubBlock; ++i) {
        const float scale = d * (b.scales[i] & 15), min = dmin * (b.scales[i] >> 4);
        for (int l = kQ6SubBlock * i; l < kQ6SubBlock * (i + 1); ++l)
            out[l] = scale * q2k_value(b, l) - min;
    }
}

void dequantize(const BlockQ3_K& b, float* out) {
    const float d = half_to_float(b.d);
    for (int i = 0; i < kSuperBlock / kQ6SubBlock; ++i) {
        const float scale = d * (q3k_scale(b, i) - kQ3KScaleBias);
        for (int l = kQ6SubBlock * i; l < kQ6SubBlock * (i + 1); ++l)
            out[l] = scale * (q3k_value(b, l) - kQ3KLevelOffset);
    }
}

// Q4_K and Q5_K: sub-block j's weights are d·sc·q − dmin·m; `qh` null for Q4_K.
void dequantize_k(uint16_t d_bits, uint16_t dmin_bits, const uint8_t* scales, const uint8_t* qs,
                  const uint8_t* qh, float* out) {
    const float d = half_to_float(d_bits), dmin = half_to_float(dmin_bits);
    for (int j = 0; j < kSuperBlock / kSubBlock; ++j) {
        int scale, min;
        k_scale_min(scales, j, &scale, &min);
        const int chunk = j / 2, shift = 4 * (j % 2);
        for (int l = 0; l < kSubBlock; ++l) {
            int q = (qs[kSubBlock * chunk + l] >> shift) & 15;
            if (qh) q |= ((qh[l] >> j) & 1) << 4;
            out[kSubBlock * j + l] = d * scale * q - dmin * min;
        }
    }
}

void dequantize(const BlockQ4_K& b, float* out) {
    dequantize_k(b.d, b.dmin, b.scales, b.qs, nullptr, out);
}

void dequantize(const BlockQ5_K& b, float* out) {
    dequantize_k(b.d, b.dmin, b.scales, b.qs, b.qh, out);
}

void dequantize(const BlockQ6_K& b, float* out) {
    const float d = half_to_float(b.d);
    for (int i = 0; i < kSuperBlock; ++i)
        out[i] = d * b.scales[i / kQ6SubBlock] * (q6k_value(b, i) - kQ6KLevelOffset);
}

void dequantize(const BlockIQ4_XS& b, float* out) {
    const float d = half_to_float(b.d);
    for (int j = 0; j < kSuperBlock / kSubBlock; ++j) {
        const float scale = d * iq4_xs_scale(b, j);
        const uint8_t* qs = b.qs + 16 * j;
        for (int l = 0; l < 16; ++l) {
            out[kSubBlock * j + l] = scale * kIq4Values[qs[l] & 15];
            out[kSubBlock * j + 16 + l] = scale * kIq4Values[qs[l] >> 4];
        }
    }
}

void dequantize(const BlockIQ4_NL& b, float* out) {
    const float d = half_to_float(b.d);
    for (int j = 0; j < kSmallBlock; ++j) out[j] = d * kIq4Values[nibble(b.qs, j)];
}

void dequantize(const BlockMXFP4& b, float* out) {
    const float scale = mxfp4_scale(b.e);
    for (int j = 0; j < kSmallBlock; ++j) out[j] = scale * kMxfp4Values[nibble(b.qs, j)];
}

// Byte i of a grid point.
int grid_value(uint64_t point, int i) { return int((point >> (8 * i)) & 0xff); }

// Column group k (8 columns) of an IQ2 type: its grid point times its signs, times `scale`.
void iq2_group(float* out, float scale, uint64_t point, uint8_t signs) {
    for (int i = 0; i < kIqGridGroup; ++i)
        out[i] = scale * grid_value(point, i) * ((signs >> i) & 1 ? -1 : 1);
}

void dequantize(const BlockIQ2_XXS& b, float* out) {
    const float d = half_to_float(b.d);
    for (int j = 0; j < kSuperBlock / kSubBlock; ++j) {
        uint32_t indices, signs_scale;
        std::memcpy(&indices, b.qs + 4 * j, 4);
        std::memcpy(&signs_scale, b.qs + 4 * j + 2, 4);
        const float scale = d * float(2 * (signs_scale >> 28) + 1) / 8;
        for (int k = 0; k < 4; ++k)
            iq2_group(out + kSubBlock * j + kIqGridGroup * k, scale,
                      kIq2XxsGrid[(indices >> (8 * k)) & 0xff],
                      iq_signs_of_seven(signs_scale >> (7 * k)));
    }
}

// IQ2_XS's and IQ2_S's scale of sub-block i (16 columns).
float iq2_sub_block_scale(float d, const uint8_t* scales, int i) {
    return d * float(2 * ((scales[i / 2] >> (4 * (i % 2))) & 15) + 1) / 8;
}

void dequantize(const BlockIQ2_XS& b, float* out) {
    const float d = half_to_float(b.d);
    for (int k = 0; k < kSuperBlock / kIqGridGroup; ++k)
        iq2_group(out + kIqGridGroup * k, iq2_sub_block_scale(d, b.scales, k / 2),
                  kIq2XsGrid[b.qs[k] & 511], iq_signs_of_seven(b.qs[k] >> 9));
}

void dequantize(const BlockIQ2_S& b, float* out) {
    const float d = half_to_float(b.d);
    for (int k = 0; k < kSuperBlock / kIqGridGroup; ++k) {
        const int index = b.qs[k] | ((b.qh[k / 4] >> (2 * (k % 4))) & 3) << 8;
        iq2_group(out + kIqGridGroup * k, iq2_sub_block_scale(d, b.scales, k / 2), kIq2SGrid[index],
                  b.signs[k]);
    }
}

// Four columns of an IQ3 type: a grid point times the signs' bits `first`..`first` + 3.
void iq3_quad(float* out, float scale, uint32_t point, uint8_t signs, int first) {
    for (int i = 0; i < kIq3GridGroup; ++i)
        out[i] = scale * grid_value(point, i) * ((signs >> (first + i)) & 1 ? -1 : 1);
}

void dequantize(const BlockIQ3_XXS& b, float* out) {
    const float d = half_to_float(b.d);
    for (int j = 0; j < kSuperBlock / kSubBlock; ++j) {
        uint32_t signs_scale;
        std::memcpy(&signs_scale, b.scales_signs + 4 * j, 4);
        const float scale = d * float(2 * (signs_scale >> 28) + 1) / 4;
        for (int q = 0; q < kSubBlock / kIq3GridGroup; ++q)
            iq3_quad(out + kSubBlock * j + kIq3GridGroup * q, scale,
                     kIq3XxsGrid[b.qs[kSubBlock / kIq3GridGroup * j + q]],
                     iq_signs_of_seven(signs_scale >> (7 * (q / 2))), kIq3GridGroup * (q % 2));
    }
}

void dequantize(const BlockIQ3_S& b, float* out) {
    const float d = half_to_float(b.d);
    for (int q = 0; q < kSuperBlock / kIq3GridGroup; ++q) {
        const int j = q / (kSubBlock / kIq3GridGroup);
        const float scale = d * float(2 * ((b.scales[j / 2] >> (4 * (j % 2))) & 15) + 1);
        const int index = b.qs[q] | ((b.qh[q / 8] >> (q % 8)) & 1) << 8;
        iq3_quad(out + kIq3GridGroup * q, scale, kIq3SGrid[index], b.signs[q / 2],
                 kIq3GridGroup * (q % 2));
    }
}

// Column group k of an IQ1 type: (level − 1 + shift/8) times `scale`.
void iq1_group(float* out, float scale, int index, bool negative_shift) {
    const float shift = float(negative_shift ? -kIq1ShiftEighths : kIq1ShiftEighths) / 8;
    for (int i = 0; i < kIqGridGroup; ++i)
        out[i] = scale * (float(grid_value(kIq1Grid[index], i) - 1) + shift);
}

void dequantize(const BlockIQ1_S& b, float* out) {
    const float d = half_to_float(b.d);
    for (int k = 0; k < kSuperBlock / kIqGridGroup; ++k) {
        const int high = b.qh[k / 4];
        const float scale = d * float(2 * ((high >> 12) & 7) + 1);
        iq1_group(out + kIqGridGroup * k, scale, b.qs[k] | ((high >> (3 * (k % 4))) & 7) << 8,
                  (high >> 15) & 1);
    }
}

void dequantize(const BlockIQ1_M& b, float* out) {
    const float d = half_to_float(iq1m_d(b));
    for (int k = 0; k < kSuperBlock / kIqGridGroup; ++k) {
        const int i = k / 2;  // sub-block of 16
        const float scale = d * float(2 * ((b.scales[i / 4] >> (3 * (i % 4))) & 7) + 1);
        const int nibble = (b.qh[k / 2] >> (4 * (k % 2))) & 15;
        iq1_group(out + kIqGridGroup * k, scale, b.qs[k] | (nibble & 7) << 8, nibble >> 3);
    }
}

void dequantize(const BlockTQ2_0& b, float* out) {
    const float d = half_to_float(b.d);
    for (int i = 0; i < kSuperBlock; ++i) out[i] = d * float(tq2_0_value(b, i) - kTernaryOffset);
}

void dequantize(const BlockTQ1_0& b, float* out) {
    const float d = half_to_float(b.d);
    for (int i = 0; i < kSuperBlock; ++i) out[i] = d * float(tq1_0_value(b, i) - kTernaryOffset);
}

// Each block of a row, copied out first (a row's blocks are only 2-byte aligned).
template <typename Block>
void dequantize_blocks(const void* row, float* out, int blocks, int weights_per_block) {
    for (int b = 0; b < blocks; ++b) {
        Block block;
        std::memcpy(&block, static_cast<const uint8_t*>(row) + size_t(b) * sizeof(Block),
                    sizeof(Block));
        dequantize(block, out + size_t(b) * weights_per_block);
    }
}

}  // namespace

void dequantize_row(DType dtype, const void* row, float* out, int cols) {
    const int blocks = cols / block_weights(dtype), n = block_weights(dtype);
    switch (dtype) {
        case DType::Q4_1:
            return dequantize_blocks<BlockQ4_1>(row, out, blocks, n);
        case DType::Q5_0:
            return dequantize_blocks<BlockQ5_0>(row, out, blocks, n);
        case DType::Q5_1:
            return dequantize_blocks<BlockQ5_1>(row, out, blocks, n);
        case DType::Q2_K:
            return dequantize_blocks<BlockQ2_K>(row, out, blocks, n);
        case DType::Q3_K:
            return dequantize_blocks<BlockQ3_K>(row, out, blocks, n);
        case DType::Q4_K:
            return dequantize_blocks<BlockQ4_K>(row, out, blocks, n);
        case DType::Q5_K:
            return dequantize_blocks<BlockQ5_K>(row, out, blocks, n);
        case DType::Q6_K:
            return dequantize_blocks<BlockQ6_K>(row, out, blocks, n);
        case DType::IQ4_XS:
            return dequantize_blocks<BlockIQ4_XS>(row, out, blocks, n);
        case DType::IQ4_NL:
            return dequantize_blocks<BlockIQ4_NL>(row, out, blocks, n);
        case DType::IQ2_XXS:
            return dequantize_blocks<BlockIQ2_XXS>(row, out, blocks, n);
        case DType::IQ2_XS:
            return dequantize_blocks<BlockIQ2_XS>(row, out, blocks, n);
        case DType::IQ2_S:
            return dequantize_blocks<BlockIQ2_S>(row, out, blocks, n);
        case DType::IQ3_XXS:
            return dequantize_blocks<BlockIQ3_XXS>(row, out, blocks, n);
        case DType::IQ3_S:
            return dequantize_blocks<BlockIQ3_S>(row, out, blocks, n);
        case DType::IQ1_S:
            return dequantize_blocks<BlockIQ1_S>(row, out, blocks, n);
        case DType::IQ1_M:
            return dequantize_blocks<BlockIQ1_M>(row, out, blocks, n);
        case DType::MXFP4:
            return dequantize_blocks<BlockMXFP4>(row, out, blocks, n);
        case DType::TQ1_0:
            return dequantize_blocks<BlockTQ1_0>(row, out, blocks, n);
        case DType::TQ2_0:
            return dequantize_blocks<BlockTQ2_0>(row, out, blocks, n);
        default:
            return;
    }
}

}  // namespace barellm
