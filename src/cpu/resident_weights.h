// The CPU backend's own copy of a model's layer and output matrices, in memory it allocates
// on 2 MiB boundaries, where Linux backs it with 2 MiB pages (transparent huge pages,
// "always" or, with the advice given here, "madvise"). Decode streams every matrix once per
// token: from the file's mapping, 4 KiB pages cost a TLB entry and stop the hardware
// prefetcher every 4 KiB, and how much of the page cache sits in larger pages changes from
// run to run, and one-thread decode with it (docs/BENCHMARKS.md, the Intel Xeon's results).
#pragma once
#include <vector>

#include "cpu/quantized_tiles.h"
#include "weights/model.h"

namespace barellm::cpu {

struct ResidentWeights {
    std::vector<LayerWeights> layers;  // pointing into `memory`
    Matrix output;
    AlignedBytes memory;
};

// Copies the layer and output matrices of `model` (each expert's as a matrix of its own): f32, f16
// and bf16 values as they are; Q8, Q4, IQ4_NL, MXFP4, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and IQ4_XS in
// tiles of 16 rows (Matrix::row_tiles) where the level in use reads them so (uses_row_tiles), else
// their values and scales (or blocks) as they are. The embedding table, read a row at a time, and
// the norm weights stay in the file's mapping, as do the rows of tiled matrices (for the other
// paths). A matrix is copied chunk_bytes of the file at a time (whole tiles of 16 rows), and the
// pages of the file that held each chunk are handed back to the system (Model::file) before the
// next, so resident memory holds the weights once, and a chunk twice at the peak. Throws Error
// where memory does not suffice.
constexpr size_t kResidentCopyChunkBytes = size_t(64) << 20;
ResidentWeights resident_weights(const Model& model, size_t chunk_bytes = kResidentCopyChunkBytes);

}  // namespace barellm::cpu
