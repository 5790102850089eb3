// The gated feed-forward's activations in double, for the emulated kernel tests: what
// gated_value (kernels/common.cuh) computes in f32, SwiGLU's silu and GeGLU's GELU with the
// tanh approximation, from their textbook formulas, and gpt-oss's clamped SwiGLU.
#pragma once
#include <algorithm>
#include <cmath>

#include "weights/config.h"  // Activation

namespace barellm::test {

// The fused kernels' activations; the elementwise kernels take SwigluOai too.
constexpr Activation kActivations[] = {Activation::Silu, Activation::GeluTanh};
constexpr Activation kElementwiseActivations[] = {Activation::Silu, Activation::GeluTanh,
                                                  Activation::SwigluOai};
// SwigluOai's limit in the tests: below the magnitudes of their gates and ups, so that both
// clamps act.
constexpr double kTestSwigluLimit = 0.75;

inline const char* activation_name(Activation activation) {
    return activation == Activation::Silu       ? "silu"
           : activation == Activation::GeluTanh ? "gelu_tanh"
                                                : "swiglu_oai";
}

// act(g): silu(g) = g / (1 + e^-g); gelu_tanh(g) = g / 2 * (1 + tanh(sqrt(2/pi) (g + 0.044715
// g³))).
inline double activation_reference(Activation activation, double g) {
    if (activation == Activation::Silu) return g / (1.0 + std::exp(-g));
    const double sqrt_2_over_pi = std::sqrt(2.0 / M_PI);
    return 0.5 * g * (1.0 + std::tanh(sqrt_2_over_pi * (g + 0.044715 * g * g * g)));
}

// act(g) * u of any activation: SwigluOai's, with g' = min(g, limit) and u' = clamp(u,
// -limit, limit), is g' / (1 + e^(-1.702 g')) * (u' + 1); the others act(g) * u.
inline double gated_reference(Activation activation, double g, double u, double limit) {
    if (activation != Activation::SwigluOai) return activation_reference(activation, g) * u;
    const double clamped_g = std::min(g, limit);
    const double clamped_u = std::min(std::max(u, -limit), limit);
    return clamped_g / (1.0 + std::exp(-1.702 * clamped_g)) * (clamped_u + 1.0);
}

// A bound on |act'(g)| over all g: silu's slope stays below 1.1, gelu_tanh's below 1.13.
constexpr double kActivationSlope = 1.13;

}  // namespace barellm::test
