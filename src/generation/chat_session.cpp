// The conversation of chat_session.h: turns rendered in the chat template, prefilled after
// the earlier ones, replies streamed; the commands /reset, /save FILE, /save! FILE, /help
// and /exit.
#include "generation/chat_session.h"

#include <unistd.h>

#include <cstdio>

#include "tokenizer/unicode.h"
#include "util/json.h"
#include "util/terminal.h"

namespace barellm {

namespace {

const char* const kColorInput = "\x1b[32m";  // green, as llama-cli writes the user's text
const char* const kColorReset = "\x1b[0m";
const char* const kPromptMarker = "> ";
const char* const kSaveCommand = "/save";
const char* const kReplacingSaveCommand = "/save!";
constexpr size_t kFailuresListed = 10;  // input lines named in the last line, at most

void say(const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); }

struct Message {
    std::string role, content;
};

// One conversation: its messages, and where it stands in the KV cache.
class Conversation {
public:
    Conversation(const Model& model, const Tokenizer& tokenizer, Backend& backend, Sampler& sampler,
                 const ChatFormat& format, const ChatSettings& settings)
        : model_(model),
          tokenizer_(tokenizer),
          backend_(backend),
          sampler_(sampler),
          format_(format),
          settings_(settings) {}

    // Prefills `message` as the next user turn and streams the reply to standard output.
    // Returns false, saying so, when the turn does not fit in the context left.
    bool take_turn(const std::string& message);

    void reset() {
        next_pos_ = 0;
        unfed_token_ = -1;
        rewritten_reply_.clear();
        messages_.clear();
        sampler_.clear_history();
    }

    // Writes the messages as a JSON array of {"role", "content"} (files.h's
    // write_file_safely: never half-written, never over the model or a special file);
    // an existing FILE only when `replace_existing` (/save!).
    void save(const std::string& path, bool replace_existing) const;

private:
    std::vector<int> turn_ids(const std::string& message) const;

