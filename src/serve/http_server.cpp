// The HTTP routes of `barellm serve` (http_server.h). Each request runs on a thread of
// httplib's pool: it is parsed and checked (openai_api.h), submitted to the Scheduler, and
// answered from what the scheduler's callbacks leave in its Channel: all at once, or as
// server-sent events while the tokens arrive. A stream whose write fails (the client left)
// cancels its request.
#include "serve/http_server.h"

#include <httplib.h>
#include <signal.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <exception>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "generation/generate.h"
#include "serve/metrics.h"
#include "serve/openai_api.h"
#include "util/json.h"
#include "util/terminal.h"
#include "util/timing.h"

namespace barellm::serve {

namespace {

using json = nlohmann::json;

constexpr time_t kReadTimeoutSeconds = 10;   // for each read of a request
constexpr time_t kWriteTimeoutSeconds = 10;  // for each write: a client that stops reading
constexpr time_t kKeepAliveSeconds = 2;      // an idle connection holds a thread this long
constexpr int kSpareThreads = 32;            // threads beyond two per running sequence
// A stream with nothing to send (its request waits in the queue) writes an SSE comment this
// often, so that a client gone is noticed by the failing write.
constexpr auto kStreamHeartbeat = std::chrono::seconds(2);
constexpr size_t kLoggedPathBytes = 200;

// What the scheduler's callbacks (on its thread) hand to the request's thread.
struct Channel {
    std::mutex mutex;
    std::condition_variable changed;
    std::vector<ReplyPart> pieces;  // arrived, not sent yet: a token's text or a call
    bool done = false;
    Completion completion;
};

// What the request's line on stderr reports. httplib runs a request's routing, handler,
// stream and logger on one thread, so each thread keeps the record of its request.
struct RequestRecord {
    Clock::time_point start;
    bool started = false;
    int prompt_tokens = -1, completion_tokens = -1;
};
thread_local RequestRecord request_record;

void on_terminate(int) { interrupted = true; }

// "tool_calls" when the reply called a function.
std::string finish_reason_name(FinishReason reason, int calls) {
    if (calls > 0) return "tool_calls";
    return reason == FinishReason::Length ? "length" : "stop";
}

// The call as the response names it: its id made of the request's and its place in the reply.
ToolCall with_call_id(ToolCall call, uint64_t request_id, int index) {
    call.id = "call_" + std::to_string(request_id) + "_" + std::to_string(index);
    return call;
}

// The error a request that did not end with Stop or Length is answered with.
ApiError unfinished_error(const Completion& completion) {
    if (completion.finish_reason == FinishReason::Failed)
        return ApiError(500, "the generation failed: " + completion.error);
    return ApiError(503, "the request was cancelled: the server is stopping");
}

// `text` for a log line: control characters as '?', cut after kLoggedPathBytes.
std::string printable(const std::string& text) {
    std::string out = text.substr(0, kLoggedPathBytes);
    for (char& c : out)
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
    return text.size() > kLoggedPathBytes ? out + "..." : out;
}

// Compares in time independent of where the texts differ.
bool same_secret(const std::string& given, const std::string& expected) {
    if (expected.empty()) return given.empty();
    unsigned char difference = given.size() == expected.size() ? 0 : 1;
    for (size_t i = 0; i < given.size(); ++i)
        difference |= static_cast<unsigned char>(given[i] ^ expected[i % expected.size()]);
    return difference == 0;
}

void send_json(httplib::Response& res, int status, const json& body) {
    res.status = status;
    res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

void send_error(httplib::Response& res, const ApiError& error) {
    send_json(res, error.status, error_body(error));
}

class HttpServer {
public:
    HttpServer(const Config& config, const Tokenizer& tokenizer, Scheduler& scheduler,
               const ServerOptions& options)
        : config_(config), tokenizer_(tokenizer), scheduler_(scheduler), options_(options) {
        const size_t threads = size_t(2 * options.parallel + kSpareThreads);
        http_.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
        http_.set_payload_max_length(kMaxBodyBytes);
        http_.set_read_timeout(kReadTimeoutSeconds);
        http_.set_write_timeout(kWriteTimeoutSeconds);
        http_.set_keep_alive_timeout(kKeepAliveSeconds);
        http_.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
            return before_routing(req, res);
        });
        http_.set_error_handler(httplib::Server::HandlerWithResponse(
            [](const httplib::Request& req, httplib::Response& res) {
                return fill_error(req, res);
            }));
        http_.set_exception_handler(
            [](const httplib::Request&, httplib::Response& res, std::exception_ptr thrown) {
                std::string what = "unknown";
                try {
                    std::rethrow_exception(thrown);
                } catch (const std::exception& e) {
                    what = e.what();
                } catch (...) {
                }
                send_error(res, ApiError(500, "internal error: " + what));
            });
        http_.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
            log_request(req, res);
        });
        http_.Get("/health", [](const httplib::Request&, httplib::Response& res) {
            send_json(res, 200, {{"status", "ok"}});
        });
        http_.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
            send_json(res, 200, models_response(options_.model_id, started_));
        });
        http_.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
            res.set_content(prometheus_text(scheduler_.metrics(), http_requests_.load()),
                            "text/plain; version=0.0.4");
        });
        http_.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
            guarded(res, [&] { completions(req, res); });
        });
        http_.Post("/v1/chat/completions",
                   [this](const httplib::Request& req, httplib::Response& res) {
                       guarded(res, [&] { chat_completions(req, res); });
                   });
    }

    void run() {
        signal(SIGPIPE, SIG_IGN);  // a client gone shows as a failed write, not a signal
        catch_interrupts();
        struct sigaction action {};
        action.sa_handler = on_terminate;
        sigemptyset(&action.sa_mask);
        action.sa_flags = SA_RESTART;
        sigaction(SIGTERM, &action, nullptr);

        int port = options_.port;
        errno = 0;
        const bool bound = port == 0 ? (port = http_.bind_to_any_port(options_.host)) > 0
                                     : http_.bind_to_port(options_.host, port);
        if (!bound)
            throw Error("cannot listen on " + options_.host + ":" + std::to_string(options_.port) +
                        (errno ? std::string(": ") + std::strerror(errno) : ""));
        std::fprintf(stderr, "barellm: serving %s on http://%s:%d/v1 (Ctrl-C stops)\n",
                     options_.model_id.c_str(), options_.host.c_str(), port);
        std::atomic<bool> listening_ended{false};
        std::thread stopper([&] {
            while (!interrupted && !listening_ended)
                std::this_thread::sleep_for(std::chrono::milliseconds(100));
            stopping_ = true;
            cancel_open_requests();
            http_.stop();
        });
        http_.listen_after_bind();
        listening_ended = true;
        stopper.join();
        std::fprintf(stderr, "barellm: stopped\n");
    }

