// The CPU backend's copy of the layer and output matrices on 2 MiB pages
// (cpu/resident_weights.h).
#include "cpu/resident_weights.h"

#include <sys/mman.h>

#include <algorithm>
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

// Copies w to `at` (resident_bytes(w) bytes) and points it there, about `chunk_bytes` of the
// file at a time (whole tiles of 16 rows), handing the file's pages of each chunk back to the
// system before the next: at the peak a chunk is held twice, not the whole matrix (the largest,
// a tied model's embedding, is 1.2 GB in f16 at Gemma 2 2B's shape).
void copy_matrix(Matrix* w, uint8_t* at, const SafetensorsFile* file, size_t chunk_bytes) {
    const Matrix source = *w;
    const bool tiles = uses_row_tiles(source.dtype);
    const size_t scale_row_bytes = size_t(source.scale_count_per_row()) * sizeof(uint16_t);
    const size_t row_bytes = source.row_bytes() + scale_row_bytes;
    const size_t rows_in_chunk = std::min(chunk_bytes / row_bytes, size_t(source.rows));
    const int chunk_rows = std::max(kTileRows, int(rows_in_chunk) / kTileRows * kTileRows);
    uint8_t* scale_copy = at + aligned(values_bytes(source));
    int previous = 0;  // the first row of the chunk before
    for (int first = 0; first < source.rows; first += chunk_rows) {
        const Matrix part = matrix_rows(source, first, std::min(chunk_rows, source.rows - first));
        if (tiles) {
            write_row_tiles(part, at + size_t(first / kTileRows) * tile_bytes(source));
        } else {
            std::memcpy(at + size_t(first) * source.row_bytes(), part.data, values_bytes(part));
            if (source.scales)
                std::memcpy(scale_copy + first * scale_row_bytes, part.scales, scales_bytes(part));
        }
        // This chunk and the one before: release_pages keeps a page the range covers only in
        // part, so the page two chunks share goes back with the second.
        if (file) {
            const size_t rows = size_t(first - previous) + part.rows;
            file->release_pages(source.row_data(previous), rows * source.row_bytes());
            if (source.scales)
                file->release_pages(source.scales + size_t(previous) * source.scale_count_per_row(),
                                    rows * scale_row_bytes);
        }
        previous = first;
    }
    if (tiles) {
        w->row_tiles = at;  // the rows stay in the mapping, for the other paths
    } else {
        w->data = at;
        if (source.scales) w->scales = reinterpret_cast<const uint16_t*>(scale_copy);
    }
}

}  // namespace

ResidentWeights resident_weights(const Model& model, size_t chunk_bytes) {
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
        copy_matrix(matrices[i], resident.memory.get() + offsets[i], model.file.get(), chunk_bytes);
    return resident;
}

}  // namespace barellm::cpu
