// Which SIMD path this CPU can run, asked of the CPU itself (CPUID) at start-up.
#include <string>

#include "cpu/kernels.h"

namespace barellm::cpu {

SimdLevel detect_simd_level(std::string* missing) {
    __builtin_cpu_init();
    std::string lacking;
    if (!__builtin_cpu_supports("avx2")) lacking += " avx2";
    if (!__builtin_cpu_supports("fma")) lacking += " fma";
    // GCC's __builtin_cpu_supports has no "f16c"; every AVX2 CPU made has F16C,
    // and the check below keeps us honest on emulators that drop it.
    unsigned eax, ebx, ecx, edx;
    __asm__("cpuid" : "=a"(eax), "=b"(ebx), "=c"(ecx), "=d"(edx) : "a"(1), "c"(0));
    constexpr unsigned kF16cBit = 1u << 29;
    if (!(ecx & kF16cBit)) lacking += " f16c";
    if (missing) *missing = lacking;
    return lacking.empty() ? SimdLevel::Avx2 : SimdLevel::Scalar;
}

}  // namespace barellm::cpu
