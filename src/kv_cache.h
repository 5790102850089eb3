// The KV cache's element type and the attention shape: shared by the CPU backend
// (src/cpu/) and the CUDA backend (kernels/).
#pragma once
#include <algorithm>
#include <cstddef>

namespace barellm {

// The KV cache stores keys and values as f32 or as IEEE half (f16, default).
enum class KvType { F32, F16 };

// Bytes of one cache element of `type`.
inline size_t kv_element_bytes(KvType type) { return type == KvType::F32 ? 4 : 2; }

// Causal attention over one layer's KV cache, laid out [context, kv_heads * head_dim].
// - Query head h reads KV head h / (heads / kv_heads) (grouped-query attention).
// - A query at position pos attends to cache rows attention_start(pos, window) .. pos.
// - Scores are q·k × scale (Config::attention_scale: 1/sqrt(head_dim) unless the model says),
//   then, where softcap > 0 (Gemma 2), softcap · tanh(score / softcap), before the softmax.
struct AttentionShape {
    int heads, kv_heads, head_dim;
    int window;            // sliding window in positions, 0 for none
    float scale;           // of q·k before the softmax
    float softcap = 0.0f;  // bound of the scores (Config::attn_logit_softcap), 0 for none
    // Attention sinks (Config::attention_sinks): [heads] logits, one per query head, that
    // join its softmax beside the scores and weigh a zero value; nullptr for none. In the
    // backend's memory (the GPU's for CUDA).
    const float* sinks = nullptr;
};

// The first cache row a query at `pos` attends to (window 0: all of them, from row 0).
inline int attention_start(int pos, int window) {
    return window > 0 ? std::max(0, pos + 1 - window) : 0;
}

// The server's paged KV cache (Backend::step): per layer, blocks of `block_size` positions,
// laid out [blocks, block_size, kv_heads * head_dim]. Position `pos` of a sequence is the
// pool row paged_row(its block table, pos, block_size): slot pos % block_size of block
// block_table[pos / block_size].
inline size_t paged_row(const int* block_table, int pos, int block_size) {
    return size_t(block_table[pos / block_size]) * block_size + pos % block_size;
}

}  // namespace barellm
