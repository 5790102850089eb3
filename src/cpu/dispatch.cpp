// The CPU kernels of cpu/kernels.h: the dispatch that sends each call to the scalar path
// (cpu/scalar.h), the AVX2 path (cpu/avx2/avx2.h) or the AVX-512 path (cpu/avx512/avx512.h),
// by the SIMD level in use and the weights' type, the work split across threads (cpu/threads.h);
// and the kernels with one path for every level (RoPE, the embedding row, the KV store).
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <vector>

#include "cpu/avx2/avx2.h"
#include "cpu/avx2/avxvnni.h"
#include "cpu/avx512/avx512.h"
#include "cpu/iq_levels.h"
#include "cpu/kernels.h"
#include "cpu/quantized_tiles.h"
#include "cpu/scalar.h"
#include "cpu/threads.h"
#include "util/error.h"
#include "weights/half.h"

namespace barellm::cpu {

namespace {

SimdLevel active_level = detect_simd_level();  // the path the dispatch below takes
const bool has_avx512_vnni = cpu_has_avx512_vnni();
const bool has_avx512_bf16 = cpu_has_avx512_bf16();
const bool has_avx_vnni = cpu_has_avx_vnni();
const bool bf16_dot_products = cpu_prefers_bf16_dot_products();

// Whether the SIMD matvecs of weights of this type read x quantized per 256 as Q8_K.
bool matvec_on_q8_k(DType dtype) {
    return dtype == DType::Q2_K || dtype == DType::Q3_K || dtype == DType::Q4_K ||
           dtype == DType::Q5_K || dtype == DType::Q6_K || dtype == DType::IQ4_XS ||
           is_iq_level_type(dtype);
}
// Whether the SIMD matvecs also read this type's rows of super-blocks where it has no tiles
// (the i-quants and the ternary types have a matvec of their own).
bool matvec_on_super_block_rows(DType dtype) {
    return matvec_on_q8_k(dtype) && !read_from_tiles_only(dtype) && !is_iq_level_type(dtype);
}
// Whether they read x quantized per 32 (quantize_q8), as Q8 and Q4 weights do.
bool matvec_on_q8_groups(DType dtype) {
    return dtype == DType::Q4_1 || dtype == DType::Q5_0 || dtype == DType::Q5_1 ||
           dtype == DType::IQ4_NL || dtype == DType::MXFP4;
}

// Whether the kernels in use are AVX-512's with AVX512_VNNI, or AVX2's with AVX-VNNI.
bool on_avx512_vnni() { return active_level == SimdLevel::Avx512 && has_avx512_vnni; }
bool on_avx_vnni() { return active_level == SimdLevel::Avx2 && has_avx_vnni; }

// Whether w is read from its tiles at the level in use.
bool reads_tiles(const Matrix& w) { return w.row_tiles && uses_row_tiles(w.dtype); }
// Whether the integer GEMMs of the block types read w (from its rows or its tiles).
bool block_gemm_reads(const Matrix& w) {
    return is_block_type(w.dtype) && (w.row_tiles || !read_from_tiles_only(w.dtype));
}

}  // namespace

void set_simd_level(SimdLevel level) { active_level = level; }

bool uses_row_tiles(DType dtype) {
    if (!has_row_tiles(dtype)) return false;
    if (is_quantized(dtype) || looks_up_levels(dtype)) return on_avx512_vnni() || on_avx_vnni();
    return active_level >= SimdLevel::Avx2;
}
SimdLevel simd_level() { return active_level; }
const char* simd_level_name(SimdLevel level) {
    switch (level) {
        case SimdLevel::Avx512:
            return "avx512";
        case SimdLevel::Avx2:
            return "avx2";
        case SimdLevel::Scalar:
            break;
    }
    return "scalar";
}

bool parse_simd_level(const std::string& name, SimdLevel* level) {
    for (SimdLevel candidate : {SimdLevel::Scalar, SimdLevel::Avx2, SimdLevel::Avx512})
        if (name == simd_level_name(candidate)) {
            *level = candidate;
            return true;
        }
    return false;
}

std::string simd_description() {
    std::string description = simd_level_name(active_level);
    if (active_level == SimdLevel::Avx512) {
        if (has_avx512_vnni) description += "+vnni";
        if (has_avx512_bf16) description += "+bf16";
        if (!has_avx512_vnni) description += " (no vnni: q8/q4 matvecs on avx2)";
    }
    if (active_level == SimdLevel::Avx2 && has_avx_vnni) description += "+avxvnni";
    return description;
}

void matvec(float* out, const float* x, const Matrix& w) { matvec_many({{out, x, &w}}); }

void matvec_many(std::initializer_list<MatvecTask> tasks) {
    matvec_many(tasks.begin(), int(tasks.size()));
}

void matvec_many(const MatvecTask* task_list, int task_count) {
    // Q8 and Q4 weights with SIMD use integer dot products: each input is quantized once, by
    // the calling thread, into one buffer per task; the workers only read them.
    static thread_local std::vector<QuantizedVector> quantized_buffers;
    // K-quant weights likewise, x quantized per 256 (Q8_K).
    static thread_local std::vector<Q8KVector> q8_k_buffers;
    // f16 and bf16 weights with AVX-512 read x as 16-bit values, likewise rounded once by the
    // calling thread: to bf16 for bf16 weights where vdpbf16ps is preferred
    // (avx512::matvec_rows_bf16_x), else to f16 (avx512::matvec_rows_half_x), where x fits
    // f16's range.
    static thread_local std::vector<std::vector<uint16_t>> half_buffers;
    static thread_local std::vector<uint8_t> half_x_flags, bf16_x_flags;
    // Consecutive tasks of one x (q, k and v; gate and up) quantize it once: each task reads
    // its quantized x through these.
    static thread_local std::vector<const QuantizedVector*> task_quantized;
    static thread_local std::vector<const Q8KVector*> task_q8_k;
    if (quantized_buffers.size() < size_t(task_count)) {
        quantized_buffers.resize(task_count);
        q8_k_buffers.resize(task_count);
        half_buffers.resize(task_count);
    }
    half_x_flags.assign(task_count, 0);
    bf16_x_flags.assign(task_count, 0);
    task_quantized.assign(task_count, nullptr);
    task_q8_k.assign(task_count, nullptr);
    // The calling thread's buffers, for the workers.
    QuantizedVector* quantized = quantized_buffers.data();
    Q8KVector* q8_k = q8_k_buffers.data();
    std::vector<uint16_t>* halves = half_buffers.data();
    uint8_t* use_half_x = half_x_flags.data();
    uint8_t* use_bf16_x = bf16_x_flags.data();
    const QuantizedVector* const* quantized_x = task_quantized.data();
    const Q8KVector* const* q8_k_x = task_q8_k.data();
    const bool use_simd = active_level >= SimdLevel::Avx2;
    const bool use_avx512 = active_level == SimdLevel::Avx512;
    const bool use_avx512_vnni = on_avx512_vnni(), avx_vnni = on_avx_vnni();
    size_t total_rows = 0, work = 0;
    for (int t = 0; t < task_count; ++t) {
        const Matrix& w = *task_list[t].w;
        const float* x = task_list[t].x;
        const bool same_x = t > 0 && task_list[t - 1].x == x && task_list[t - 1].w->cols == w.cols;
        if (use_simd && (is_quantized(w.dtype) || matvec_on_q8_groups(w.dtype))) {
            if (same_x && task_quantized[t - 1]) {
                task_quantized[t] = task_quantized[t - 1];
            } else {  // avx512::quantize_q8 is quantize_q8, 16 values at a time
                (use_avx512_vnni ? avx512::quantize_q8 : quantize_q8)(&quantized[t], x, w.cols);
                task_quantized[t] = &quantized[t];
            }
        }
        if (use_simd && matvec_on_q8_k(w.dtype)) {
            if (same_x && task_q8_k[t - 1]) {
                task_q8_k[t] = task_q8_k[t - 1];
            } else {
                (use_avx512_vnni ? avx512::quantize_q8_k : avx2::quantize_q8_k)(&q8_k[t], x,
                                                                                w.cols);
                task_q8_k[t] = &q8_k[t];
            }
        }
        if (use_avx512 && bf16_dot_products && w.dtype == DType::BF16) {
            halves[t].resize(w.cols);
            avx512::round_to_bf16(halves[t].data(), task_list[t].x, w.cols);
            use_bf16_x[t] = 1;
        } else if (use_avx512 && (w.dtype == DType::F16 || w.dtype == DType::BF16)) {
            halves[t].resize(w.cols);
            use_half_x[t] = avx512::round_to_half(halves[t].data(), task_list[t].x, w.cols);
        }
        total_rows += w.rows;
        work += size_t(w.rows) * w.cols;
    }
    // Rows of all tasks, one after another, cut into one contiguous run per thread.
#pragma omp parallel num_threads(threads_for(work))
    {
        const size_t threads = omp_get_num_threads(), thread = omp_get_thread_num();
        const size_t first = total_rows * thread / threads;
        const size_t last = total_rows * (thread + 1) / threads;
        size_t task_start = 0;
        for (int t = 0; t < task_count; ++t) {
            const MatvecTask& task = task_list[t];
            const size_t task_end = task_start + task.w->rows;
            const size_t begin = std::max(first, task_start), end = std::min(last, task_end);
            if (begin < end) {
                const int row = int(begin - task_start), count = int(end - begin);
                const DType dtype = task.w->dtype;
                const bool tiled = reads_tiles(*task.w);
                if (tiled && !has_group_tiles(dtype))  // the super-block types
                    (use_avx512_vnni ? avx512::matvec_rows_block_tiles
                                     : avx2::matvec_rows_block_tiles)(task.out, 0, *task.w,
                                                                      q8_k_x[t], 1, row, count);
                else if (use_simd && is_iq_level_type(dtype))
                    (use_avx512_vnni ? avx512::matvec_rows_iq
                     : avx_vnni && dtype == DType::TQ1_0
                         ? avxvnni::matvec_rows_tq1_0
                         : avx2::matvec_rows_iq)(task.out, *task.w, *q8_k_x[t], row, count);
                else if (use_simd && matvec_on_super_block_rows(dtype))
                    (use_avx512_vnni ? avx512::matvec_rows_super_blocks
                                     : avx2::matvec_rows_super_blocks)(task.out, *task.w,
                                                                       *q8_k_x[t], row, count);
                else if (tiled && looks_up_levels(dtype))  // IQ4_NL, MXFP4
                    (use_avx512_vnni ? avx512::matvec_rows_lookup_blocks
                                     : avxvnni::matvec_rows_lookup_blocks)(
                        task.out, *task.w, *quantized_x[t], row, count);
                else if (use_simd && matvec_on_q8_groups(dtype))
                    avx2::matvec_rows_small_blocks(task.out, *task.w, *quantized_x[t], row, count);
                else if (!use_simd || is_block_type(dtype))
                    scalar::matvec_rows(task.out, *task.w, task.x, row, count);
                else if (dtype == DType::Q8_0)
                    (!tiled ? avx2::matvec_rows_q8
                     : use_avx512_vnni
                         ? avx512::matvec_rows_q8
                         : avxvnni::matvec_rows_q8)(task.out, *task.w, *quantized_x[t], row, count);
                else if (dtype == DType::Q4_0)
                    (!tiled ? avx2::matvec_rows_q4
                     : use_avx512_vnni
                         ? avx512::matvec_rows_q4
                         : avxvnni::matvec_rows_q4)(task.out, *task.w, *quantized_x[t], row, count);
                else if (use_bf16_x[t])
                    avx512::matvec_rows_bf16_x(task.out, *task.w, halves[t].data(), row, count);
                else if (use_half_x[t])
                    avx512::matvec_rows_half_x(task.out, *task.w, halves[t].data(), row, count);
                else
                    (use_avx512 ? avx512::matvec_rows : avx2::matvec_rows)(task.out, *task.w,
                                                                           task.x, row, count);
            }
            task_start = task_end;
        }
    }
}

void gemm(float* out, const float* x, int batch, const Matrix& w) {
    gemm_many(x, batch, {{out, &w}});
}

namespace {

// Row tiles a thread claims at most at once in the VNNI GEMMs.
constexpr int kQuantizedRowTiles = 4;

// The most tokens gemm_many multiplies by block-type weights through matvecs.
constexpr int kBlockMatvecBatch = 8;

// The GEMM rows [first, first + count) of one output, on the path for its weights:
// vdpbf16ps for bf16 where pair_tiles were packed, else AVX-512 FMAs for f32, f16 and
// bf16, else AVX2 (the block types dequantized to f32 there, where they share a call with
// matrices of other types).
void batch_rows(const BatchOutput& o, const float* x_tiles, const uint32_t* pair_tiles, int batch,
                int first, int count) {
    const DType dtype = o.w->dtype;
    if (is_block_type(dtype))
        avx2::gemm_rows(o.out, *o.w, x_tiles, batch, first, count);
    else if (pair_tiles && dtype == DType::BF16)
        avx512::gemm_rows_bf16(o.out, *o.w, pair_tiles, batch, first, count);
    else if (active_level == SimdLevel::Avx512 && !is_quantized(dtype))
        avx512::gemm_rows(o.out, *o.w, x_tiles, batch, first, count);
    else
        avx2::gemm_rows(o.out, *o.w, x_tiles, batch, first, count);
}

// The rows of all outputs, one after another, cut into one contiguous run per thread:
// run(output, first row, row count) for each output a thread's run meets.
template <typename Run>
void runs_of_outputs(const std::vector<BatchOutput>& outputs, size_t work, Run run) {
    size_t total_rows = 0;
    for (const BatchOutput& o : outputs) total_rows += o.w->rows;
#pragma omp parallel num_threads(threads_for(work))
    {
        const size_t threads = omp_get_num_threads(), thread = omp_get_thread_num();
        const size_t first = total_rows * thread / threads;
        const size_t last = total_rows * (thread + 1) / threads;
        size_t output_start = 0;
        for (const BatchOutput& o : outputs) {
            const size_t output_end = output_start + o.w->rows;
            const size_t begin = std::max(first, output_start), end = std::min(last, output_end);
            if (begin < end) run(o, int(begin - output_start), int(end - begin));
            output_start = output_end;
        }
    }
}

// Multiply-adds of `batch` tokens through all outputs.
size_t batch_work(const std::vector<BatchOutput>& outputs, int batch) {
    size_t work = 0;
    for (const BatchOutput& o : outputs) work += size_t(o.w->rows) * o.w->cols * batch;
    return work;
}

// out = W · x for each of `batch` tokens of x [batch, cols] and each output, all of them
// of the super-block types read from tiles (AVX-512 VNNI's kernel or AVX2's): x quantized as Q8_K a
// token at a time by the calling thread, then each thread's run of rows meeting every token.
void tiled_block_matvecs(const float* x, int batch, const std::vector<BatchOutput>& outputs) {
    static thread_local std::vector<Q8KVector> storage;
    if (storage.size() < size_t(batch)) storage.resize(batch);
    const Q8KVector* x_q8_k = storage.data();  // the calling thread's, for the workers
    const int cols = outputs.front().w->cols;
    const bool avx512_vnni = on_avx512_vnni();
    for (int b = 0; b < batch; ++b)
        (avx512_vnni ? avx512::quantize_q8_k : avx2::quantize_q8_k)(&storage[b],
                                                                    x + size_t(b) * cols, cols);
    runs_of_outputs(
        outputs, batch_work(outputs, batch), [&](const BatchOutput& o, int first, int count) {
            (avx512_vnni ? avx512::matvec_rows_block_tiles : avx2::matvec_rows_block_tiles)(
                o.out, o.w->rows, *o.w, x_q8_k, batch, first, count);
        });
}

// The same for Q8 and Q4 weights on AVX2 (where gemm_many finds the matvec faster than the
// GEMM): x quantized to Q8 a token at a time, then each thread's run of rows meeting every
// token, a few a pass over each row, in the decode matvec's integer dot products.
void quantized_matvecs(const float* x, int batch, const std::vector<BatchOutput>& outputs) {
    static thread_local std::vector<QuantizedVector> storage;
    if (storage.size() < size_t(batch)) storage.resize(batch);
    const QuantizedVector* x_q8 = storage.data();  // the calling thread's, for the workers
    const int cols = outputs.front().w->cols;
    for (int b = 0; b < batch; ++b) quantize_q8(&storage[b], x + size_t(b) * cols, cols);
    runs_of_outputs(
        outputs, batch_work(outputs, batch), [&](const BatchOutput& o, int first, int count) {
            (o.w->dtype == DType::Q8_0 ? avx2::matvec_rows_q8_tokens : avx2::matvec_rows_q4_tokens)(
                o.out, o.w->rows, *o.w, x_q8, batch, first, count);
        });
}

}  // namespace

void gemm_many(const float* x, int batch, std::initializer_list<BatchOutput> outputs) {
    if (outputs.size() == 0) return;
    const int cols = outputs.begin()->w->cols;
    int total_rows = 0;
    for (const BatchOutput& o : outputs) {
        if (o.w->cols != cols) throw Error("gemm_many: matrices of different widths");
        total_rows += o.w->rows;
    }
    const size_t row_work = size_t(cols) * batch;
    // The super-block types read from tiles meet a few tokens faster through their decode
    // matvec, every token at once, each tile read once: the GEMM unpacks each tile of weights to
    // levels and f32 scales, which costs about as much as kBlockMatvecBatch matvecs (measured on
    // TinyLlama Q4_K_M and Q6_K). The blocks of 32, whose matvec reads a token at a time, do
    // not: the GEMM meets them faster from 2 tokens on (TinyLlama IQ4_NL from its rows, 2
    // threads, 2, 4 and 8 tokens: 42.8, 80.9 and 138-142 tok/s against 27.7, 33.7 and 36.2-36.7
    // through the matvec).
    const bool all_tiled_blocks = std::all_of(
        outputs.begin(), outputs.end(),
        [](const BatchOutput& o) { return !has_group_tiles(o.w->dtype) && reads_tiles(*o.w); });
    if (active_level >= SimdLevel::Avx2 && all_tiled_blocks && batch <= kBlockMatvecBatch) {
        tiled_block_matvecs(x, batch, std::vector<BatchOutput>(outputs));
        return;
    }
    if (active_level < SimdLevel::Avx2) {
        for (const BatchOutput& o : outputs)
            split_rows(o.w->rows, row_work, [&](int first, int count) {
                scalar::gemm_rows(o.out, *o.w, x, batch, first, count);
            });
        return;
    }
    const int threads = threads_for(total_rows * row_work);
    std::atomic<int> next_row{0};  // rows of all outputs, one matrix after another
    // Q8 and Q4 weights with VNNI (from their tiles, AVX-512's or AVX-VNNI's kernel),
    // Q4 on AVX2 without it (vpmaddubsw), and the block types (with AVX-512 VNNI on its kernel,
    // else on AVX2's; each output on its own type's kernel): x is quantized once, a token at a
    // time, the threads sharing the work and the result; the buffers belong to the calling
    // thread.
    const bool all_tiled = std::all_of(outputs.begin(), outputs.end(), [](const BatchOutput& o) {
        return (is_quantized(o.w->dtype) && o.w->row_tiles) || block_gemm_reads(*o.w);
    });
    const bool avx512_vnni = on_avx512_vnni() && all_tiled;
    const bool avx_vnni = on_avx_vnni();
    const bool q4_maddubs = active_level == SimdLevel::Avx2 && !has_avx_vnni;
    const bool avx2_integer =
        !avx512_vnni && std::all_of(outputs.begin(), outputs.end(), [&](const BatchOutput& o) {
            return block_gemm_reads(*o.w) || (avx_vnni && is_quantized(o.w->dtype)) ||
                   (q4_maddubs && o.w->dtype == DType::Q4_0);
        });
    // Fewer Q8 and Q4 tokens than the f32 GEMM's tile where no VNNI GEMM runs (AVX2 without
    // VNNI: Q4 on vpmaddubsw's GEMM from that tile on) go faster through the decode matvec's
    // integer dot products, each row read once for all of them (a server step of 8 TinyLlama
    // sequences on Zen 4 with --simd avx2: Q4 57 tok/s against the f32 GEMM's 25.5, Q8 53
    // against 31). Q4's switch stays at the tile: a token's result has the same bits in every
    // batch on one side of it (as the server's step needs). The VNNI GEMMs read such batches
    // from the tiles directly.
    const bool small_quantized =
        !avx_vnni && batch < avx2::kTokenTile &&
        std::all_of(outputs.begin(), outputs.end(), [&](const BatchOutput& o) {
            return o.w->dtype == DType::Q8_0 || o.w->dtype == DType::Q4_0;
        });
    if (!avx512_vnni && small_quantized) {
        quantized_matvecs(x, batch, std::vector<BatchOutput>(outputs));
        return;
    }
    if (avx512_vnni || avx2_integer) {
        // x quantized per 32 for Q8, Q4 and the small block types, per 256 as Q8_K for the
        // super-block types (as their matvecs read it); each as some output needs it.
        static thread_local QuantizedBatch group_storage, super_block_storage;
        QuantizedBatch* x_groups = &group_storage;  // the calling thread's, shared
        QuantizedBatch* x_super_blocks = &super_block_storage;
        const bool any_groups =
            std::any_of(outputs.begin(), outputs.end(),
                        [](const BatchOutput& o) { return !matvec_on_q8_k(o.w->dtype); });
        const bool any_super_blocks =
            std::any_of(outputs.begin(), outputs.end(),
                        [](const BatchOutput& o) { return matvec_on_q8_k(o.w->dtype); });
        if (any_groups) resize_quantized_batch(x_groups, batch, cols);
        if (any_super_blocks) resize_quantized_batch(x_super_blocks, batch, cols);
        const auto quantize_token = avx512_vnni ? avx512::quantize_token : avx2::quantize_token;
        const auto quantize_q8_k = avx512_vnni ? avx512::quantize_q8_k : avx2::quantize_q8_k;
        const auto rows_quantized = avx512_vnni ? avx512::gemm_rows_quantized
                                    : avx_vnni  ? avxvnni::gemm_rows_quantized
                                                : avx2::gemm_rows_q4;
        const auto rows_blocks = avx512_vnni ? avx512::gemm_rows_blocks
                                 : avx_vnni  ? avxvnni::gemm_rows_blocks
                                             : avx2::gemm_rows_blocks;
        const bool any_blocks =
            std::any_of(outputs.begin(), outputs.end(),
                        [](const BatchOutput& o) { return is_block_type(o.w->dtype); });
        const int row_tile = avx512_vnni  ? avx512::kQuantizedRowTile
                             : any_blocks ? avx2::kBlockRowTile
                                          : avxvnni::kQuantizedRowTile;
#pragma omp parallel num_threads(threads)
        {
            static thread_local Q8KVector token_q8_k;  // each thread's
#pragma omp for schedule(static)
            for (int b = 0; b < batch; ++b) {
                const float* x_row = x + size_t(b) * cols;
                if (any_groups) quantize_token(x_groups, x_row, cols, b);
                if (any_super_blocks) {
                    quantize_q8_k(&token_q8_k, x_row, cols);
                    store_q8_k_token(x_super_blocks, token_q8_k, b);
                }
            }
            claim_rows(outputs, total_rows, &next_row, row_tile, kQuantizedRowTiles * row_tile,
                       [&](const BatchOutput& o, int first, int count) {
                           const QuantizedBatch& x_quantized =
                               matvec_on_q8_k(o.w->dtype) ? *x_super_blocks : *x_groups;
                           (is_block_type(o.w->dtype) ? rows_blocks : rows_quantized)(
                               o.out, *o.w, x_quantized, first, count);
                       });
        }
        return;
    }
    // Otherwise x is transposed into token tiles once, the threads sharing the work and the
    // result; the buffers belong to the calling thread. bf16 weights multiplied with
    // vdpbf16ps (cpu_prefers_bf16_dot_products) read tiles of x rounded to bf16 pairs
    // instead, the others f32 tiles.
    const bool avx512_bf16 = active_level == SimdLevel::Avx512 && bf16_dot_products;
    auto on_pairs = [&](const BatchOutput& o) { return avx512_bf16 && o.w->dtype == DType::BF16; };
    const bool bf16_pairs = std::any_of(outputs.begin(), outputs.end(), on_pairs);
    const bool float_tiles = !std::all_of(outputs.begin(), outputs.end(), on_pairs);
    static thread_local std::vector<float> tile_storage;
    static thread_local std::vector<uint32_t> pair_storage;
    if (float_tiles)
        tile_storage.resize(avx2::token_tiles_floats(batch, cols) + avx512::kGemmTokenTile);
    float* x_tiles = float_tiles ? avx512::align64(tile_storage.data()) : nullptr;
    if (bf16_pairs) pair_storage.resize(avx512::token_pair_tiles_words(batch, cols));
    uint32_t* pair_tiles = bf16_pairs ? avx512::align64(pair_storage.data()) : nullptr;
    const int tiles = avx2::token_tile_count(batch);
#pragma omp parallel num_threads(threads)
    {
#pragma omp for schedule(static)
        for (int tile = 0; tile < tiles; ++tile) {
            if (float_tiles) avx2::pack_token_tile(x_tiles, x, cols, batch, tile);
            if (bf16_pairs) avx512::pack_token_pair_tile(pair_tiles, x, cols, batch, tile);
        }
        claim_rows(outputs, total_rows, &next_row, avx2::kRowTile, avx2::kRowBlock,
                   [&](const BatchOutput& o, int first, int count) {
                       batch_rows(o, x_tiles, pair_tiles, batch, first, count);
                   });
    }
}

void rmsnorm(float* out, const float* x, const float* weight, int n, float eps) {
    if (active_level == SimdLevel::Avx512)
        avx512::rmsnorm(out, x, weight, n, eps);
    else if (active_level == SimdLevel::Avx2)
        avx2::rmsnorm(out, x, weight, n, eps);
    else
        scalar::rmsnorm(out, x, weight, n, eps);
}

void rope(float* vec, int heads, int head_dim, int pos, const float* rope_table) {
    const int half = head_dim / 2;
    const float* inverse_frequencies = rope_table;
    const float* magnitudes = rope_table + half;
    for (int i = 0; i < half; ++i) {
        // The angle in double: pos * frequency loses digits in float at long context.
        const double angle = double(pos) * inverse_frequencies[i];
        const float cos_angle = float(std::cos(angle) * magnitudes[i]);
        const float sin_angle = float(std::sin(angle) * magnitudes[i]);
        for (int h = 0; h < heads; ++h) {
            float* head = vec + size_t(h) * head_dim;
            const float a = head[i];
            const float b = head[i + half];
            head[i] = a * cos_angle - b * sin_angle;
            head[i + half] = b * cos_angle + a * sin_angle;
        }
    }
}

void softmax(float* x, int n, float sink) {
    if (active_level == SimdLevel::Avx512)
        avx512::softmax(x, n, sink);
    else if (active_level == SimdLevel::Avx2)
        avx2::softmax(x, n, sink);
    else
        scalar::softmax(x, n, sink);
}

void swiglu(float* gate, const float* up, int n) {
    if (active_level == SimdLevel::Avx512)
        avx512::swiglu(gate, up, n);
    else if (active_level == SimdLevel::Avx2)
        avx2::swiglu(gate, up, n);
    else
        scalar::swiglu(gate, up, n);
}

void geglu(float* gate, const float* up, int n) {
    if (active_level == SimdLevel::Avx512)
        avx512::geglu(gate, up, n);
    else if (active_level == SimdLevel::Avx2)
        avx2::geglu(gate, up, n);
    else
        scalar::geglu(gate, up, n);
}

void swiglu_oai(float* gate, const float* up, int n, float limit) {
    if (active_level == SimdLevel::Avx512)
        avx512::swiglu_oai(gate, up, n, limit);
    else if (active_level == SimdLevel::Avx2)
        avx2::swiglu_oai(gate, up, n, limit);
    else
        scalar::swiglu_oai(gate, up, n, limit);
}

void gated_activation(float* gate, const float* up, int n, const Config& config) {
    switch (config.activation) {
        case Activation::GeluTanh:
            return geglu(gate, up, n);
        case Activation::SwigluOai:
            return swiglu_oai(gate, up, n, config.swiglu_limit);
        case Activation::Silu:
            return swiglu(gate, up, n);
    }
}

void softcap(float* x, int n, float cap) {
    if (active_level == SimdLevel::Avx512)
        avx512::softcap(x, n, cap);
    else if (active_level == SimdLevel::Avx2)
        avx2::softcap(x, n, cap);
    else
        scalar::softcap(x, n, cap);
}

void embedding_row(float* out, const Matrix& table, int row) {
    matrix_row_to_float(out, table, row);
}

void kv_store(void* slot, const float* values, int n, KvType type) {
    if (type == KvType::F32) {
        std::copy(values, values + n, static_cast<float*>(slot));
    } else {
        uint16_t* halves = static_cast<uint16_t*>(slot);
        for (int i = 0; i < n; ++i) halves[i] = float_to_half(values[i]);
    }
}

namespace {

// One query head attending to cache rows [first, pos]: softmax(q·k × scale) · v, the scores
// soft-capped where the shape says, the head's sink logit in the softmax where it has one. The
// cache
// row of position p is row_of(p): p itself in the contiguous cache, the row its block table
// gives in the paged one.
//   out_head [head_dim], q_head [head_dim], scores [pos - first + 1] scratch
template <typename RowOf>
void attend_one_head(float* out_head, const float* q_head, int head, int pos, RowOf row_of,
                     const void* key_cache, const void* value_cache, float* scores,
                     const AttentionShape& shape, KvType type) {
    const auto dot = active_level == SimdLevel::Avx512 ? avx512::dot_kv
                     : active_level == SimdLevel::Avx2 ? avx2::dot_kv
                                                       : scalar::dot_kv;
    const auto add_scaled = active_level == SimdLevel::Avx512 ? avx512::add_scaled_kv
                            : active_level == SimdLevel::Avx2 ? avx2::add_scaled_kv
                                                              : scalar::add_scaled_kv;
    const int first = attention_start(pos, shape.window);
    const int positions = pos - first + 1;
    const int group = shape.heads / shape.kv_heads;  // query heads per KV head
    const size_t row_bytes = size_t(shape.kv_heads) * shape.head_dim * kv_element_bytes(type);
    const size_t head_offset = size_t(head / group) * shape.head_dim * kv_element_bytes(type);
    const uint8_t* keys = static_cast<const uint8_t*>(key_cache) + head_offset;
    const uint8_t* values = static_cast<const uint8_t*>(value_cache) + head_offset;
    for (int t = 0; t < positions; ++t)
        scores[t] =
            dot(q_head, keys + row_of(first + t) * row_bytes, shape.head_dim, type) * shape.scale;
    if (shape.softcap > 0) softcap(scores, positions, shape.softcap);
    softmax(scores, positions, shape.sinks ? shape.sinks[head] : -INFINITY);
    std::fill(out_head, out_head + shape.head_dim, 0.0f);
    for (int t = 0; t < positions; ++t)
        add_scaled(out_head, scores[t], values + row_of(first + t) * row_bytes, shape.head_dim,
                   type);
}

// The contiguous cache: position p is row p.
size_t contiguous_row(int pos) { return size_t(pos); }

}  // namespace

void attention(float* out, const float* q, int pos, const void* key_cache, const void* value_cache,
               float* scores, const AttentionShape& shape, KvType type) {
    const size_t work = size_t(shape.heads) * (pos + 1) * shape.head_dim * 2;
#pragma omp parallel for schedule(static) num_threads(threads_for(work))
    for (int h = 0; h < shape.heads; ++h)
        attend_one_head(out + size_t(h) * shape.head_dim, q + size_t(h) * shape.head_dim, h, pos,
                        contiguous_row, key_cache, value_cache, scores + size_t(h) * (pos + 1),
                        shape, type);
}

void attention_paged(float* out, const float* q, int count, const int* positions,
                     const int* const* block_tables, const PagedKvLayer& cache,
                     const AttentionShape& shape) {
    const size_t q_dim = size_t(shape.heads) * shape.head_dim;
    int longest = 0;  // positions attended by one row at most
    size_t work = 0;
    for (int i = 0; i < count; ++i) {
        const int attended = positions[i] + 1 - attention_start(positions[i], shape.window);
        longest = std::max(longest, attended);
        work += q_dim * attended * 2;
    }
#pragma omp parallel num_threads(threads_for(work))
    {
        static thread_local std::vector<float> scores;  // this thread's scratch
        scores.resize(longest);
#pragma omp for collapse(2) schedule(dynamic, 4)
        for (int i = 0; i < count; ++i)
            for (int h = 0; h < shape.heads; ++h) {
                const int* block_table = block_tables[i];
                const auto row_of = [&](int pos) {
                    return paged_row(block_table, pos, cache.block_size);
                };
                attend_one_head(out + i * q_dim + size_t(h) * shape.head_dim,
                                q + i * q_dim + size_t(h) * shape.head_dim, h, positions[i], row_of,
                                cache.keys, cache.values, scores.data(), shape, cache.type);
            }
    }
}

void attention_batch(float* out, const float* q, int count, int first_pos, const void* key_cache,
                     const void* value_cache, const AttentionShape& shape, KvType type) {
    const size_t q_dim = size_t(shape.heads) * shape.head_dim;
    const size_t work = q_dim * count * (first_pos + count) * 2;
    if (active_level < SimdLevel::Avx2) {
#pragma omp parallel num_threads(threads_for(work))
        {
            std::vector<float> scores(first_pos + count);  // this thread's scratch
#pragma omp for collapse(2) schedule(dynamic, 4)
            for (int i = 0; i < count; ++i)
                for (int h = 0; h < shape.heads; ++h)
                    attend_one_head(out + i * q_dim + size_t(h) * shape.head_dim,
                                    q + i * q_dim + size_t(h) * shape.head_dim, h, first_pos + i,
                                    contiguous_row, key_cache, value_cache, scores.data(), shape,
                                    type);
        }
        return;
    }
    // AVX2 and AVX-512: per KV head, its keys and values become f32 tiles (the threads
    // sharing them), then blocks of its query rows attend; the implicit barriers keep the
    // steps apart.
    const bool avx512_rows = active_level == SimdLevel::Avx512;
    const int row_tile = avx512_rows ? avx512::kAttentionRowTile : avx2::kRowTile;
    const auto attention_rows = avx512_rows ? avx512::attention_rows : avx2::attention_rows;
    const int first_key = attention_start(first_pos, shape.window);
    const int keys = first_pos + count - first_key;
    const int rows = count * (shape.heads / shape.kv_heads);  // query rows per KV head
    // The buffers are kept from call to call (every layer's attention would otherwise map
    // fresh pages): the tiles belong to the calling thread, each scratch to its thread. The
    // tiles start on a cache line, as the AVX-512 rows read them.
    static thread_local std::vector<float> tile_storage;
    tile_storage.resize(avx2::kv_tiles_floats(keys, shape.head_dim) + avx512::kGemmTokenTile);
    const avx2::KvTiles tiles =
        avx2::kv_tiles(avx512::align64(tile_storage.data()), first_key, keys, shape.head_dim);
#pragma omp parallel num_threads(threads_for(work))
    {
        static thread_local std::vector<float> scratch;
        scratch.resize(avx512_rows ? avx512::attention_scratch_floats(keys, shape.head_dim)
                                   : avx2::attention_scratch_floats(keys, shape.head_dim));
        for (int kv_head = 0; kv_head < shape.kv_heads; ++kv_head) {
#pragma omp for schedule(static)
            for (int tile = 0; tile < avx2::kv_tile_count(keys); ++tile)
                avx2::pack_kv_tile(tiles, key_cache, value_cache, kv_head, tile, shape, type);
#pragma omp for schedule(dynamic)
            for (int first_row = 0; first_row < rows; first_row += row_tile)
                attention_rows(out, q, first_row, std::min(row_tile, rows - first_row), first_pos,
                               kv_head, tiles, shape, scratch.data());
        }
    }
}

}  // namespace barellm::cpu
