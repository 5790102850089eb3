// model_copy_check SOURCE TARGET: converts SOURCE's weights in memory (src/weights/model_copy.h) to
// TARGET's weight dtype and compares every matrix, Q8 scale and norm byte for byte with
// TARGET (a file convert.py wrote from the same checkpoint). Prints one line; exit 0 when
// identical, 1 at the first difference.
#include <cstdio>
#include <cstring>
#include <string>

#include "util/error.h"
#include "weights/model_copy.h"

using namespace barellm;

namespace {

std::string compare_bytes(const void* a, const void* b, size_t bytes, const std::string& what) {
    if (std::memcmp(a, b, bytes) == 0) return "";
    const auto* x = static_cast<const uint8_t*>(a);
    const auto* y = static_cast<const uint8_t*>(b);
    size_t i = 0;
    while (x[i] == y[i]) ++i;
    return what + " differs at byte " + std::to_string(i);
}

std::string compare(const Matrix& copy, const Matrix& file, const std::string& name) {
    if (copy.dtype != file.dtype || copy.rows != file.rows || copy.cols != file.cols)
        return name + ": dtype or shape differs";
    const size_t values = size_t(copy.rows) * copy.cols * dtype_size(copy.dtype);
    std::string problem = compare_bytes(copy.data, file.data, values, name);
    if (problem.empty() && copy.dtype == DType::Q8_0)
        problem = compare_bytes(copy.scales, file.scales, size_t(copy.rows) * copy.q8_groups() * 2,
                                name + ".scale");
    return problem;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 3) {
        std::fprintf(stderr, "usage: model_copy_check SOURCE TARGET\n");
        return 2;
    }
    try {
        const Model source = Model::load(argv[1]);
        const Model target = Model::load(argv[2]);
        const auto copy = copy_model(source, target.token_embedding.dtype);
        const Model& m = copy->model;
        const int dim = m.config.dim;
        std::string problem = compare(m.token_embedding, target.token_embedding, "token_embedding");
        int matrices = 1;
        for (size_t l = 0; l < m.layers.size() && problem.empty(); ++l) {
            const LayerWeights& a = m.layers[l];
            const LayerWeights& b = target.layers[l];
            const std::string p = "layers." + std::to_string(l) + ".";
            const std::pair<const Matrix*, const Matrix*> pairs[] = {
                {&a.wq, &b.wq}, {&a.wk, &b.wk}, {&a.wv, &b.wv}, {&a.wo, &b.wo},
                {&a.w1, &b.w1}, {&a.w3, &b.w3}, {&a.w2, &b.w2}};
            const char* names[] = {"wq", "wk", "wv", "wo", "w1", "w3", "w2"};
            for (int i = 0; i < 7 && problem.empty(); ++i, ++matrices)
                problem = compare(*pairs[i].first, *pairs[i].second, p + names[i]);
            if (problem.empty())
                problem = compare_bytes(a.attn_norm, b.attn_norm, dim * 4, p + "attn_norm");
            if (problem.empty())
                problem = compare_bytes(a.ffn_norm, b.ffn_norm, dim * 4, p + "ffn_norm");
        }
        if (problem.empty())
            problem = compare_bytes(m.final_norm, target.final_norm, dim * 4, "final_norm");
        if (problem.empty() && target.output.data != target.token_embedding.data) {
            problem = compare(m.output, target.output, "output");
            ++matrices;
        }
        if (!problem.empty()) {
            std::printf("DIFFERENT: %s\n", problem.c_str());
            return 1;
        }
        std::printf("identical: %d matrices as %s\n", matrices, m.config.weight_dtype.c_str());
        return 0;
    } catch (const Error& e) {
        std::fprintf(stderr, "model_copy_check: %s\n", e.what());
        return 1;
    }
}
