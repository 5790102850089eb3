// `run --chat`: a prompt wrapped in the model's own chat template, without a Jinja engine.
// The template text (barellm.chat_template, docs/FORMAT.md) is recognised as one of the
// families below by distinctive markers, and the family's built-in rendering produces the
// exact string Hugging Face's
//     apply_chat_template([{"role": "system", "content": system},   # with --system only
//                          {"role": "user", "content": prompt}],
//                         tokenize=False, add_generation_prompt=True)
// gives for that conversation (tests/test_chat.py checks this against jinja2 on the
// real templates). Any other template is refused with an Error naming what was missing.
//
//   ChatML   <|im_start|> ... <|im_end|> templates (SmolLM2, Qwen2, OpenHermes):
//              [<|im_start|>system\n{system or default system}<|im_end|>\n]
//              <|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n
//            The system turn appears with --system, or when the template writes a
//            literal one for conversations that bring none (SmolLM2: "You are a helpful AI
//            assistant named SmolLM, trained by Hugging Face"; Qwen2: "You are a helpful
//            assistant."; Qwen2.5: "You are Qwen, created by Alibaba Cloud. You are a
//            helpful assistant."). End of turn: <|im_end|>.
//            Qwen3's template has a thinking switch: with enable_thinking=False (--no-think)
//            the generation prompt is followed by an empty "<think>\n\n</think>\n\n".
//            Phi-4's separates the role with <|im_sep|> and the turns with nothing:
//              [<|im_start|>system<|im_sep|>{system}<|im_end|>]
//              <|im_start|>user<|im_sep|>{prompt}<|im_end|><|im_start|>assistant<|im_sep|>
//   Llama3   Meta-Llama-3-Instruct (`message['content'] | trim`):
//              {bos}[<|start_header_id|>system<|end_header_id|>\n\n{trim(system)}<|eot_id|>]
//              <|start_header_id|>user<|end_header_id|>\n\n{trim(prompt)}<|eot_id|>
//              <|start_header_id|>assistant<|end_header_id|>\n\n
//            End of turn: <|eot_id|>.
//   Llama31  Llama 3.1, 3.2, 3.3 Instruct: as Llama3, but the system turn is always there
//            and dated:
//              {bos}<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date:
//              {knowledge}\nToday Date: {date}\n\n{trim(system)}<|eot_id|>{user turn as Llama3}
//            {date} is the template's date_string default ("26 Jul 2024" in 3.1 and 3.3),
//            or today as strftime("%d %b %Y") where it calls strftime_now (3.2). Tools:
//            chat_tools.h (the server's function calling).
//   Llama2   [INST] templates, two variants:
//              Llama-2-chat (`content.strip()`):
//                {bos}[INST] {strip([<<SYS>>\n{system}\n<</SYS>>\n\n]prompt)} [/INST]
//              Mistral-Instruct v0.1/v0.2 (no system role):  {bos}[INST] {prompt} [/INST]
//            The turn ends with EOS, already a stop token.
//   Gemma    <start_of_turn> ... <end_of_turn> templates (`message['content'] | trim`, the
//            assistant's role written "model"):
//              {bos}<start_of_turn>user\n[{system}\n\n]{trim(prompt)}<end_of_turn>\n
//              <start_of_turn>model\n
//            Gemma 3 folds the system message (untrimmed) into the first user turn; Gemma 1
//            and 2 refuse one. End of turn: <end_of_turn>.
//   Phi      <|user|> ... <|end|> templates (Phi-3, Phi-3.5, Phi-4-mini):
//              [<|system|>\n{system}<|end|>\n]<|user|>\n{prompt}<|end|>\n<|assistant|>\n
//            Phi-4-mini writes no newlines; Phi-3.5 leaves out an empty system message.
//            End of turn: <|end|>.
//   Harmony  OpenAI's gpt-oss (<|start|>ROLE<|message|>...<|end|>, the assistant's messages on
//            channels): a system message is always written, dated, and --system becomes a
//            developer message (left out when empty):
//              <|start|>system<|message|>{identity}\nKnowledge cutoff: {knowledge}\n
//              Current date: {date}\n\nReasoning: {effort}\n\n# Valid channels: analysis,
//              commentary, final. Channel must be included for every message.<|end|>
//              [<|start|>developer<|message|># Instructions\n\n{system}\n\n<|end|>]
//              <|start|>user<|message|>{prompt}<|end|><|start|>assistant
//            {identity}, {knowledge} and {effort} are the template's (model_identity "You are
//            ChatGPT, a large language model trained by OpenAI.", "2024-06", reasoning_effort
//            "medium"); {date} is today as strftime("%Y-%m-%d"). The model answers
//              <|channel|>analysis<|message|>{reasoning}<|end|>
//              <|start|>assistant<|channel|>final<|message|>{answer}<|return|>
//            and the turn ends with <|return|> (or <|call|>, a tool call). Only the final
//            channel is the answer (HarmonyChannelFilter); the template drops the reasoning
//            of past turns. Its tools are not rendered.
// A conversation goes on after the assistant's reply with render_next_turn: the end of the
// reply's turn, then the next user message and the generation prompt, as the template
// writes them between an assistant message and the next user message (the system message
// only ever comes first):
//   ChatML   <|im_end|>\n<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n
//            (Phi-4: <|im_end|><|im_start|>user<|im_sep|>{prompt}<|im_end|>...)
//   Llama3, Llama31   <|eot_id|>{user turn as Llama3}
//   Llama2   Llama-2-chat:       " " eos {bos}[INST] {strip(prompt)} [/INST]
//            Mistral-Instruct:   eos[ ][INST] {prompt} [/INST]  (v0.1 writes the space,
//                                Mixtral-Instruct v0.1 does not)
//   Gemma    <end_of_turn>\n<start_of_turn>user\n{trim(prompt)}<end_of_turn>\n
//              <start_of_turn>model\n
//   Phi      <|end|>\n<|user|>\n{prompt}<|end|>\n<|assistant|>\n
//   Harmony  <|end|><|start|>user<|message|>{prompt}<|end|><|start|>assistant
// The reply itself is written between the two as render_reply gives it: what the model
// generated, as the KV cache holds it, except where the template rewrites it
// (chat_rewrites_replies). Llama-2-chat, the Llama 3 families and Gemma write it stripped, so a
// reply with surrounding spaces (other than the one Llama-2-chat writes before it) renders
// differently there; Harmony writes only the answer, as <|channel|>final<|message|>{answer}.
// trim/strip remove leading and trailing whitespace as Python's str.strip() does.
#pragma once
#include <optional>
#include <string>

