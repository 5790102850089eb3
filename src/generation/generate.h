// Text generation: the model with its tokenizer, a prompt's ids, and the loop that runs
// the prompt and then picks, streams and feeds back one token at a time until a stop.
// `barellm run` and the ladder's --check-text both generate with it.
#pragma once
#include <atomic>
#include <functional>
#include <string>
#include <vector>

#include "backend.h"
#include "generation/sampler.h"
#include "tokenizer/tokenizer.h"
#include "weights/model.h"

namespace barellm {

struct ModelAndTokenizer {
    Model model;
    Tokenizer tokenizer;
};

// The tokenizer stored in the model's weight file (its barellm.tokenizer metadata), every id
// of it inside the model's vocabulary.
Tokenizer load_tokenizer(const Model& model);
ModelAndTokenizer load_model_and_tokenizer(const std::string& path);

// The ids of `text`, after the model's BOS when `add_bos` and the model has one.
std::vector<int> encode_prompt(const Tokenizer& tokenizer, const Config& config,
                               const std::string& text, bool add_bos, bool parse_special);

// Throws Error when one of the n logits is NaN or Inf, naming the position they predict from.
void check_finite(const float* logits, int n, int pos);

// How the prompt reaches the backend: one prefill batch, or one forward step per token.
enum class PromptFeed { OneBatch, TokenByToken };

struct GenerateOptions {
    int max_tokens = 0;  // the most new tokens (-n)
    int context = 0;     // positions in the KV cache: generation stops when they are full
    // Where the prompt starts. A later turn of a conversation passes the position after the
    // earlier turns, whose keys and values the backend's KV cache already holds.
    int first_pos = 0;
    PromptFeed prompt_feed = PromptFeed::OneBatch;
    int end_of_turn = -1;  // a token that also stops, besides the model's EOS ids; -1: none
    // Texts that end the output before them (--stop), even when split across tokens.
    std::vector<std::string> stop_strings;
    // The special tokens' texts are streamed too (harmony's channel markers), not skipped.
    bool keep_special_text = false;
    const std::atomic<bool>* interrupted = nullptr;  // set (Ctrl-C): stop before the next token
};

enum class StopReason { TokenLimit, EndOfText, ContextFull, Interrupted, StopString };

struct GenerateStats {
    int prompt_tokens = 0;
    double prefill_seconds = 0;
    int generated_tokens = 0;  // the stopping EOS or end-of-turn token included
    double decode_seconds = 0;
    StopReason stop_reason = StopReason::TokenLimit;
    // The positions the KV cache holds afterwards: first_pos, the prompt, and every
    // generated token that was run through the model.
    int end_pos = 0;
    // The last generated token when it was printed but not run through the model (the
    // loop stopped right after drawing it); -1 when there is none. A conversation's next
    // turn starts with it.
    int unfed_token = -1;
};

// Runs `prompt`, then draws each new token from the logits with `sampler` (greedy at
// temperature 0), every prompt and drawn token accepted into the sampler's history. A stop
// token ends the text unprinted; the others go to `on_text` as decoded pieces, each
// complete UTF-8, the last one when the loop ends, cut before the first stop string.
// Logits that are not finite throw Error naming the position.
GenerateStats generate(Backend& backend, const Config& config, const Tokenizer& tokenizer,
                       Sampler& sampler, const std::vector<int>& prompt,
                       const GenerateOptions& options,
                       const std::function<void(const std::string&)>& on_text);

// The stop as `barellm run` reports it: "reached -n", "end of text", ...
std::string stop_reason_text(StopReason reason, int context);

// The statistics line `run` and `chat` print on stderr after the text:
// "prompt: N tokens, X tok/s | generated: M tokens, Y tok/s | stopped: REASON".
std::string stats_line(const GenerateStats& stats, int context);

}  // namespace barellm
