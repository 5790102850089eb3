// The CPU backend's copy of the layer and output matrices on 2 MiB pages
// (cpu/resident_weights.h).
#include "cpu/resident_weights.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "cpu/kernels.h"
#include "util/error.h"
#include "util/memory.h"
#include "weights/safetensors.h"

namespace barellm::cpu {

namespace {

constexpr size_t kHugePage = size_t(2) << 20;  // bytes of one transparent huge page
constexpr size_t kAlignment = 64;              // bytes: each piece starts on a cache line

size_t aligned(size_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }

size_t values_bytes(const Matrix& w) { return size_t(w.rows) * w.row_bytes(); }
size_t scales_bytes(const Matrix& w) {
    return size_t(w.rows) * w.scale_count_per_row() * sizeof(uint16_t);
}

// The bytes one matrix takes in the copy.
size_t resident_bytes(const Matrix& w) {
    if (uses_row_tiles(w.dtype)) return aligned(row_tiles_bytes(w));
    return aligned(values_bytes(w)) + aligned(scales_bytes(w));
}

// `bytes` of memory on 2 MiB boundaries, advised to be backed by 2 MiB pages (advice only:
// where it is refused, 4 KiB pages back it).
AlignedBytes allocate_on_huge_pages(size_t bytes) {
    const size_t size = (bytes + kHugePage - 1) / kHugePage * kHugePage;
    require_memory(size, "the weights in memory");
    AlignedBytes memory(static_cast<uint8_t*>(std::aligned_alloc(kHugePage, size)));
    if (!memory)
        throw Error("out of memory for " + std::to_string(size) + " bytes of weights in memory");
    madvise(memory.get(), size, MADV_HUGEPAGE);
    return memory;
}

// Copies w to `at` (resident_bytes(w) bytes) and points it there. The file's pages of
// what was copied go back to the system.
void copy_matrix(Matrix* w, uint8_t* at, const SafetensorsFile* file) {
    const size_t values = values_bytes(*w), scales = scales_bytes(*w);
    const void* file_values = w->data;
    const uint16_t* file_scales = w->scales;
    if (uses_row_tiles(w->dtype)) {
        write_row_tiles(*w, at);
        w->row_tiles = at;  // the rows stay in the mapping, for the other paths
    } else {
        std::memcpy(at, w->data, values);
        w->data = at;
        if (scales) {
            uint8_t* scale_copy = at + aligned(values);
            std::memcpy(scale_copy, w->scales, scales);
            w->scales = reinterpret_cast<const uint16_t*>(scale_copy);
        }
    }
    if (file) {
        file->release_pages(file_values, values);
        if (scales) file->release_pages(file_scales, scales);
    }
}

}  // namespace

ResidentWeights resident_weights(const Model& model) {
    ResidentWeights resident{model.layers, model.output, nullptr};
    std::vector<Matrix*> matrices;
    for (LayerWeights& layer : resident.layers) {
        for (Matrix* w :
             {&layer.wq, &layer.wk, &layer.wv, &layer.wo, &layer.w1, &layer.w3, &layer.w2})
            if (w->data) matrices.push_back(w);  // a sparse layer has no w1, w3, w2
        for (std::vector<Matrix>* experts : {&layer.expert_w1, &layer.expert_w3, &layer.expert_w2})
            for (Matrix& w : *experts) matrices.push_back(&w);
    }
    matrices.push_back(&resident.output);
    std::vector<size_t> offsets;  // of each matrix in the copy
    size_t total = 0;
    for (const Matrix* w : matrices) {
        offsets.push_back(total);
        total += resident_bytes(*w);
    }
    resident.memory = allocate_on_huge_pages(total);
    // The threads copy a matrix each (the copy is bound by page faults and memory bandwidth).
#pragma omp parallel for schedule(dynamic)
    for (size_t i = 0; i < matrices.size(); ++i)
        copy_matrix(matrices[i], resident.memory.get() + offsets[i], model.file.get());
    return resident;
}

}  // namespace barellm::cpu