namespace barellm {

enum class ChatFamily { ChatML, Llama3, Llama31, Llama2, Gemma, Phi, Harmony };

// How a template writes tools, calls and their results (chat_tools.h): not at all, Qwen2.5's
// and Qwen3's Hermes-style <tool_call> tags (ChatML), or Llama 3.1's and 3.2's JSON calls.
enum class ToolFormat { None, Hermes, Llama31 };

struct ChatTemplate {
    ChatFamily family = ChatFamily::ChatML;
    std::string default_system;    // ChatML: the system turn written when none is given
    bool strip_prompt = false;     // Llama3, Llama-2-chat, Gemma: the prompt is stripped
    bool needs_bos = false;        // the rendering starts with the BOS token's text
    bool system_role = true;       // false: the template refuses system messages (Gemma:
                                   // true where it folds one into the first user turn)
    bool space_after_eos = false;  // Mistral-Instruct v0.1: a space between a reply's EOS
                                   // and the next [INST]
    std::string knowledge_date;    // Llama31: "December 2023"; Harmony: "2024-06"
    std::string date;              // Llama31: the date_string default, unless...
    bool date_from_clock = false;  // ...Llama31, Harmony: the template writes today's date
    std::string date_format;       // as strftime writes it: "%d %b %Y" (Llama31), "%Y-%m-%d"
    std::string model_identity;    // Harmony: the system message's first line
    std::string reasoning_effort;  // Harmony: "medium"
    bool thinking_switch = false;  // ChatML: the template honours enable_thinking=False
    // ChatML and Phi: what follows a role's marker ("\n"; Phi-4's "<|im_sep|>", Phi-4-mini's
    // "") and what follows a turn's end ("\n"; Phi-4's and Phi-4-mini's "").
    std::string role_separator = "\n";
    std::string turn_separator = "\n";
    bool skip_empty_system = false;  // Phi-3.5: an empty system message is not written
    ToolFormat tool_format = ToolFormat::None;
    bool verbatim_string_arguments = false;  // Hermes (Qwen3): a call's arguments that are a
                                             // string (not JSON) are written as they are
    bool splits_think_blocks = false;        // Hermes (Qwen3): a past reply's <think> block is
                                             // dropped, or kept after the last user query
};

// Recognises `template_text`; throws Error naming what it did not recognise.
ChatTemplate recognise_chat_template(const std::string& template_text);

// The rendering of an optional system message and one user message, with the generation
// prompt. `bos_token` is the text of the BOS token (used by the Llama families; Error if
// they need it and it is empty). Error for a system message the template refuses.
// `enable_thinking` false renders as apply_chat_template(..., enable_thinking=False); Error
// for a template without a thinking switch.
std::string render_chat(const ChatTemplate& chat, const std::optional<std::string>& system,
                        const std::string& prompt, const std::string& bos_token,
                        bool enable_thinking = true);

// Removes the <think>...</think> block of a reasoning model's reply (and the blank lines
// after it) from text that arrives in pieces, as `run --chat` streams it; a marker split
// across pieces is recognised. Text outside the block passes unchanged.
class ThinkBlockFilter {
public:
    // The part of `piece` that can be shown now.
    std::string feed(const std::string& piece);
    // What was held back at the end (a partial marker that never completed); "" inside a
    // block that never closed.
    std::string finish();

private:
    std::string held_;          // text that may be the start of a marker
    bool inside_ = false;       // between <think> and </think>
    bool after_block_ = false;  // right after </think>: leading whitespace is dropped
};

// The reasoning effort a harmony template (gpt-oss) writes in its system message in place of
// its default: "low", "medium" or "high" (OpenAI's levels). Error for another value or another
// family, naming `what` (the option or field that asked).
void set_reasoning_effort(ChatTemplate& chat, const std::string& effort, const std::string& what);

// Whether the template writes a past reply other than as the model generated it, so that a
// conversation goes on from the reply's start with render_reply rather than from its end
// (Harmony: the analysis channel is dropped).
bool chat_rewrites_replies(ChatFamily family);

// An assistant message as the template writes it between the generation prompt and the text
// of render_next_turn: trimmed where the template trims contents (after the space Llama-2-chat
// writes before a reply); Harmony: "<|channel|>final<|message|>" + content, an Error for a
// content holding channel markers as the template refuses it.
std::string render_reply(const ChatTemplate& chat, const std::string& content);

// Keeps only the answer of a Harmony reply (the final channel), which arrives in pieces with
// the texts of its special tokens: messages
//     [<|start|>assistant]<|channel|>NAME[ ...]<|message|>TEXT<|end|>
// follow one another, and TEXT is shown where NAME is "final" (a message without a channel
// is not shown). <|return|> and <|call|> end a message as <|end|> does. A marker split across
// pieces is recognised.
class HarmonyChannelFilter {
public:
    // The part of `piece` that can be shown now.
    std::string feed(const std::string& piece);
    // What was held back at the end of the final channel (a partial marker that never
    // completed); "" elsewhere.
    std::string finish();

private:
    std::string held_;            // a message's header so far, or text that may start a marker
    size_t header_searched_ = 0;  // where the header's search for <|message|> goes on
    bool in_body_ = false;        // after <|message|>, before the message's end
    bool shown_ = false;          // the body is the final channel's
};

// How a family's replies hold their reasoning: a <think>...</think> block (Qwen3 and other
// ChatML models; none elsewhere) or Harmony's channels.
enum class ReasoningMarkup { ThinkBlock, HarmonyChannels };
ReasoningMarkup chat_reasoning_markup(ChatFamily family);

// Whether the reply's markup is written with special tokens (Harmony), so that it reaches a
// ReasoningFilter only when the reply is decoded with the special tokens' text.
bool chat_markup_is_special(ChatFamily family);

// The answer of a reply that arrives in pieces, its reasoning hidden: ThinkBlockFilter or
// HarmonyChannelFilter, as the markup says.
class ReasoningFilter {
public:
    explicit ReasoningFilter(ReasoningMarkup markup) : markup_(markup) {}
    std::string feed(const std::string& piece);
    std::string finish();

private:
    ReasoningMarkup markup_;
    ThinkBlockFilter think_;
    HarmonyChannelFilter harmony_;
};

// The text that follows a reply written by render_reply: the end of its turn, then `prompt` as
// the next user message, and the generation prompt. `bos_token` and `eos_token` are the texts of
// the BOS and EOS tokens (Error if the Llama2 family needs one that is empty).
std::string render_next_turn(const ChatTemplate& chat, const std::string& prompt,
                             const std::string& bos_token, const std::string& eos_token);

// The token text that ends the assistant's turn ("<|im_end|>", "<|eot_id|>",
// "<end_of_turn>", "<|end|>", Harmony's "<|return|>"), or "" for families whose turn ends with
// EOS.
std::string chat_end_of_turn(ChatFamily family);

const char* chat_family_name(ChatFamily family);

// The markers of a reasoning reply's block (Qwen3 and other ChatML models).
inline constexpr const char* kThinkOpen = "<think>";
inline constexpr const char* kThinkClose = "</think>";

// The length of the longest end of `text` that is a proper prefix of `marker`: what a
// filter of text arriving in pieces holds back, as it may start the marker.
size_t partial_marker_length(const std::string& text, const std::string& marker);

// The date the template writes in its system message: today in its format, or its fixed date.
std::string chat_template_date(const ChatTemplate& chat);

// `text` without leading and trailing whitespace, as Python's str.strip() (Unicode
// White_Space plus \x1c-\x1f). Invalid UTF-8 is left as is.
std::string python_strip(const std::string& text);

}  // namespace barellm
