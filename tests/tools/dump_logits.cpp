// Test tool: runs token ids through a backend one position at a time and
// writes the logits of every position as raw little-endian float32 [ids, vocab].
//   dump_logits MODEL OUT_FILE ID [ID ...] [--kv f16|f32] [--simd scalar|avx2|avx512]
//               [--prefill] [--device cpu|cuda]
//   dump_logits --check-cuda
// --simd runs the CPU backend at that level, or at a lower one the CPU has (default: the
// best; the AVX-512 matvecs read an f16-rounded input, the AVX2 ones keep it f32).
// --prefill runs all ids as one batch (the prefill GEMM path) instead of one by one.
// --device picks the backend (default cpu). --check-cuda exits 0 when a usable CUDA GPU
// is present, else prints why not and exits 1 (tests skip on it).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "backend.h"
#include "cpu/kernels.h"
#include "util/error.h"

using namespace barellm;

int main(int argc, char** argv) {
    try {
        if (argc == 2 && std::strcmp(argv[1], "--check-cuda") == 0) {
#ifdef BARELLM_CUDA
            std::string reason;
            if (cuda_device_available(&reason)) return 0;
            std::printf("%s\n", reason.c_str());
#else
            std::printf("this build has no CUDA backend (nvcc was not found, or CUDA=0)\n");
#endif
            return 1;
        }
        if (argc < 4)
            throw Error(
                "usage: dump_logits MODEL OUT_FILE ID [ID ...] [--kv f16|f32] "
                "[--simd scalar|avx2|avx512] [--prefill] [--device cpu|cuda]");
        std::vector<int> ids;
        KvType kv_type = KvType::F16;
        Device device = Device::Cpu;
        bool prefill = false;
        for (int i = 3; i < argc; ++i) {
            if (std::strcmp(argv[i], "--kv") == 0 && i + 1 < argc) {
                kv_type = std::strcmp(argv[++i], "f32") == 0 ? KvType::F32 : KvType::F16;
            } else if (std::strcmp(argv[i], "--device") == 0 && i + 1 < argc) {
                device = std::strcmp(argv[++i], "cuda") == 0 ? Device::Cuda : Device::Cpu;
            } else if (std::strcmp(argv[i], "--prefill") == 0) {
                prefill = true;
            } else if (std::strcmp(argv[i], "--simd") == 0 && i + 1 < argc) {
                cpu::SimdLevel level;
                if (!cpu::parse_simd_level(argv[++i], &level))
                    throw Error(std::string("--simd: unknown level ") + argv[i]);
                cpu::set_simd_level(std::min(level, cpu::detect_simd_level()));
            } else {
                ids.push_back(std::stoi(argv[i]));
            }
        }
        const Model model = Model::load(argv[1]);
        BackendOptions options{int(ids.size()), kv_type, device};
        options.all_logits = prefill;
        auto backend = make_backend(model, options);
        FILE* out = std::fopen(argv[2], "wb");
        if (!out) throw Error(std::string(argv[2]) + ": cannot write");
        const size_t vocab = model.config.vocab_size;
        if (prefill) {
            const float* logits = backend->prefill(ids.data(), int(ids.size()), 0, true);
            std::fwrite(logits, sizeof(float), ids.size() * vocab, out);
        } else {
            for (size_t pos = 0; pos < ids.size(); ++pos)
                std::fwrite(backend->forward(ids[pos], int(pos)), sizeof(float), vocab, out);
        }
        std::fclose(out);
        return 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "dump_logits: %s\n", e.what());
        return 1;
    }
}
