// What the emulated GEMM tests (test_emulated_gemm.cpp, test_emulated_gemm_quantized.cpp)
// share: a case's sizes and switches, and its bias and output, checked after the launch
// against a double-precision reference from the decoded inputs.
#pragma once
#include <catch2/catch.hpp>
#include <cmath>
#include <random>
#include <vector>

#include "emulated_inputs.h"

namespace barellm::test {

struct GemmCase {
    int tokens, rows, cols;
    bool bias, accumulate;
};

constexpr int kOutPitchExtra = 5;  // output columns past the rows, which must stay untouched
constexpr float kUntouched = 12345.0f;

// The bias [rows] of a case and its output [tokens, out_pitch] (out_pitch = rows +
// kOutPitchExtra): random initial values in the rows' columns when the case accumulates,
// kUntouched elsewhere. Drawn from rng after the operands.
struct GemmOutput {
    int out_pitch;
    std::vector<float> bias, initial, out;

    GemmOutput(const GemmCase& c, std::mt19937& rng)
        : out_pitch(c.rows + kOutPitchExtra),
          bias(random_floats(size_t(c.rows), rng)),
          initial(random_floats(size_t(c.tokens) * out_pitch, rng)),
          out(initial.size(), kUntouched) {
        if (c.accumulate)
            for (int t = 0; t < c.tokens; ++t)
                for (int r = 0; r < c.rows; ++r)
                    out[size_t(t) * out_pitch + r] = initial[size_t(t) * out_pitch + r];
    }

    const float* bias_or_null(const GemmCase& c) const { return c.bias ? bias.data() : nullptr; }

    // out[t, r] against sum_k in(t, k) * w(r, k) (+ bias, + initial) in double, and the
    // padding columns against kUntouched. Weights: anything with at(r, k), the decoded value.
    template <typename Weights>
    void check(const GemmCase& c, const Weights& w, const PaddedRows& in) const {
        int wrong = 0;
        for (int t = 0; t < c.tokens; ++t) {
            for (int r = 0; r < c.rows; ++r) {
                double sum = 0, magnitude = 0;
                for (int k = 0; k < c.cols; ++k) {
                    sum += in.at(t, k) * w.at(r, k);
                    magnitude += std::fabs(in.at(t, k) * w.at(r, k));
                }
                if (c.bias) sum += bias[r];
                if (c.accumulate) sum += initial[size_t(t) * out_pitch + r];
                // f32 accumulation of exact products: a few ulps of the magnitude per addition.
                const double tolerance =
                    1e-6 * (magnitude + std::fabs(sum) + 1.0) * std::sqrt(c.cols);
                const float got = out[size_t(t) * out_pitch + r];
                if (!(std::fabs(got - sum) <= tolerance) && ++wrong <= 5) {
                    INFO("token " << t << " row " << r << ": got " << got << ", want " << sum);
                    CHECK(false);
                }
            }
            for (int r = c.rows; r < out_pitch; ++r)
                if (out[size_t(t) * out_pitch + r] != kUntouched && ++wrong <= 5) {
                    INFO("token " << t << " padding column " << r << " was written");
                    CHECK(false);
                }
        }
        CHECK(wrong == 0);
    }
};

}  // namespace barellm::test
