// The AVX2 and AVX-VNNI intrinsics for the headers the *_avx2.cpp and *_avxvnni.cpp files share:
// the compiler's, or, in the unit tests' SIMDe build of the *_avxvnni.cpp files
// (BARELLM_SIMDE), SIMDe's portable ones.
#pragma once

#ifdef BARELLM_SIMDE
#include "simde_avx512.h"  // tests/simde/: SIMDe's AVX2, and vpdpbusd
#else
#include <immintrin.h>
#endif
