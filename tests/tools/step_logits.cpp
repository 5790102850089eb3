// Test tool: runs several sequences at once through a backend's server step (Backend::step
// over the paged KV cache) and writes the logits of every position of every sequence,
// sequence after sequence, as raw little-endian float32 [positions, vocab]; the rows of
// positions whose logits were not asked for hold NaN.
//   step_logits MODEL OUT_FILE --seq ID,ID,... [--seq ...] [--chunks N,N,...]
//               [--block-size N] [--kv f16|f32] [--device cpu|cuda] [--simd LEVEL]
//               [--seed S] [--sparse-logits] [--copy-blocks]
// - Each step takes the next chunk of every unfinished sequence, as many rows as the
//   backend's max_batch allows: sequence i's chunks are chunks[i % count] positions (default
//   1: one row a step, as decoding runs), so one step mixes decode rows and prompt chunks.
// - The block tables draw their blocks from a pool shuffled by --seed, so the blocks of the
//   sequences interleave in the pool.
// - --sparse-logits: only the last row of each chunk and the rows at positions that are a
//   multiple of 3 ask for logits (the others stay NaN in the output).
// - --copy-blocks: after every step, the first block of each sequence is copied
//   (copy_kv_block) into a free block that takes its place in the table, the old one freed:
//   the logits must not change.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend.h"
#include "cpu/kernels.h"
#include "util/error.h"

using namespace barellm;

namespace {

std::vector<int> parse_ints(const std::string& text) {
    std::vector<int> values;
    size_t start = 0;
    while (start <= text.size()) {
        const size_t comma = std::min(text.find(',', start), text.size());
        values.push_back(std::stoi(text.substr(start, comma - start)));
        start = comma + 1;
    }
    return values;
}

struct Sequence {
    std::vector<int> ids;
    int chunk = 1;
    int done = 0;             // positions run
    std::vector<int> table;   // its blocks
    size_t first_output = 0;  // its first row in the output
};

}  // namespace

int main(int argc, char** argv) {
    try {
        if (argc < 4)
            throw Error(
                "usage: step_logits MODEL OUT_FILE --seq ID,ID,... [--seq ...] [--chunks "
                "N,N,...] [--block-size N] [--kv f16|f32] [--device cpu|cuda] [--simd LEVEL] "
                "[--seed S] [--sparse-logits] [--copy-blocks]");
        std::vector<Sequence> sequences;
        std::vector<int> chunks = {1};
        int block_size = 16;
        unsigned seed = 1;
        bool sparse_logits = false, copy_blocks = false;
        BackendOptions options;
        for (int i = 3; i < argc; ++i) {
            const std::string arg = argv[i];
            const bool has_value = i + 1 < argc;
            if (arg == "--seq" && has_value) {
                sequences.emplace_back();
                sequences.back().ids = parse_ints(argv[++i]);
            } else if (arg == "--chunks" && has_value) {
                chunks = parse_ints(argv[++i]);
            } else if (arg == "--block-size" && has_value) {
                block_size = std::stoi(argv[++i]);
            } else if (arg == "--seed" && has_value) {
                seed = unsigned(std::stoul(argv[++i]));
            } else if (arg == "--kv" && has_value) {
                options.kv_type = std::strcmp(argv[++i], "f32") == 0 ? KvType::F32 : KvType::F16;
            } else if (arg == "--device" && has_value) {
                options.device = std::strcmp(argv[++i], "cuda") == 0 ? Device::Cuda : Device::Cpu;
            } else if (arg == "--simd" && has_value) {
                cpu::SimdLevel level;
                if (!cpu::parse_simd_level(argv[++i], &level))
                    throw Error(std::string("--simd: unknown level ") + argv[i]);
                cpu::set_simd_level(std::min(level, cpu::detect_simd_level()));
            } else if (arg == "--sparse-logits") {
                sparse_logits = true;
            } else if (arg == "--copy-blocks") {
                copy_blocks = true;
            } else {
                throw Error("unknown argument " + arg);
            }
        }
        if (sequences.empty()) throw Error("no --seq given");
        for (int chunk : chunks)
            if (chunk < 1) throw Error("--chunks: each chunk holds 1 position or more");

        // The pool: every sequence's blocks, one spare per sequence for the copies, shuffled.
        int blocks = 0, longest = 0;
        size_t positions = 0;
        for (size_t s = 0; s < sequences.size(); ++s) {
            Sequence& sequence = sequences[s];
            if (sequence.ids.empty()) throw Error("an empty --seq");
            sequence.chunk = chunks[s % chunks.size()];
            sequence.first_output = positions;
            positions += sequence.ids.size();
            longest = std::max(longest, int(sequence.ids.size()));
            blocks += (int(sequence.ids.size()) + block_size - 1) / block_size + 1;
        }
        std::vector<int> free_blocks(blocks);
        std::iota(free_blocks.begin(), free_blocks.end(), 0);
        std::mt19937 rng(seed);
        std::shuffle(free_blocks.begin(), free_blocks.end(), rng);
        auto take_block = [&] {
            const int block = free_blocks.back();
            free_blocks.pop_back();
            return block;
        };

        const Model model = Model::load(argv[1]);
        options.context = longest;
        options.kv_blocks = blocks;
        options.kv_block_size = block_size;
        auto backend = make_backend(model, options);
        const size_t vocab = model.config.vocab_size;
        std::vector<float> out(positions * vocab, NAN);

        std::vector<StepRow> rows;
        std::vector<size_t> wanted_outputs;  // the output row of each row that wants logits
        for (;;) {
            rows.clear();
            wanted_outputs.clear();
            for (Sequence& sequence : sequences) {
                const int length = int(sequence.ids.size());
                const int room = backend->max_batch() - int(rows.size());
                const int count = std::min({sequence.chunk, length - sequence.done, room});
                if (count == 0) continue;
                // The table first: the rows point into it.
                while (int(sequence.table.size()) * block_size < sequence.done + count)
                    sequence.table.push_back(take_block());
                for (int k = 0; k < count; ++k) {
                    const int pos = sequence.done + k;
                    const bool wants = !sparse_logits || k == count - 1 || pos % 3 == 0;
                    rows.push_back(StepRow{sequence.ids[pos], pos, sequence.table.data(), wants});
                    if (wants) wanted_outputs.push_back(sequence.first_output + pos);
                }
                sequence.done += count;
            }
            if (rows.empty()) break;
            const float* logits = backend->step(rows.data(), int(rows.size()));
            for (size_t w = 0; w < wanted_outputs.size(); ++w)
                std::copy(logits + w * vocab, logits + (w + 1) * vocab,
                          out.begin() + wanted_outputs[w] * vocab);
            if (copy_blocks)
                for (Sequence& sequence : sequences) {
                    if (sequence.table.empty()) continue;
                    const int copy = take_block();
                    backend->copy_kv_block(sequence.table[0], copy);
                    free_blocks.insert(free_blocks.begin(), sequence.table[0]);
                    sequence.table[0] = copy;
                }
        }

        FILE* file = std::fopen(argv[2], "wb");
        if (!file) throw Error(std::string(argv[2]) + ": cannot write");
        const bool written = std::fwrite(out.data(), sizeof(float), out.size(), file) == out.size();
        if (std::fclose(file) != 0 || !written)
            throw Error(std::string(argv[2]) + ": cannot write");
        return 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "step_logits: %s\n", e.what());
        return 1;
    }
}