private:
    // Runs a handler, answering its ApiError (or any Error, as a bad request) in OpenAI's form.
    static void guarded(httplib::Response& res, const std::function<void()>& handler) {
        try {
            handler();
        } catch (const ApiError& e) {
            send_error(res, e);
        } catch (const Error& e) {
            send_error(res, ApiError(400, e.what()));
        }
    }

    httplib::Server::HandlerResponse before_routing(const httplib::Request& req,
                                                    httplib::Response& res) {
        request_record = RequestRecord{};
        request_record.start = Clock::now();
        request_record.started = true;
        const bool guarded_path = req.path.rfind("/v1/", 0) == 0 || req.path == "/metrics";
        if (options_.api_key.empty() || !guarded_path)
            return httplib::Server::HandlerResponse::Unhandled;
        const std::string given = req.get_header_value("Authorization");
        const std::string prefix = "Bearer ";
        if (given.rfind(prefix, 0) == 0 &&
            same_secret(given.substr(prefix.size()), options_.api_key))
            return httplib::Server::HandlerResponse::Unhandled;
        send_error(res, ApiError(401,
                                 given.empty() ? "no API key: send the header 'Authorization: "
                                                 "Bearer KEY'"
                                               : "wrong API key",
                                 "", "invalid_api_key"));
        return httplib::Server::HandlerResponse::Handled;
    }

    // httplib's own refusals (no route, a body too large, a malformed request) come with an
    // empty body: they get OpenAI's error object too.
    static httplib::Server::HandlerResponse fill_error(const httplib::Request& req,
                                                       httplib::Response& res) {
        if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
        std::string message;
        switch (res.status) {
            case 404:
                message = "no route " + printable(req.method) + " " + printable(req.path);
                break;
            case 413:
                message =
                    "the request body is larger than " + std::to_string(kMaxBodyBytes) + " bytes";
                break;
            default:
                message = "the request was refused (HTTP " + std::to_string(res.status) + ")";
        }
        send_error(res, ApiError(res.status, message));
        return httplib::Server::HandlerResponse::Handled;
    }

    void log_request(const httplib::Request& req, const httplib::Response& res) {
        ++http_requests_;
        std::string line = "barellm: " + printable(req.method) + " " + printable(req.path) + " " +
                           std::to_string(res.status);
        if (request_record.prompt_tokens >= 0)
            line += " prompt " + std::to_string(request_record.prompt_tokens) + " generated " +
                    std::to_string(request_record.completion_tokens) + " tokens";
        if (request_record.started) {
            char ms[32];
            std::snprintf(ms, sizeof ms, " %.0f ms", 1000 * seconds_since(request_record.start));
            line += ms;
        }
        std::fprintf(stderr, "%s\n", line.c_str());
        request_record = RequestRecord{};
    }

    void completions(const httplib::Request& req, httplib::Response& res) {
        const CompletionRequest request = parse_completion_request(req.body);
        check_model(request.fields);
        std::vector<int> prompt = request.prompt_ids;
        if (request.has_prompt_ids) {
            for (int id : prompt)
                if (id < 0 || id >= config_.vocab_size)
                    throw ApiError(400,
                                   "the prompt holds a token id outside the vocabulary of " +
                                       std::to_string(config_.vocab_size),
                                   "prompt", "invalid_value");
        } else {
            prompt = encode_prompt(tokenizer_, config_, request.prompt_text, config_.add_bos,
                                   /*parse_special=*/true);
        }
        answer(res, /*chat=*/false, std::move(prompt), request.fields, /*end_of_turn=*/-1,
               /*answer_only=*/false, ToolFormat::None, /*call_prefix=*/"");
    }

    void chat_completions(const httplib::Request& req, httplib::Response& res) {
        const ChatRequest request = parse_chat_request(req.body);
        check_model(request.fields);
        if (!options_.chat) throw ApiError(400, options_.no_chat, "messages");
        const ChatFormat& format = *options_.chat;
        ChatTemplate chat = format.chat;
        if (request.reasoning_effort) {
            try {
                set_reasoning_effort(chat, *request.reasoning_effort, "'reasoning_effort'");
            } catch (const Error& e) {
                throw ApiError(400, e.what(), "reasoning_effort");
            }
        }
        const std::string text =
            render_chat_request(chat, request, format.bos_text, format.eos_text);
        // BOS as the first turn of `run --chat` gets it: unless the rendering starts with it.
        const bool add_bos = config_.add_bos && config_.bos_id >= 0 &&
                             text.compare(0, format.bos_text.size(), format.bos_text) != 0;
        answer(res, /*chat=*/true,
               encode_prompt(tokenizer_, config_, text, add_bos, /*parse_special=*/true),
               request.fields, format.end_of_turn, chat_markup_is_special(format.chat.family),
               request_calls_tools(request) ? chat.tool_format : ToolFormat::None,
               forced_call_prefix(chat, request));
    }

    void check_model(const GenerationFields& fields) const {
        if (!fields.model.empty() && fields.model != options_.model_id)
            throw ApiError(404,
                           "the model " + quoted_excerpt(fields.model) +
                               " does not exist; this server has '" + options_.model_id + "'",
                           "model", "model_not_found");
    }

    Request scheduler_request(std::vector<int> prompt, const GenerationFields& fields,
                              int end_of_turn) const {
        const int context = options_.context;
        const int prompt_tokens = int(prompt.size());
        if (prompt.empty())
            throw ApiError(400, "the prompt is empty and the model adds no BOS token", "prompt");
        if (prompt_tokens >= context)
            throw ApiError(400,
                           "the prompt is " + std::to_string(prompt_tokens) +
                               " tokens; the context of " + std::to_string(context) +
                               " positions must hold it and at least one generated token",
                           "prompt", "context_length_exceeded");
        if (fields.max_tokens && prompt_tokens + *fields.max_tokens > context)
            throw ApiError(400,
                           "the prompt's " + std::to_string(prompt_tokens) +
                               " tokens and max_tokens " + std::to_string(*fields.max_tokens) +
                               " exceed the context of " + std::to_string(context) + " positions",
                           "max_tokens", "context_length_exceeded");
        Request request;
        request.prompt = std::move(prompt);
        request.max_tokens = fields.max_tokens.value_or(0);
        request.sampling = options_.sampling;
        if (fields.temperature) request.sampling.temperature = *fields.temperature;
        if (fields.top_p) request.sampling.top_p = *fields.top_p;
        if (fields.top_k) request.sampling.top_k = *fields.top_k;
        if (fields.min_p) request.sampling.min_p = *fields.min_p;
        if (fields.repeat_penalty) request.sampling.repeat_penalty = *fields.repeat_penalty;
        if (fields.seed) {
            request.seed = *fields.seed;
        } else if (options_.seed) {
            request.seed = *options_.seed;
        } else {
            std::random_device random;
            request.seed = (uint64_t(random()) << 32) ^ random();
        }
        request.stop_strings = fields.stop;
        request.end_of_turn = end_of_turn;
        return request;
    }

    // Submits the request and answers it, at once or as a stream. `answer_only`: the reply is
    // decoded with its special tokens' texts and only its answer is sent (harmony's final
    // channel, HarmonyChannelFilter). `tools`: the format the reply's calls are read in
    // (ToolCallReader), None when it is not read for calls; `call_prefix`: the start of a call
    // the prompt ends with, which the reply goes on.
    void answer(httplib::Response& res, bool chat, std::vector<int> prompt,
                const GenerationFields& fields, int end_of_turn, bool answer_only, ToolFormat tools,
                const std::string& call_prefix) {
        Request request = scheduler_request(std::move(prompt), fields, end_of_turn);
        request.keep_special_text = answer_only;
        auto channel = std::make_shared<Channel>();
        // on_text and on_done run on the scheduler's thread, one after the other.
        auto filter = std::make_shared<HarmonyChannelFilter>();
        auto reader = std::make_shared<ToolCallReader>(tools);
        reader->feed(call_prefix);  // the start of a call: read, never shown
        const auto send = [channel](std::vector<ReplyPart> parts) {
            if (parts.empty()) return;
            std::lock_guard<std::mutex> lock(channel->mutex);
            for (ReplyPart& part : parts) channel->pieces.push_back(std::move(part));
            channel->changed.notify_all();
        };
        // The text of a token (or of what a filter held back), through the call reader.
        const auto pass = [send, reader, tools](const std::string& text) {
            if (tools != ToolFormat::None)
                send(reader->feed(text));
            else if (!text.empty())
                send({{text, std::nullopt}});
        };
        request.on_text = [pass, filter, answer_only](const std::string& text) {
            pass(answer_only ? filter->feed(text) : text);
        };
        request.on_done = [channel, pass, send, filter, reader,
                           tools](const Completion& completion) {
            pass(filter->finish());
            if (tools != ToolFormat::None) send(reader->finish());
            std::lock_guard<std::mutex> lock(channel->mutex);
            channel->done = true;
            channel->completion = completion;
            channel->changed.notify_all();
        };
        if (stopping_) throw ApiError(503, "the server is stopping");
        uint64_t id = 0;
        try {
            id = scheduler_.submit(std::move(request));
        } catch (const Error& e) {
            // The request was checked above: what the scheduler refuses now is a full queue.
            throw ApiError(503, std::string("the server is full: ") + e.what(), "",
                           "server_overloaded");
        }
        track(id);
        const ResponseHeader header{(chat ? "chatcmpl-" : "cmpl-") + std::to_string(id),
                                    int64_t(std::time(nullptr)), options_.model_id};
        if (fields.stream)
            stream(res, chat, fields.include_usage, header, channel, id);
        else
            answer_at_once(res, chat, header, *channel, id);
    }

    void answer_at_once(httplib::Response& res, bool chat, const ResponseHeader& header,
                        Channel& channel, uint64_t id) {
        std::unique_lock<std::mutex> lock(channel.mutex);
        channel.changed.wait(lock, [&] { return channel.done; });
        const Completion completion = channel.completion;
        lock.unlock();
        untrack(id);
        record_tokens(completion);
        if (completion.finish_reason == FinishReason::Cancelled ||
            completion.finish_reason == FinishReason::Failed)
            throw unfinished_error(completion);
        const Usage usage{completion.prompt_tokens, completion.completion_tokens};
        std::string text;
        std::vector<ToolCall> calls;
        for (const ReplyPart& part : channel.pieces) {
            text += part.text;
            if (part.call) calls.push_back(with_call_id(*part.call, id, int(calls.size())));
        }
        const std::string reason = finish_reason_name(completion.finish_reason, int(calls.size()));
        send_json(res, 200,
                  chat ? chat_response(header, text, calls, reason, usage)
                       : completion_response(header, text, reason, usage));
    }

    void stream(httplib::Response& res, bool chat, bool include_usage, const ResponseHeader& header,
                const std::shared_ptr<Channel>& channel, uint64_t id) {
        auto role_sent = std::make_shared<bool>(!chat);
        auto calls_sent = std::make_shared<int>(0);
        res.set_header("Cache-Control", "no-cache");
        res.set_chunked_content_provider(
            "text/event-stream",
            [=](size_t, httplib::DataSink& sink) {
                if (!*role_sent) {
                    *role_sent = true;
                    const std::string first = sse_event(chat_role_chunk(header));
                    return sink.write(first.data(), first.size());
                }
                std::unique_lock<std::mutex> lock(channel->mutex);
                channel->changed.wait_for(lock, kStreamHeartbeat, [&] {
                    return !channel->pieces.empty() || channel->done;
                });
                const std::vector<ReplyPart> pieces = std::move(channel->pieces);
                channel->pieces.clear();
                const bool done = channel->done;
                const Completion completion = channel->completion;
                lock.unlock();
                // An event per token's text (or call), even when several arrived since the last
                // write.
                std::string out;
                for (const ReplyPart& part : pieces) {
                    if (part.call) {
                        const int index = (*calls_sent)++;
                        out += sse_event(chat_tool_call_chunk(
                            header, with_call_id(*part.call, id, index), index));
                    } else {
                        out += sse_event(chat ? chat_chunk(header, part.text, "")
                                              : completion_chunk(header, part.text, ""));
                    }
                }
                if (done) out += last_events(chat, include_usage, header, completion, *calls_sent);
                if (out.empty()) out = ": waiting\n\n";
                if (!sink.write(out.data(), out.size())) return false;
                if (done) {
                    record_tokens(completion);
                    sink.done();
                }
                return true;
            },
            [this, id](bool success) {
                // Not a success: the client left (or the server stops) before the end.
                if (!success) scheduler_.cancel(id);
                untrack(id);
            });
    }

    static std::string last_events(bool chat, bool include_usage, const ResponseHeader& header,
                                   const Completion& completion, int calls) {
        if (completion.finish_reason == FinishReason::Cancelled ||
            completion.finish_reason == FinishReason::Failed)
            return sse_event(error_body(unfinished_error(completion)));
        const std::string reason = finish_reason_name(completion.finish_reason, calls);
        std::string out =
            sse_event(chat ? chat_chunk(header, "", reason) : completion_chunk(header, "", reason));
        if (include_usage)
            out += sse_event(usage_chunk(
                header, chat, Usage{completion.prompt_tokens, completion.completion_tokens}));
        return out + kSseDone;
    }

    static void record_tokens(const Completion& completion) {
        request_record.prompt_tokens = completion.prompt_tokens;
        request_record.completion_tokens = completion.completion_tokens;
    }

    void track(uint64_t id) {
        std::lock_guard<std::mutex> lock(open_mutex_);
        open_.insert(id);
    }

    void untrack(uint64_t id) {
        std::lock_guard<std::mutex> lock(open_mutex_);
        open_.erase(id);
    }

    void cancel_open_requests() {
        std::lock_guard<std::mutex> lock(open_mutex_);
        for (uint64_t id : open_) scheduler_.cancel(id);
    }

    const Config& config_;
    const Tokenizer& tokenizer_;
    Scheduler& scheduler_;
    const ServerOptions& options_;
    const int64_t started_ = int64_t(std::time(nullptr));
    httplib::Server http_;
    std::atomic<uint64_t> http_requests_{0};
    std::atomic<bool> stopping_{false};
    std::mutex open_mutex_;
    std::set<uint64_t> open_;  // submitted requests not answered yet
};

}  // namespace

void serve_http(const Config& config, const Tokenizer& tokenizer, Scheduler& scheduler,
                const ServerOptions& options) {
    HttpServer server(config, tokenizer, scheduler, options);
    // HTTP on a thread of its own; the scheduler's loop here, on the caller's thread
    // (LoopThread::Caller), until the server has stopped listening.
    std::exception_ptr failure;
    std::thread http([&] {
        try {
            server.run();
        } catch (...) {
            failure = std::current_exception();
        }
        scheduler.stop();
    });
    scheduler.run();
    http.join();
    if (failure) std::rethrow_exception(failure);
}

}  // namespace barellm::serve
