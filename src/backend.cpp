// The backend chosen by --device, and the token/position checks every backend runs first.
#include "backend.h"

#include "error.h"

namespace barellm {

void check_tokens(const Config& config, const int* tokens, int count, int first_pos, int context) {
    for (int i = 0; i < count; ++i)
        if (tokens[i] < 0 || tokens[i] >= config.vocab_size)
            throw Error("token id " + std::to_string(tokens[i]) + " is outside the vocabulary");
    if (first_pos < 0 || count < 1 || first_pos + count > context)
        throw Error("positions " + std::to_string(first_pos) + ".." +
                    std::to_string(first_pos + count - 1) + " are outside the context of " +
                    std::to_string(context));
}

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