    const Model& model_;
    const Tokenizer& tokenizer_;
    Backend& backend_;
    Sampler& sampler_;
    const ChatFormat& format_;
    const ChatSettings& settings_;
    int next_pos_ = 0;      // the first position the KV cache does not hold
    int unfed_token_ = -1;  // the last reply's last token, when the model has not run it
    // The last reply as the template writes it, for templates that rewrite replies
    // (chat_rewrites_replies): the KV cache holds the conversation up to the reply's start.
    std::string rewritten_reply_;
    std::vector<Message> messages_;
};

std::vector<int> Conversation::turn_ids(const std::string& message) const {
    if (next_pos_ == 0)
        return first_turn_ids(format_, tokenizer_, model_.config, settings_.system, message);
    std::vector<int> ids;
    if (unfed_token_ >= 0) ids.push_back(unfed_token_);
    const std::string text =
        rewritten_reply_ +
        render_next_turn(format_.chat, message, format_.bos_text, format_.eos_text);
    for (int id : tokenizer_.encode(text, /*parse_special=*/true)) ids.push_back(id);
    return ids;
}

bool Conversation::take_turn(const std::string& message) {
    const std::vector<int> ids = turn_ids(message);
    const int free_positions = settings_.context - next_pos_;
    if (int(ids.size()) > free_positions) {
        say("barellm: the context is full: this turn needs " + std::to_string(ids.size()) +
            " tokens and " + std::to_string(free_positions) + " of " +
            std::to_string(settings_.context) + " are free; /reset starts a new conversation");
        return false;
    }
    GenerateOptions generation;
    generation.max_tokens = settings_.max_reply_tokens;
    generation.context = settings_.context;
    generation.first_pos = next_pos_;
    generation.end_of_turn = format_.end_of_turn;
    generation.stop_strings = settings_.stop_strings;
    // A reply whose markup is written with special tokens (harmony's channels) is shown as
    // its answer only; other replies as they are generated.
    const ChatFamily family = format_.chat.family;
    const bool answer_only = chat_markup_is_special(family);
    generation.keep_special_text = answer_only;
    generation.interrupted = &interrupted;
    interrupted = false;
    ReasoningFilter reasoning_filter(chat_reasoning_markup(family));
    std::string reply;
    const auto show = [&reply](const std::string& text) {
        write_now(text);
        reply += text;
    };
    const GenerateStats stats =
        generate(backend_, model_.config, tokenizer_, sampler_, ids, generation,
                 [&](const std::string& piece) {
                     show(answer_only ? reasoning_filter.feed(piece) : piece);
                 });
    show(reasoning_filter.finish());
    write_now("\n");
    interrupted = false;
    if (chat_rewrites_replies(family)) {
        // The next turn writes the reply again as the template does, from the reply's start.
        next_pos_ += int(ids.size());
        unfed_token_ = -1;
        rewritten_reply_ = render_reply(format_.chat, reply);
    } else {
        next_pos_ = stats.end_pos;
        unfed_token_ = stats.unfed_token;
    }
    if (settings_.system && messages_.empty()) messages_.push_back({"system", *settings_.system});
    messages_.push_back({"user", message});
    messages_.push_back({"assistant", reply});
    say(stats_line(stats, settings_.context) + " | context: " + std::to_string(next_pos_) + "/" +
        std::to_string(settings_.context) + " tokens");
    if (stats.stop_reason == StopReason::ContextFull)
        say("barellm: the context is full; /reset starts a new conversation");
    return true;
}

void Conversation::save(const std::string& path, bool replace_existing) const {
    nlohmann::json messages = nlohmann::json::array();
    for (const Message& message : messages_)
        messages.push_back({{"role", message.role}, {"content", message.content}});
    const std::string text =
        messages.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
    WriteRules rules;
    rules.replace_existing = replace_existing;
    rules.how_to_replace =
        std::string(kReplacingSaveCommand) + " " + shown_path(path) + " replaces it";
    rules.inputs = settings_.inputs;
    try {
        write_file_safely(path, text, rules);
    } catch (const Error& e) {
        throw Error(std::string(replace_existing ? kReplacingSaveCommand : kSaveCommand) + ": " +
                    e.what());
    }
}

enum class Command { Message, Exit, Reset, Save, ReplacingSave, Help };

// What /help prints.
const char* const kCommandHelp =
    "barellm: the commands: /save FILE writes the conversation as JSON to a new FILE (- for "
    "standard output); /save! FILE also replaces an existing regular FILE; /reset starts a "
    "new conversation; /exit leaves; /help shows this. Any other line is a message.";

// `line` is `command` alone or followed by a space and an argument, which goes to
// `argument` ("" when alone).
bool is_command(const std::string& line, const std::string& command, std::string* argument) {
    if (line != command && line.compare(0, command.size() + 1, command + " ") != 0) return false;
    *argument = line.size() > command.size() ? line.substr(command.size() + 1) : "";
    return true;
}

// What a typed line asks for: the commands are "/exit", "/reset", "/help", "/save FILE" and
// "/save! FILE"; any other line, even one starting with "/", is a message.
Command command_of(const std::string& line, std::string* argument) {
    if (line == "/exit") return Command::Exit;
    if (line == "/reset") return Command::Reset;
    if (line == "/help") return Command::Help;
    if (is_command(line, kSaveCommand, argument)) return Command::Save;
    if (is_command(line, kReplacingSaveCommand, argument)) return Command::ReplacingSave;
    return Command::Message;
}

// The input lines whose turn or /save failed, for the last line of a conversation whose input
// is not a terminal.
class Failures {
public:
    void add(long line, const std::string& what) {
        ++count_;
        if (listed_.size() < kFailuresListed)
            listed_.push_back("line " + std::to_string(line) + " (" + what + ")");
    }
    bool any() const { return count_ > 0; }
    // "barellm: 2 lines of the input failed: line 3 (/save), line 5 (/save!)"
    std::string summary() const {
        std::string text =
            "barellm: " + std::to_string(count_) +
            (count_ == 1 ? " line of the input failed: " : " lines of the input failed: ");
        for (size_t i = 0; i < listed_.size(); ++i) text += (i ? ", " : "") + listed_[i];
        if (count_ > listed_.size())
            text += " and " + std::to_string(count_ - listed_.size()) + " more";
        return text;
    }

private:
    size_t count_ = 0;
    std::vector<std::string> listed_;
};

}  // namespace

