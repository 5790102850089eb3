// The one translation unit holding device code: every kernel of the CUDA backend, with its
// launch function (declared in kernels.h). Keeping device code in one file keeps the build
// fast when nvcc compiles it for several GPU architectures.
#include <cstdlib>  // std::getenv
#include <string>

#include "attention.cuh"
#include "attention_paged.cuh"
#include "attention_prefill.cuh"
#include "attention_simple.cuh"
#include "elementwise_simple.cuh"
#include "embedding.cuh"
#include "gemm.cuh"
#include "matvec.cuh"
#include "matvec_blocks.cuh"
#include "matvec_quantized.cuh"
#include "matvec_rows.cuh"
#include "matvec_simple.cuh"
#include "moe.cuh"
#include "post_norm.cuh"
#include "prefill.cuh"
#include "rope.cuh"
#include "softcap.cuh"

namespace barellm::cuda {

cudaError_t kernel_image_status() {
    cudaFuncAttributes attributes;
    const cudaError_t status = cudaFuncGetAttributes(
        &attributes, reinterpret_cast<const void*>(embedding_kernel<DType::F32>));
    if (status != cudaSuccess) cudaGetLastError();  // clear it: the caller reports it
    return status;
}

bool dependent_launch_enabled() {
    constexpr int kFirstCapability = 90;  // griddepcontrol: sm_90 (Hopper) and later
    static const bool enabled = [] {
        const char* variable = std::getenv("BARELLM_CUDA_PDL");
        const std::string setting = variable != nullptr ? variable : "0";
        if (setting != "0" && setting != "1")
            throw Error("BARELLM_CUDA_PDL is '" + setting + "': it takes 0 or 1");
        if (setting == "0" || current_device().compute_capability < kFirstCapability) return false;
        // Every kernel is in this translation unit, built for the same architectures: one
        // that finishes a prologue answers for all.
        cudaFuncAttributes attributes;
        CUDA_CHECK(cudaFuncGetAttributes(
            &attributes, reinterpret_cast<const void*>(matvec_kernel<DType::F16, false>)));
        return attributes.ptxVersion >= kFirstCapability;
    }();
    return enabled;
}

}  // namespace barellm::cuda
