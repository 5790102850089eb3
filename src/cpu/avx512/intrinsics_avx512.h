// The AVX-512 intrinsics for the *_avx512*.cpp files: the compiler's, or, in the unit
// tests' second build of those files (BARELLM_SIMDE), SIMDe's portable ones.
#pragma once

#ifdef BARELLM_SIMDE
#include "simde_avx512.h"  // tests/simde/
#else
// GCC 12's AVX-512 intrinsics start some results from a self-initialized "undefined"
// register (e.g. in _mm512_cvtph_ps), which -Wuninitialized reports at every use.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#ifndef __clang__  // GCC's name only
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#pragma GCC diagnostic pop
#endif
