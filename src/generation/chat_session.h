// `barellm chat` and `run --chat`: a conversation in the model's own chat template
// (src/tokenizer/chat.h). The conversation lives in the KV cache: each turn prefills only
// its own tokens (the end of the previous reply's turn, the user message, the generation
// prompt) after the positions the earlier turns filled, and generate() streams the reply.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "backend.h"
#include "util/files.h"
#include "generation/generate.h"
#include "weights/model.h"
#include "generation/sampler.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"

namespace barellm {

// The model's chat template with the token texts and ids its renderings need.
struct ChatFormat {
    ChatTemplate chat;
    std::string bos_text, eos_text;  // "" when the model has no such token
    int end_of_turn = -1;            // the token that ends a reply besides EOS; -1: none
};

// The format of the model's barellm.chat_template. Throws Error, its message starting with
// `command` ("--chat", "chat"), when there is none or it is not recognised.
ChatFormat load_chat_format(const Model& model, const Tokenizer& tokenizer,
                            const std::string& command);

// The ids of a conversation's first turn: the optional system message and `prompt`
// rendered, special tokens parsed, BOS added only when the model adds one and the
// rendering does not start with it already. `enable_thinking` false: rendered as Qwen3's
// enable_thinking=False (refused by templates without that switch).
std::vector<int> first_turn_ids(const ChatFormat& format, const Tokenizer& tokenizer,
                                const Config& config, const std::optional<std::string>& system,
                                const std::string& prompt, bool enable_thinking = true);

struct ChatSettings {
    int context = 0;                    // positions of the KV cache
    int max_reply_tokens = 0;           // -n
    std::optional<std::string> system;  // --system
    std::vector<std::string> stop_strings;
    bool color = false;  // --color: the prompt marker and typed text in colour
    // The files being read (the model): /save never replaces them.
    std::vector<FileIdentity> inputs;
};

// Runs the conversation on standard input and output until /exit, Ctrl-D, the end of the
// input or Ctrl-C at the prompt. On a terminal it prompts with "> "; otherwise each line
// is one user message (empty lines are skipped) and only the replies are printed, each
// followed by a newline. A refused turn (not valid UTF-8, longer than a line may be, no
// room left in the context) or /save says why in one line and the conversation goes on.
// Returns the exit status: 0, or 1 when the input was not a terminal and a turn or /save
// failed, the last line on stderr then naming the input lines that failed.
int run_chat(const Model& model, const Tokenizer& tokenizer, Backend& backend, Sampler& sampler,
             const ChatFormat& format, const ChatSettings& settings);

}  // namespace barellm
