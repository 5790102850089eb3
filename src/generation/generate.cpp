// The generation loop (generate.h): prompt, then sample, stream and feed back until a stop.
#include "generation/generate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "generation/stop_strings.h"
#include "util/error.h"
#include "util/timing.h"

namespace barellm {

namespace {

// Runs the prompt from options.first_pos; returns the logits of its last token.
const float* run_prompt(Backend& backend, const std::vector<int>& prompt,
                        const GenerateOptions& options) {
    if (prompt.empty()) throw Error("generate: the prompt has no tokens");
    if (options.prompt_feed == PromptFeed::OneBatch)
        return backend.prefill(prompt.data(), int(prompt.size()), options.first_pos, false);
    const float* logits = nullptr;
    for (size_t i = 0; i < prompt.size(); ++i)
        logits = backend.forward(prompt[i], options.first_pos + int(i));
    return logits;
}

bool is_stop(const Config& config, const GenerateOptions& options, int id) {
    return id == options.end_of_turn ||
           std::find(config.eos_ids.begin(), config.eos_ids.end(), id) != config.eos_ids.end();
}

}  // namespace

void check_finite(const float* logits, int n, int pos) {
    for (int i = 0; i < n; ++i)
        if (!std::isfinite(logits[i]))
            throw Error("logits at position " + std::to_string(pos) +
                        " are not finite (NaN or Inf): the weights or the computation are broken");
}

Tokenizer load_tokenizer(const Model& model) {
    return Tokenizer::from_json(model.file->metadata_value("barellm.tokenizer"),
                                model.config.vocab_size);
}

ModelAndTokenizer load_model_and_tokenizer(const std::string& path) {
    Model model = Model::load(path);
    Tokenizer tokenizer = load_tokenizer(model);
    return {std::move(model), std::move(tokenizer)};
}

std::vector<int> encode_prompt(const Tokenizer& tokenizer, const Config& config,
                               const std::string& text, bool add_bos, bool parse_special) {
    std::vector<int> ids;
    if (add_bos && config.bos_id >= 0) ids.push_back(config.bos_id);
    for (int id : tokenizer.encode(text, parse_special)) ids.push_back(id);
    return ids;
}

GenerateStats generate(Backend& backend, const Config& config, const Tokenizer& tokenizer,
                       Sampler& sampler, const std::vector<int>& prompt,
                       const GenerateOptions& options,
                       const std::function<void(const std::string&)>& on_text) {
    GenerateStats stats;
    stats.prompt_tokens = int(prompt.size());
    StreamDecoder decoder(tokenizer, /*skip_special=*/!options.keep_special_text);
    for (int id : prompt) {
        decoder.push(id);  // so the continuation decodes in context
        sampler.accept(id);
    }
    StopStrings stops(options.stop_strings);
    const auto print = [&](const std::string& piece) {
        const std::string text = stops.push(piece);
        if (!text.empty()) on_text(text);
    };

    const auto prefill_start = Clock::now();
    const float* logits = run_prompt(backend, prompt, options);
    stats.prefill_seconds = seconds_since(prefill_start);

    std::vector<float> scratch(config.vocab_size);     // the sampler overwrites its input
    int pos = options.first_pos + int(prompt.size());  // where the next token goes
    const auto decode_start = Clock::now();
    while (stats.generated_tokens < options.max_tokens) {
        if (options.interrupted && *options.interrupted) {
            stats.stop_reason = StopReason::Interrupted;
            break;
        }
        check_finite(logits, config.vocab_size, pos - 1);
        std::copy(logits, logits + config.vocab_size, scratch.begin());
        const int next = sampler.sample(scratch.data());
        sampler.accept(next);
        ++stats.generated_tokens;
        if (is_stop(config, options, next)) {
            stats.stop_reason = StopReason::EndOfText;
            break;
        }
        stats.unfed_token = next;
        print(decoder.push(next));
        if (stops.stopped()) {
            stats.stop_reason = StopReason::StopString;
            break;
        }
        if (pos >= options.context) {
            stats.stop_reason = StopReason::ContextFull;
            break;
        }
        if (stats.generated_tokens < options.max_tokens) {
            logits = backend.forward(next, pos++);
            stats.unfed_token = -1;
        }
    }
    stats.decode_seconds = seconds_since(decode_start);
    print(decoder.flush());
    if (stops.stopped())
        stats.stop_reason = StopReason::StopString;
    else
        on_text(stops.flush());
    stats.end_pos = pos;
    return stats;
}

std::string stop_reason_text(StopReason reason, int context) {
    switch (reason) {
        case StopReason::TokenLimit:
            return "reached -n";
        case StopReason::EndOfText:
            return "end of text";
        case StopReason::ContextFull:
            return "context full (" + std::to_string(context) + " tokens)";
        case StopReason::Interrupted:
            return "interrupted";
        case StopReason::StopString:
            return "stop string";
    }
    throw Error("unknown stop reason");
}

std::string stats_line(const GenerateStats& stats, int context) {
    char line[256];
    std::snprintf(line, sizeof line,
                  "prompt: %d tokens, %.1f tok/s | generated: %d tokens, %.1f tok/s | stopped: ",
                  stats.prompt_tokens, stats.prompt_tokens / stats.prefill_seconds,
                  stats.generated_tokens,
                  stats.generated_tokens / std::max(stats.decode_seconds, 1e-9));
    return line + stop_reason_text(stats.stop_reason, context);
}

}  // namespace barellm
