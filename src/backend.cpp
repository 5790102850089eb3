// The backend chosen by --device, and the token/position checks every backend runs first.
#include "backend.h"

#include "util/error.h"

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

namespace {

// --device auto: the CUDA backend when it can be had, else the CPU backend.
std::unique_ptr<Backend> make_auto_backend(const Model& model, BackendOptions options,
                                           std::string* choice) {
    std::string reason;
#ifdef BARELLM_CUDA
    if (cuda_device_available(&reason)) {
        options.device = Device::Cuda;
        try {
            auto backend = make_cuda_backend(model, options);
            if (choice) *choice = "--device auto: running on the GPU (cuda)";
            return backend;
        } catch (const Error& e) {
            reason = std::string("the GPU cannot run it: ") + e.what();
        }
    }
#else
    reason = "this barellm was built without CUDA";
#endif
    options.device = Device::Cpu;
    auto backend = make_cpu_backend(model, options);
    if (choice) *choice = "--device auto: running on the CPU (" + reason + ")";
    return backend;
}

}  // namespace

std::unique_ptr<Backend> make_backend(const Model& model, const BackendOptions& options,
                                      std::string* choice) {
    if (options.device == Device::Auto) return make_auto_backend(model, options, choice);
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
