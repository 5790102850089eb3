// The boundary between the program and a compute backend (CPU or CUDA).
#pragma once
#include <memory>
#include <string>

#include "kv_cache.h"
#include "weights/model.h"

namespace barellm {

// Auto: the GPU when the build has CUDA, a device is usable and the CUDA backend takes the
// model, else the CPU.
enum class Device { Cpu, Cuda, Auto };

// Which kernels the CUDA backend runs a token with: the fast ones by default. The GPU
// ladder (`barellm ladder --device cuda`, src/commands/ladder.cpp) picks simpler ones, each step
// adding one optimisation to the step before (kernels/ladder_forward.cu, *_simple.cuh).
enum class CudaKernels {
    NaivePort,   // a thread per matrix row; RMSNorm, residual add, SwiGLU, RoPE and the KV
                 // write as separate kernels; naive attention (attention_simple.cuh)
    WarpPerRow,  // + a warp per matrix row, shuffle sum (lane 0 stores)
    Fused,       // + RMSNorm, residual add and SwiGLU inside the matvecs, RoPE with the KV write
    FastMatvec,  // + the fast matvecs (kernels/matvec.cuh)
    Fast,        // + the fast attention (kernels/attention.cuh): every kernel the fast one
};

struct BackendOptions {
    int context = 0;  // positions to allocate the KV cache for (<= the model's max_context)
    KvType kv_type = KvType::F16;
    Device device = Device::Cpu;
    // Whether prefill will be asked for every position's logits (all_logits): the backend
    // then counts [context, vocab_size] floats for them in its memory check and holds them.
    bool all_logits = false;
    // CUDA only (the ladder's switches; the defaults are the fast path):
    CudaKernels cuda_kernels = CudaKernels::Fast;
    bool cuda_graph = true;      // replay one captured CUDA graph per token
    bool flash_decoding = true;  // split the attended positions across blocks (Fast only)
    // The server's paged KV cache (src/serve/): `kv_blocks` blocks of `kv_block_size`
    // positions each, for Backend::step. 0 blocks: none (run, chat, ppl, bench).
    int kv_blocks = 0;
    int kv_block_size = 16;
};

// One row of a batched step (Backend::step): one token of one sequence.
struct StepRow {
    int token;
    int pos;  // its position in its sequence, 0-based
    // The sequence's blocks in the paged KV cache: position p is slot p % kv_block_size of
    // block block_table[p / kv_block_size]. The table covers positions 0..pos.
    const int* block_table;
    bool wants_logits;  // whether the step returns this row's logits
};

class Backend {
public:
    virtual ~Backend() = default;
    // Runs `token` at position `pos` (0-based, < context) through the model, using the
    // KV cache of positions 0..pos-1, and returns the logits [vocab_size] in host memory.
    virtual const float* forward(int token, int pos) = 0;
    // Runs tokens[0..count) at positions first_pos.. as one batch (prefill) and returns
    // the logits of the last token, or of every token [count, vocab_size] if all_logits
    // (which needs BackendOptions::all_logits).
    virtual const float* prefill(const int* tokens, int count, int first_pos, bool all_logits) = 0;
    virtual std::string name() const = 0;
    // The most tokens one prefill batch (or one step) holds; longer prompts run in several.
    virtual int max_batch() const = 0;
    // The server's step, with the paged KV cache (BackendOptions::kv_blocks > 0): runs
    // rows[0..count) (count <= max_batch()) as one batch. Each row's key and value are
    // written to its slot, then the row attends to positions 0..pos of its own sequence
    // (its window's on sliding layers): earlier steps' keys and values read through its block
    // table, and this step's rows of the same sequence at lower positions. Rows of one
    // sequence come in increasing positions and share one block table. Returns the logits
    // of the rows that want them, [wanting rows, vocab_size] in row order, in host memory.
    virtual const float* step(const StepRow* rows, int count) = 0;
    // Copies every layer's keys and values of block `from` to block `to` (copy on write of
    // a block that sequences share).
    virtual void copy_kv_block(int from, int to) = 0;
    // Bytes of KV cache a step at `pos` reads (for bandwidth figures).
    virtual size_t kv_bytes_read(int pos) const = 0;
    // The memory bandwidth this backend's kernels can hope for, GB/s, measured now: a
    // streaming read on the CPU, a device-to-device copy (bytes read + written) on CUDA.
    virtual double measure_bandwidth_gbps() = 0;
};

// Throws Error unless every token id is in the vocabulary and positions
// first_pos .. first_pos + count - 1 lie inside a context of `context` (count >= 1).
void check_tokens(const Config& config, const int* tokens, int count, int first_pos, int context);

// The backend options.device asks for; throws Error when Cpu or Cuda cannot be had (no GPU,
// or a build without CUDA). For Auto, `choice` (when given) is set to one line saying which
// device was taken and why.
std::unique_ptr<Backend> make_backend(const Model& model, const BackendOptions& options,
                                      std::string* choice = nullptr);

std::unique_ptr<Backend> make_cpu_backend(const Model& model, const BackendOptions& options);
#ifdef BARELLM_CUDA
std::unique_ptr<Backend> make_cuda_backend(const Model& model, const BackendOptions& options);
// Whether a CUDA device is usable; `reason` says why not.
bool cuda_device_available(std::string* reason);
#endif

}  // namespace barellm