ChatFormat load_chat_format(const Model& model, const Tokenizer& tokenizer,
                            const std::string& command) {
    const Config& config = model.config;
    const auto& metadata = model.file->metadata();
    const auto found = metadata.find("barellm.chat_template");
    if (found == metadata.end())
        throw Error(command +
                    ": this model has no chat template (its tokenizer_config.json had no "
                    "chat_template when it was converted)");
    ChatFormat format;
    format.chat = recognise_chat_template(found->second);
    format.bos_text = config.bos_id >= 0 ? tokenizer.token_text(config.bos_id) : "";
    format.eos_text = config.eos_ids.empty() ? "" : tokenizer.token_text(config.eos_ids[0]);
    const std::string turn_end = chat_end_of_turn(format.chat.family);
    if (!turn_end.empty()) {
        const auto id = tokenizer.token_id(turn_end);
        if (!id) throw Error(command + ": the tokenizer has no " + turn_end + " token");
        format.end_of_turn = *id;
    }
    return format;
}

std::vector<int> first_turn_ids(const ChatFormat& format, const Tokenizer& tokenizer,
                                const Config& config, const std::optional<std::string>& system,
                                const std::string& prompt, bool enable_thinking) {
    const std::string text =
        render_chat(format.chat, system, prompt, format.bos_text, enable_thinking);
    const bool add_bos = config.add_bos && config.bos_id >= 0 &&
                         text.compare(0, format.bos_text.size(), format.bos_text) != 0;
    return encode_prompt(tokenizer, config, text, add_bos, /*parse_special=*/true);
}

int run_chat(const Model& model, const Tokenizer& tokenizer, Backend& backend, Sampler& sampler,
             const ChatFormat& format, const ChatSettings& settings) {
    const bool interactive = is_terminal(STDIN_FILENO);
    const bool color = settings.color && is_terminal(STDOUT_FILENO);
    Conversation conversation(model, tokenizer, backend, sampler, format, settings);
    if (interactive)
        say(std::string("barellm chat (") + chat_family_name(format.chat.family) +
            " template): Ctrl-C stops a reply; /reset starts over; /save FILE writes the "
            "conversation (/save! FILE over an existing file); /help lists the commands; "
            "/exit, Ctrl-D or Ctrl-C at the prompt leaves");
    catch_interrupts();
    LineReader reader;
    Failures failures;
    long line_number = 0;
    const auto finish = [&] {
        if (interactive || !failures.any()) return 0;
        say(failures.summary());
        return 1;
    };
    for (;;) {
        if (interactive) write_now(std::string(color ? kColorInput : "") + kPromptMarker);
        std::string line;
        const LineReader::Status status = reader.read_line(&line);
        if (color) write_now(kColorReset);
        if (status == LineReader::Status::End || status == LineReader::Status::Interrupted) {
            if (interactive) write_now("\n");
            break;
        }
        ++line_number;
        if (status == LineReader::Status::TooLong) {
            say("barellm: line " + std::to_string(line_number) + " is longer than " +
                std::to_string(LineReader::kMaxLineBytes) +
                " bytes; it was not sent, the conversation goes on");
            failures.add(line_number, "a line too long");
            continue;
        }
        std::string argument;
        const Command command = command_of(line, &argument);
        switch (command) {
            case Command::Exit:
                return finish();
            case Command::Reset:
                conversation.reset();
                say("barellm: a new conversation");
                break;
            case Command::Help:
                say(kCommandHelp);
                break;
            case Command::Save:
            case Command::ReplacingSave: {
                const bool replace = command == Command::ReplacingSave;
                const std::string name = replace ? kReplacingSaveCommand : kSaveCommand;
                if (argument.find_first_not_of(' ') == std::string::npos) {  // none, or spaces
                    say("barellm: " + name + " needs a file name: " + name + " FILE");
                    failures.add(line_number, name);
                    break;
                }
                try {
                    conversation.save(argument, replace);
                    if (argument != "-")
                        say("barellm: the conversation is in " + shown_path(argument));
                } catch (const Error& e) {
                    say(std::string("barellm: ") + e.what());
                    failures.add(line_number, name);
                }
                break;
            }
            case Command::Message: {
                if (line.empty()) break;
                const size_t invalid = unicode::first_invalid_utf8(line);
                if (invalid != std::string::npos) {
                    say("barellm: this message is not valid UTF-8 (byte " +
                        std::to_string(invalid) + " of line " + std::to_string(line_number) +
                        "); it was not sent, the conversation goes on");
                    failures.add(line_number, "a message that is not UTF-8");
                    break;
                }
                if (!conversation.take_turn(line))
                    failures.add(line_number, "a turn the context had no room for");
                break;
            }
        }
    }
    return finish();
}

}  // namespace barellm
