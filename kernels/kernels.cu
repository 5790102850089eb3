// The one translation unit holding device code: every kernel of the CUDA backend, with its
// launch function (declared in kernels.h). Keeping device code in one file keeps the build
// fast when nvcc compiles it for several GPU architectures.
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

namespace barellm::cuda {

cudaError_t kernel_image_status() {
    cudaFuncAttributes attributes;
    const cudaError_t status = cudaFuncGetAttributes(
        &attributes, reinterpret_cast<const void*>(embedding_kernel<DType::F32>));
    if (status != cudaSuccess) cudaGetLastError();  // clear it: the caller reports it
    return status;
}

}  // namespace barellm::cuda
