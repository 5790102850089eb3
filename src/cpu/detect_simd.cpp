// Which SIMD path this CPU can run, asked of the CPU itself (CPUID) at start-up.
#include <string>

#include "cpu/kernels.h"

namespace barellm::cpu {

namespace {

// What CPUID answers for one leaf and subleaf.
struct CpuidRegisters {
    unsigned eax, ebx, ecx, edx;
};
CpuidRegisters cpuid(unsigned leaf, unsigned subleaf) {
    CpuidRegisters r;
    __asm__("cpuid" : "=a"(r.eax), "=b"(r.ebx), "=c"(r.ecx), "=d"(r.edx) : "a"(leaf), "c"(subleaf));
    return r;
}

// GCC's __builtin_cpu_supports has no "f16c"; every AVX2 CPU made has F16C, and this
// check keeps us honest on emulators that drop it.
bool cpu_has_f16c() {
    constexpr unsigned kF16cBit = 1u << 29;  // leaf 1, ecx
    return cpuid(1, 0).ecx & kF16cBit;
}

// AVX-VNNI (the VEX-encoded vpdpbusd of Intel client CPUs), asked of CPUID: clang's
// __builtin_cpu_supports (which the fuzz build uses) has no "avxvnni". The ymm registers it
// uses are the AVX2 path's, whose detection checks that the operating system saves them.
bool cpu_has_avx_vnni_bit() {
    constexpr unsigned kHighestLeafQuery = 0;  // leaf 0's eax: the highest leaf there is
    constexpr unsigned kFeatureLeaf = 7, kAvxVnniSubleaf = 1;
    constexpr unsigned kAvxVnniBit = 1u << 4;  // leaf 7, subleaf 1, eax
    return cpuid(kHighestLeafQuery, 0).eax >= kFeatureLeaf &&
           (cpuid(kFeatureLeaf, kAvxVnniSubleaf).eax & kAvxVnniBit);
}

// The AVX-512 subsets the AVX-512 kernels are compiled for (__builtin_cpu_supports also
// checks that the operating system saves the zmm registers).
bool cpu_has_avx512() {
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}

}  // namespace

SimdLevel detect_simd_level(std::string* missing) {
    __builtin_cpu_init();
    std::string lacking;
    if (!__builtin_cpu_supports("avx2")) lacking += " avx2";
    if (!__builtin_cpu_supports("fma")) lacking += " fma";
    if (!cpu_has_f16c()) lacking += " f16c";
    if (missing) *missing = lacking;
    if (!lacking.empty()) return SimdLevel::Scalar;
    return cpu_has_avx512() ? SimdLevel::Avx512 : SimdLevel::Avx2;
}

bool cpu_has_avx512_vnni() {
    __builtin_cpu_init();
    return cpu_has_avx512() && __builtin_cpu_supports("avx512vnni");
}

bool cpu_has_avx_vnni() {
    __builtin_cpu_init();
    return detect_simd_level() >= SimdLevel::Avx2 && cpu_has_avx_vnni_bit();
}

bool cpu_has_avx512_bf16() {
    __builtin_cpu_init();
    return cpu_has_avx512() && __builtin_cpu_supports("avx512bf16");
}

bool cpu_prefers_bf16_dot_products() { return cpu_has_avx512_bf16() && __builtin_cpu_is("amd"); }

bool cpu_prefetches_tiles_unaided() {
    __builtin_cpu_init();
    return __builtin_cpu_is("amd");
}

}  // namespace barellm::cpu
