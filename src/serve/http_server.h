// `barellm serve`'s HTTP side, over cpp-httplib: the routes of OpenAI's protocol
// (openai_api.h) in front of the Scheduler, server-sent events for `stream: true`, an API key,
// /health and /metrics, one line per request on stderr. Every request is bounded: the body
// size, the prompt and max_tokens by the context, the read and write times. Nothing is ever
// read from a file for a client.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "generation/chat_session.h"
#include "generation/sampler.h"
#include "serve/scheduler.h"
#include "tokenizer/tokenizer.h"
#include "weights/config.h"

namespace barellm::serve {

constexpr size_t kMaxBodyBytes = size_t(1) << 20;  // larger request bodies get 413

struct ServerOptions {
    std::string host = "127.0.0.1";
    int port = 8080;               // 0: any free port (the line on stderr names it)
    std::string api_key;           // "": none asked for
    std::string model_id;          // the name /v1/models lists and requests may give
    int context = 0;               // positions of one sequence, prompt and reply
    int parallel = 1;              // sequences in the running batch (sizes the thread pool)
    SamplingOptions sampling;      // the defaults of fields a request leaves out
    std::optional<uint64_t> seed;  // the default seed; none: each request its own
    // The model's chat template; none: /v1/chat/completions answers 400 with `no_chat`.
    std::optional<ChatFormat> chat;
    std::string no_chat;
};

// Listens on host:port and answers until SIGINT or SIGTERM, then cancels the open requests
// and returns. Runs the scheduler's loop (made with LoopThread::Caller) on the calling thread
// meanwhile. Throws Error when the address cannot be listened on.
void serve_http(const Config& config, const Tokenizer& tokenizer, Scheduler& scheduler,
                const ServerOptions& options);

}  // namespace barellm::serve
