// An in-memory copy of a Model with every matrix converted to another weight dtype
// (F32, F16, BF16 or Q8), e.g. to run the same model at f32, f16 and q8 in one process
// (`barellm ladder`). The conversions are the converter's (convert/dtypes.py): f16 and
// bf16 round to nearest even, Q8 follows docs/FORMAT.md, so a copy holds the same bytes
// as the file convert.py would write from the same source.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "weights/model.h"

namespace barellm {

struct ModelCopy {
    Model model;  // model.file is null: every pointer points into `storage`
    std::vector<std::unique_ptr<uint8_t[]>> storage;
};

// Bytes the matrices and norms of a copy of `source` with `dtype` weights take (I8 means
// Q8: int8 values and f16 scales).
size_t model_copy_bytes(const Model& source, DType dtype);

// The copy; refuses (Error) when it would not fit in the available memory, when a Q8
// scale would overflow f16, or when asked for Q4 (U8), which only the converter writes.
// Any source dtype is read, Q4 included. Matrix rows are converted in parallel (OpenMP).
std::unique_ptr<ModelCopy> copy_model(const Model& source, DType dtype);

// The config's weight_dtype spelling of a matrix dtype: "F32", "F16", "BF16", "Q8", "Q4".
const char* weight_dtype_name(DType dtype);

}  // namespace barellm
