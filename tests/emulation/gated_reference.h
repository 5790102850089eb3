// The gated feed-forward's activations in double, for the emulated kernel tests: what
// gated_value (kernels/common.cuh) computes in f32, SwiGLU's silu and GeGLU's GELU with the
// tanh approximation, from their textbook formulas.
#pragma once
#include <cmath>

#include "weights/config.h"  // Activation

namespace barellm::test {

constexpr Activation kActivations[] = {Activation::Silu, Activation::GeluTanh};

inline const char* activation_name(Activation activation) {
    return activation == Activation::Silu ? "silu" : "gelu_tanh";
}

// act(g): silu(g) = g / (1 + e^-g); gelu_tanh(g) = g / 2 * (1 + tanh(sqrt(2/pi) (g + 0.044715
// g³))).
inline double activation_reference(Activation activation, double g) {
    if (activation == Activation::Silu) return g / (1.0 + std::exp(-g));
    const double sqrt_2_over_pi = std::sqrt(2.0 / M_PI);
    return 0.5 * g * (1.0 + std::tanh(sqrt_2_over_pi * (g + 0.044715 * g * g * g)));
}

// A bound on |act'(g)| over all g: silu's slope stays below 1.1, gelu_tanh's below 1.13.
constexpr double kActivationSlope = 1.13;

}  // namespace barellm::test
