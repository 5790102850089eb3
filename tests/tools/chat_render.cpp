// Test tool: renders one user message, after a system message when SYSTEM_FILE is given,
// with barellm's built-in chat templates (src/tokenizer/chat.h), for comparison with jinja2 on the
// real template (tests/test_chat.py).
//   chat_render [--no-think | --effort LEVEL] TEMPLATE_FILE PROMPT_FILE BOS_TOKEN [SYSTEM_FILE]
// (--no-think: rendered with enable_thinking=False; --effort: a harmony template's
// reasoning_effort, set_reasoning_effort)
// prints the recognised family on stderr and the rendering on stdout (bytes exactly);
// an unrecognised template prints the error and exits with 1.
//   chat_render --next TEMPLATE_FILE PROMPT_FILE BOS_TOKEN EOS_TOKEN
// prints instead the text that follows a reply, with PROMPT as the next user message
// (render_next_turn).
//   chat_render --reply TEMPLATE_FILE CONTENT_FILE
// prints instead an assistant message as the template writes it after the generation prompt
// (render_reply).
//   chat_render --request TEMPLATE_FILE REQUEST_FILE BOS_TOKEN EOS_TOKEN
// prints instead the prompt `barellm serve` renders for a /v1/chat/completions request body
// (its messages, tools and tool_choice: serve::render_chat_request), and on stderr whether the
// reply would be read for calls ("calls: yes" or "calls: no").
#include <cstdio>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>

#include "serve/openai_api.h"
#include "tokenizer/chat.h"
#include "util/error.h"

namespace {

std::string read_file(const char* path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw barellm::Error(std::string(path) + ": cannot open");
    std::ostringstream text;
    text << in.rdbuf();
    return text.str();
}

}  // namespace

int main(int argc, char** argv) {
    const bool no_think = argc > 1 && std::string(argv[1]) == "--no-think";
    if (no_think) {
        --argc;
        ++argv;
    }
    std::optional<std::string> effort;
    if (argc > 2 && std::string(argv[1]) == "--effort") {
        effort = argv[2];
        argc -= 2;
        argv += 2;
    }
    const bool next_turn = argc == 6 && std::string(argv[1]) == "--next";
    const bool reply = argc == 4 && std::string(argv[1]) == "--reply";
    const bool request = argc == 6 && std::string(argv[1]) == "--request";
    if (argc != 4 && argc != 5 && !next_turn && !request) {
        std::fputs(
            "usage: chat_render [--no-think | --effort LEVEL] TEMPLATE_FILE PROMPT_FILE BOS_TOKEN "
            "[SYSTEM_FILE]\n"
            "       chat_render --next TEMPLATE_FILE PROMPT_FILE BOS_TOKEN EOS_TOKEN\n"
            "       chat_render --reply TEMPLATE_FILE CONTENT_FILE\n"
            "       chat_render --request TEMPLATE_FILE REQUEST_FILE BOS_TOKEN EOS_TOKEN\n",
            stderr);
        return 2;
    }
    try {
        if (next_turn) {
            const auto chat = barellm::recognise_chat_template(read_file(argv[2]));
            const std::string text =
                barellm::render_next_turn(chat, read_file(argv[3]), argv[4], argv[5]);
            std::cout.write(text.data(), std::streamsize(text.size()));
            return 0;
        }
        if (request) {
            const auto chat = barellm::recognise_chat_template(read_file(argv[2]));
            const auto parsed = barellm::serve::parse_chat_request(read_file(argv[3]));
            const std::string text =
                barellm::serve::render_chat_request(chat, parsed, argv[4], argv[5]);
            std::fprintf(
                stderr, "calls: %s\n",
                barellm::serve::request_calls_tools(parsed) && barellm::chat_renders_tools(chat)
                    ? "yes"
                    : "no");
            std::cout.write(text.data(), std::streamsize(text.size()));
            return 0;
        }
        if (reply) {
            const auto chat = barellm::recognise_chat_template(read_file(argv[2]));
            const std::string text = barellm::render_reply(chat, read_file(argv[3]));
            std::cout.write(text.data(), std::streamsize(text.size()));
            return 0;
        }
        barellm::ChatTemplate chat = barellm::recognise_chat_template(read_file(argv[1]));
        if (effort) barellm::set_reasoning_effort(chat, *effort, "--effort");
        std::optional<std::string> system;
        if (argc == 5) system = read_file(argv[4]);
        const std::string text =
            barellm::render_chat(chat, system, read_file(argv[2]), argv[3], !no_think);
        std::fprintf(stderr, "%s\n", barellm::chat_family_name(chat.family));
        std::cout.write(text.data(), std::streamsize(text.size()));
        return 0;
    } catch (const barellm::Error& e) {
        std::fprintf(stderr, "chat_render: %s\n", e.what());
        return 1;
    }
}
