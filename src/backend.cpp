#include "backend.h"

#include "error.h"

namespace barellm {

std::unique_ptr<Backend> make_backend(const Model& model, const BackendOptions& options) {
    if (options.device == Device::Cpu) return make_cpu_backend(model, options);
#ifdef BARELLM_CUDA
    std::string reason;
    if (!cuda_device_available(&reason)) throw Error("--device cuda: " + reason);
    return make_cuda_backend(model, options);
#else
    throw Error("--device cuda: this barellm was built without CUDA (nvcc was not found)");
#endif
}

}  // namespace barellm
