// The server's scheduler (src/serve/scheduler.h) on a backend that plays the model: each
// position's "key" is a hash of the key at the position before, read through the row's block
// table, and of the token, so a row's logits depend on every token before it as the KV
// cache holds them. A wrong block table, a shared block overwritten, a copy not made or a
// recomputation that went wrong changes the logits, and so the reply. Each reply is checked
// against the same chain computed from the token ids alone (no blocks, no batching), drawn
// with the same sampler and seed. The scheduler on the CPU backend and a real model is
// tested in test_scheduler_cpu.cpp.
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <future>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <thread>

#include "scheduler_tokenizer.h"
#include "serve/scheduler.h"
#include "util/error.h"

using namespace barellm;
using namespace barellm::serve;
using nlohmann::json;

namespace {

constexpr int kVocab = kSchedulerVocab;
constexpr int kEos = 2;

uint64_t mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    return x ^ (x >> 33);
}

// The key of position `pos` holding `token`, after the key `previous` of position pos - 1.
uint64_t next_key(uint64_t previous, int token, int pos) {
    return mix(previous * 31 + uint64_t(token) * 1000003 + uint64_t(pos));
}

// Logits in [-4, 4) from a key.
void logits_of(uint64_t key, float* logits) {
    for (int v = 0; v < kVocab; ++v)
        logits[v] =
            float(mix(key + uint64_t(v) * 0x9e3779b97f4a7c15ULL) >> 40) / float(1 << 24) * 8.0f -
            4.0f;
}

class ChainBackend : public Backend {
public:
    ChainBackend(int blocks, int block_size, int max_batch)
        : block_size_(block_size),
          max_batch_(max_batch),
          keys_(size_t(blocks) * block_size),
          positions_(size_t(blocks) * block_size, -1) {}

    const float* forward(int, int) override { throw Error("the chain backend only steps"); }
    const float* prefill(const int*, int, int, bool) override {
        throw Error("the chain backend only steps");
    }
    std::string name() const override { return "chain"; }
    int max_batch() const override { return max_batch_; }
    size_t kv_bytes_read(int) const override { return 0; }
    double measure_bandwidth_gbps() override { return 0; }

    const float* step(const StepRow* rows, int count) override {
        if (count < 1 || count > max_batch_) throw Error("step: bad row count");
        ++steps;
        largest_step = std::max(largest_step, count);
        logits_.clear();
        for (int r = 0; r < count; ++r) {
            const StepRow& row = rows[r];
            uint64_t previous = 0;
            if (row.pos > 0) {
                const size_t slot = slot_of(row.block_table, row.pos - 1);
                if (positions_[slot] != row.pos - 1)
                    throw Error("step: position " + std::to_string(row.pos - 1) +
                                " read from a slot that holds another position");
                previous = keys_[slot];
            }
            const size_t slot = slot_of(row.block_table, row.pos);
            keys_[slot] = next_key(previous, row.token, row.pos);
            positions_[slot] = row.pos;
            if (!row.wants_logits) continue;
            logits_.resize(logits_.size() + kVocab);
            logits_of(keys_[slot], logits_.data() + logits_.size() - kVocab);
            if (row.token == nan_token) logits_[logits_.size() - 1] = NAN;
        }
        return logits_.data();
    }
    void copy_kv_block(int from, int to) override {
        ++copies;
        for (int i = 0; i < block_size_; ++i) {
            keys_[size_t(to) * block_size_ + i] = keys_[size_t(from) * block_size_ + i];
            positions_[size_t(to) * block_size_ + i] = positions_[size_t(from) * block_size_ + i];
        }
    }

    int nan_token = -1;  // rows of this token give a NaN logit
    int steps = 0, largest_step = 0, copies = 0;

private:
    size_t slot_of(const int* table, int pos) const {
        return size_t(table[pos / block_size_]) * block_size_ + pos % block_size_;
    }
    int block_size_, max_batch_;
    std::vector<uint64_t> keys_;
    std::vector<int> positions_;
    std::vector<float> logits_;
};

Config chain_config(int context) {
    Config config;
    config.vocab_size = kVocab;
    config.max_context = context;
    config.bos_id = 1;
    config.eos_ids = {kEos};
    return config;
}

struct Reply {
    std::string text;
    Completion completion;
    int done_calls = 0;
    int text_calls = 0;
};

// Collects the replies of requests submitted to one scheduler and waits for them.
struct Replies {
    std::mutex mutex;
    std::condition_variable changed;
    std::vector<std::shared_ptr<Reply>> all;

    // Points the request's callbacks at a new reply.
    std::shared_ptr<Reply> attach(Request& request) {
        auto reply = std::make_shared<Reply>();
        request.on_text = [this, reply](const std::string& text) {
            std::lock_guard<std::mutex> lock(mutex);
            reply->text += text;
            ++reply->text_calls;
            changed.notify_all();
        };
        request.on_done = [this, reply](const Completion& completion) {
            std::lock_guard<std::mutex> lock(mutex);
            reply->completion = completion;
            ++reply->done_calls;
            changed.notify_all();
        };
        std::lock_guard<std::mutex> lock(mutex);
        all.push_back(reply);
        return reply;
    }
    // The metrics once the loop is idle (they are published at the end of each step, after
    // the callbacks).
    static SchedulerMetrics idle_metrics(const Scheduler& scheduler) {
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        SchedulerMetrics m = scheduler.metrics();
        while ((m.running > 0 || m.queue_length > 0) &&
               std::chrono::steady_clock::now() < deadline) {
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
            m = scheduler.metrics();
        }
        return m;
    }
    void wait_all() {
        std::unique_lock<std::mutex> lock(mutex);
        const bool finished = changed.wait_for(lock, std::chrono::seconds(120), [&] {
            for (const auto& r : all)
                if (r->done_calls == 0) return false;
            return true;
        });
        REQUIRE(finished);
    }
};

// The reply to `request` computed from the ids alone, as generate() would draw it.
struct Expected {
    std::string text;
    FinishReason reason;
    int completion_tokens;
};
Expected expected_reply(const Tokenizer& tokenizer, const Request& request, int context) {
    Sampler sampler(kVocab, request.sampling, request.seed);
    uint64_t key = 0;
    std::vector<int> tokens = request.prompt;
    for (size_t pos = 0; pos < tokens.size(); ++pos) {
        key = next_key(key, tokens[pos], int(pos));
        sampler.accept(tokens[pos]);
    }
    std::vector<int> drawn;
    std::vector<float> logits(kVocab);
    Expected expected{"", FinishReason::Length, 0};
    while (true) {
        logits_of(key, logits.data());
        const int next = sampler.sample(logits.data());
        sampler.accept(next);
        ++expected.completion_tokens;
        if (next == kEos || next == request.end_of_turn) {
            expected.reason = FinishReason::Stop;
            break;
        }
        drawn.push_back(next);
        tokens.push_back(next);
        expected.text = tokenizer.decode(drawn, /*skip_special=*/true);
        size_t stop = std::string::npos;
        for (const std::string& s : request.stop_strings)
            stop = std::min(stop, expected.text.find(s));
        if (stop != std::string::npos) {
            expected.text.resize(stop);
            expected.reason = FinishReason::Stop;
            break;
        }
        if (int(tokens.size()) > context ||
            (request.max_tokens > 0 && expected.completion_tokens >= request.max_tokens))
            break;
        key = next_key(key, next, int(tokens.size()) - 1);
    }
    return expected;
}

void check_reply(const Reply& reply, const Expected& expected, const Request& request) {
    INFO("prompt of " << request.prompt.size() << " tokens, seed " << request.seed);
    CHECK(reply.done_calls == 1);
    CHECK(reply.text == expected.text);
    CHECK(reply.completion.finish_reason == expected.reason);
    CHECK(reply.completion.completion_tokens == expected.completion_tokens);
    CHECK(reply.completion.prompt_tokens == int(request.prompt.size()));
}

// Prompts of BOS, one of a few shared beginnings and a tail, each of its own length; no byte
// tokens (a prompt that ends inside a character would print U+FFFD first).
std::vector<int> random_prompt(std::mt19937& random, int shared_length, int max_tail) {
    std::vector<int> prompt = {1};
    std::mt19937 shared(uint32_t(random() % 3));
    for (int i = 0; i < shared_length; ++i)
        prompt.push_back(std::uniform_int_distribution<int>(6, kVocab - 1)(shared));
    const int tail = std::uniform_int_distribution<int>(1, max_tail)(random);
    for (int i = 0; i < tail; ++i)
        prompt.push_back(std::uniform_int_distribution<int>(6, kVocab - 1)(random));
    return prompt;
}

Request greedy_request(std::vector<int> prompt, int max_tokens) {
    Request request;
    request.prompt = std::move(prompt);
    request.max_tokens = max_tokens;
    request.sampling.temperature = 0;
    return request;
}

Request seeded_request(std::vector<int> prompt, int max_tokens, uint64_t seed) {
    Request request;
    request.prompt = std::move(prompt);
    request.max_tokens = max_tokens;
    request.sampling.temperature = 0.9f;
    request.sampling.top_p = 0.95f;
    request.sampling.repeat_penalty = 1.1f;
    request.seed = seed;
    return request;
}

struct Setup {
    int blocks = 256, block_size = 4, max_batch = 64, context = 96;
    SchedulerOptions options;
    Setup() {
        options.parallel = 8;
        options.prefill_chunk = 7;
    }
};

struct RunResult {
    SchedulerMetrics metrics;
    int steps, largest_step, copies;
};

// Runs `requests` on one scheduler, all submitted at once, and checks every reply.
RunResult run_and_check(const Setup& setup, std::vector<Request> requests) {
    const Tokenizer tokenizer = Tokenizer::from_json(scheduler_tokenizer_json(), kVocab);
    const Config config = chain_config(setup.context);
    ChainBackend backend(setup.blocks, setup.block_size, setup.max_batch);
    std::vector<Expected> expected;
    for (const Request& r : requests)
        expected.push_back(expected_reply(tokenizer, r, setup.context));
    Replies replies;
    std::vector<std::shared_ptr<Reply>> got;
    SchedulerMetrics metrics;
    {
        SchedulerOptions options = setup.options;
        options.context = setup.context;
        Scheduler scheduler(backend, config, tokenizer, options, setup.blocks, setup.block_size);
        std::vector<Request> submitted = requests;
        for (Request& r : submitted) {
            got.push_back(replies.attach(r));
            scheduler.submit(r);
        }
        replies.wait_all();
        metrics = Replies::idle_metrics(scheduler);
    }
    for (size_t i = 0; i < requests.size(); ++i) check_reply(*got[i], expected[i], requests[i]);
    CHECK(metrics.kv_blocks_used == 0);
    CHECK(metrics.kv_blocks_free == setup.blocks);
    CHECK(metrics.running == 0);
    CHECK(metrics.queue_length == 0);
    CHECK(metrics.requests_total == requests.size());
    return {metrics, backend.steps, backend.largest_step, backend.copies};
}

}  // namespace

TEST_CASE("the chain reference and the tokenizer give texts worth comparing", "[scheduler]") {
    const Tokenizer tokenizer = Tokenizer::from_json(scheduler_tokenizer_json(), kVocab);
    CHECK(tokenizer.decode({4, 5, 32, 33, 6}, true) == "\xC3\xA9th a");
    std::mt19937 random(1);
    std::set<std::string> texts;
    for (int i = 0; i < 20; ++i) {
        const Expected e =
            expected_reply(tokenizer, greedy_request(random_prompt(random, 8, 9), 30), 96);
        texts.insert(e.text);
        CHECK(e.completion_tokens >= 1);
    }
    CHECK(texts.size() >= 18);  // a reply may be empty (EOS first) now and then
}

TEST_CASE("8 concurrent requests each get the reply they get alone", "[scheduler]") {
    std::mt19937 random(2);
    std::vector<Request> requests;
    for (int i = 0; i < 8; ++i) {
        std::vector<int> prompt = random_prompt(random, 10, 30);
        requests.push_back(i % 2 ? seeded_request(prompt, 40, 100 + i)
                                 : greedy_request(prompt, 40));
    }
    Setup setup;
    const RunResult run = run_and_check(setup, requests);
    const SchedulerMetrics& metrics = run.metrics;
    CHECK(run.largest_step > 8);  // decode rows and a prefill chunk together
    CHECK(run.largest_step <= 8 + 7);
    CHECK(run.steps < 8 * 40);
    CHECK(metrics.preemptions_total == 0);
    uint64_t prompt_tokens = 0;
    for (const Request& r : requests) prompt_tokens += r.prompt.size();
    CHECK(metrics.prompt_tokens_total == prompt_tokens);
    CHECK(metrics.generated_tokens_total > 8);
    // And each alone.
    for (const Request& r : requests) run_and_check(setup, {r});
}

TEST_CASE("seeds give the same text alone and batched, and other seeds other texts",
          "[scheduler]") {
    std::mt19937 random(3);
    const std::vector<int> prompt = random_prompt(random, 5, 5);
    std::vector<Request> requests;
    for (int i = 0; i < 6; ++i) requests.push_back(seeded_request(prompt, 25, 7 + i % 3));
    Setup setup;
    setup.options.parallel = 4;
    run_and_check(setup, requests);
    const Tokenizer tokenizer = Tokenizer::from_json(scheduler_tokenizer_json(), kVocab);
    std::set<std::string> texts;
    for (int i = 0; i < 3; ++i) texts.insert(expected_reply(tokenizer, requests[i], 96).text);
    CHECK(texts.size() == 3);
}

TEST_CASE("a pool too small for everyone preempts and still gives every reply", "[scheduler]") {
    std::mt19937 random(4);
    for (const int block_size : {1, 4, 16}) {
        DYNAMIC_SECTION("blocks of " << block_size) {
            const Tokenizer tokenizer = Tokenizer::from_json(scheduler_tokenizer_json(), kVocab);
            std::vector<Request> requests;
            while (requests.size() < 8) {  // replies of 40 to 50 tokens
                std::vector<int> prompt = random_prompt(random, 12, 20);
                const Request r = requests.size() % 2
                                      ? seeded_request(prompt, 50, 100 + requests.size())
                                      : greedy_request(prompt, 50);
                if (expected_reply(tokenizer, r, 96).completion_tokens >= 40) requests.push_back(r);
            }
            Setup setup;
            setup.block_size = block_size;
            setup.blocks = 128 / block_size;  // 128 positions for 8 x up to 83
            const RunResult run = run_and_check(setup, requests);
            CHECK(run.metrics.preemptions_total > 0);
        }
    }
}

TEST_CASE("shared prompt beginnings are computed once, copied on write", "[scheduler]") {
    std::mt19937 random(5);
    std::vector<int> whole = random_prompt(random, 10, 1);
    whole.pop_back();     // 11 tokens
    whole.push_back(20);  // 12: a prompt of whole blocks only
    Setup setup;
    const Tokenizer tokenizer = Tokenizer::from_json(scheduler_tokenizer_json(), kVocab);
    ChainBackend backend(setup.blocks, setup.block_size, setup.max_batch);
    Replies replies;
    std::vector<Request> requests;
    {
        SchedulerOptions options = setup.options;
        options.context = setup.context;
        Scheduler scheduler(backend, chain_config(setup.context), tokenizer, options, setup.blocks,
                            setup.block_size);
        Request first = greedy_request(whole, 10);
        requests.push_back(first);
        replies.attach(first);
        // The loop waits in the first reply's on_done until the next four are queued: they
        // are then admitted together and share the cached blocks, whatever the threads' speed.
        std::promise<void> queued;
        std::shared_future<void> all_queued = queued.get_future().share();
        first.on_done = [done = first.on_done, all_queued](const Completion& completion) {
            done(completion);
            all_queued.wait();
        };
        scheduler.submit(first);
        replies.wait_all();
        for (int i = 0; i < 4; ++i) {
            std::vector<int> prompt = whole;
            for (int t = 0; t < i; ++t) prompt.push_back(10 + t);
            requests.push_back(greedy_request(prompt, 10));
            replies.attach(requests.back());
            scheduler.submit(requests.back());
        }
        queued.set_value();
        replies.wait_all();
        CHECK(Replies::idle_metrics(scheduler).kv_blocks_used == 0);
    }
    for (size_t i = 0; i < requests.size(); ++i) {
        check_reply(*replies.all[i], expected_reply(tokenizer, requests[i], setup.context),
                    requests[i]);
        CHECK(replies.all[i]->completion.cached_prompt_tokens == (i == 0 ? 0 : int(whole.size())));
    }
    CHECK(backend.copies >= 1);  // the prompt of whole cached blocks wrote its last one
}

TEST_CASE("stop strings, end of turn, max_tokens and a full context end a reply", "[scheduler]") {
    std::mt19937 random(6);
    const Tokenizer tokenizer = Tokenizer::from_json(scheduler_tokenizer_json(), kVocab);
    std::vector<Request> requests;
    // Find prompts whose greedy replies are long enough to cut.
    while (requests.size() < 3) {
        Request r = greedy_request(random_prompt(random, 3, 10), 0);
        const Expected e = expected_reply(tokenizer, r, 60);
        if (e.text.size() < 12) continue;
        // Two ASCII characters from the middle (the stream holds a lone byte token back
        // until the next one, the whole-text decode shows it at once).
        size_t middle = e.text.size() / 2;
        while (middle + 2 < e.text.size() && (e.text[middle] & 0x80 || e.text[middle + 1] & 0x80))
            ++middle;
        Request stopped = r;
        stopped.stop_strings = {"zzzz", e.text.substr(middle, 2)};
        requests.push_back(stopped);
        requests.push_back(r);  // until its EOS or the full context
        Request limited = r;
        limited.max_tokens = 5;
        requests.push_back(limited);
    }
    Setup setup;
    setup.context = 60;
    run_and_check(setup, requests);
    // The reasons are the ones expected, and every kind came up.
    std::set<FinishReason> reasons;
    for (const Request& r : requests) reasons.insert(expected_reply(tokenizer, r, 60).reason);
    CHECK(reasons.count(FinishReason::Stop));
    CHECK(reasons.count(FinishReason::Length));

    // end_of_turn: the third greedy token of a reply ends it, unprinted.
    Request r = greedy_request(random_prompt(random, 3, 10), 0);
    std::vector<int> ids;
    {
        Sampler sampler(kVocab, r.sampling, 0);
        uint64_t key = 0;
        for (size_t p = 0; p < r.prompt.size(); ++p) key = next_key(key, r.prompt[p], int(p));
        std::vector<float> logits(kVocab);
        int pos = int(r.prompt.size());
        for (int i = 0; i < 3; ++i) {
            logits_of(key, logits.data());
            ids.push_back(sampler.sample(logits.data()));
            key = next_key(key, ids.back(), pos++);
        }
    }
    if (ids[2] != kEos && ids[2] != ids[0] && ids[2] != ids[1]) {
        r.end_of_turn = ids[2];
        const Expected e = expected_reply(tokenizer, r, 60);
        CHECK(e.completion_tokens == 3);
        CHECK(e.reason == FinishReason::Stop);
        run_and_check(setup, {r});
    }
}

TEST_CASE("the pool is the context of a request that outgrows it alone", "[scheduler]") {
    const Tokenizer tokenizer = Tokenizer::from_json(scheduler_tokenizer_json(), kVocab);
    std::mt19937 random(7);
    Request r;
    do {
        r = greedy_request(random_prompt(random, 9, 1), 0);
    } while (expected_reply(tokenizer, r, 16).reason != FinishReason::Length);
    Setup setup;
    setup.blocks = 4;  // 16 positions
    setup.context = 64;
    const Expected expected = expected_reply(tokenizer, r, 16);
    Replies replies;
    ChainBackend backend(setup.blocks, setup.block_size, setup.max_batch);
    {
        SchedulerOptions options = setup.options;
        options.context = setup.context;
        Scheduler scheduler(backend, chain_config(64), tokenizer, options, setup.blocks,
                            setup.block_size);
        replies.attach(r);
        scheduler.submit(r);
        replies.wait_all();
        // A prompt that alone needs more blocks than the pool is refused.
        Request big = greedy_request(std::vector<int>(17, 7), 1);
        CHECK_THROWS_WITH(scheduler.submit(big), "the prompt has 17 tokens; the KV cache holds 16");
        CHECK(Replies::idle_metrics(scheduler).kv_blocks_used == 0);
    }
    check_reply(*replies.all[0], expected, r);
}

TEST_CASE("submit refuses bad requests with a message, and a full queue", "[scheduler]") {
    const Tokenizer tokenizer = Tokenizer::from_json(scheduler_tokenizer_json(), kVocab);
    ChainBackend backend(64, 4, 16);
    SchedulerOptions options;
    options.context = 32;
    options.max_queue = 0;
    Scheduler scheduler(backend, chain_config(32), tokenizer, options, 64, 4);
    CHECK_THROWS_WITH(scheduler.submit(greedy_request({}, 1)), "the prompt has no tokens");
    CHECK_THROWS_WITH(scheduler.submit(greedy_request({1, 40}, 1)),
                      "the prompt has token id 40, outside the vocabulary of 40");
    CHECK_THROWS_WITH(scheduler.submit(greedy_request({1, -1}, 1)),
                      "the prompt has token id -1, outside the vocabulary of 40");
    CHECK_THROWS_WITH(scheduler.submit(greedy_request(std::vector<int>(32, 5), 1)),
                      "the prompt has 32 tokens; the context holds 32 (prompt and reply together)");
    CHECK_THROWS_WITH(scheduler.submit(greedy_request({1, 5}, -1)), Catch::Contains("max_tokens"));
    CHECK_THROWS_WITH(scheduler.submit(greedy_request({1, 5}, 1)),
                      "the queue is full (0 requests waiting)");
    CHECK(scheduler.metrics().requests_total == 0);
    CHECK_THROWS_AS(Scheduler(backend, chain_config(32), tokenizer, SchedulerOptions{0}, 64, 4),
                    Error);
}

TEST_CASE("a request whose logits are not finite fails alone", "[scheduler]") {
    const Tokenizer tokenizer = Tokenizer::from_json(scheduler_tokenizer_json(), kVocab);
    std::mt19937 random(8);
    Setup setup;
    ChainBackend backend(setup.blocks, setup.block_size, setup.max_batch);
    backend.nan_token = 39;
    std::vector<Request> requests;
    for (int i = 0; i < 4; ++i) {
        std::vector<int> prompt = random_prompt(random, 2, 5);
        std::replace(prompt.begin(), prompt.end(), 39, 38);
        if (i == 1) prompt.push_back(39);
        requests.push_back(greedy_request(prompt, 0));
        // The others must not draw 39 either.
        while (i != 1 &&
               expected_reply(tokenizer, requests.back(), 96).text.find("w39") != std::string::npos)
            requests.back().prompt.push_back(20);
    }
    Replies replies;
    {
        SchedulerOptions options = setup.options;
        options.context = setup.context;
        Scheduler scheduler(backend, chain_config(setup.context), tokenizer, options, setup.blocks,
                            setup.block_size);
        for (Request& r : requests) {
            replies.attach(r);
            scheduler.submit(r);
        }
        replies.wait_all();
        CHECK(Replies::idle_metrics(scheduler).kv_blocks_used == 0);
    }
    for (size_t i = 0; i < requests.size(); ++i) {
        if (i == 1) {
            CHECK(replies.all[i]->completion.finish_reason == FinishReason::Failed);
            CHECK_THAT(replies.all[i]->completion.error, Catch::Contains("not finite"));
            CHECK(replies.all[i]->text.empty());
        } else {
            check_reply(*replies.all[i], expected_reply(tokenizer, requests[i], 96), requests[i]);
        }
    }
}

TEST_CASE("cancel ends a running or a waiting request once, at the next step", "[scheduler]") {
    const Tokenizer tokenizer = Tokenizer::from_json(scheduler_tokenizer_json(), kVocab);
    Setup setup;
    setup.options.parallel = 1;
    ChainBackend backend(setup.blocks, setup.block_size, setup.max_batch);
    Replies replies;
    std::mt19937 random(9);
    Request running = seeded_request(random_prompt(random, 3, 3), 0, 1);
    Request waiting = greedy_request(random_prompt(random, 3, 3), 0);
    {
        SchedulerOptions options = setup.options;
        options.context = setup.context;
        Scheduler scheduler(backend, chain_config(setup.context), tokenizer, options, setup.blocks,
                            setup.block_size);
        // The running request is cancelled from its own text callback (as a server does
        // when the client is gone), after its first piece.
        const auto reply = replies.attach(running);
        uint64_t id = 0;
        std::mutex id_mutex;
        const auto on_text = running.on_text;
        running.on_text = [&, on_text](const std::string& text) {
            on_text(text);
            std::lock_guard<std::mutex> lock(id_mutex);
            scheduler.cancel(id);
        };
        {
            std::lock_guard<std::mutex> lock(id_mutex);
            id = scheduler.submit(running);
        }
        replies.attach(waiting);
        const uint64_t waiting_id = scheduler.submit(waiting);
        scheduler.cancel(waiting_id);
        replies.wait_all();
        scheduler.cancel(waiting_id);  // ended already: nothing
        scheduler.cancel(12345);       // never was: nothing
        CHECK(Replies::idle_metrics(scheduler).kv_blocks_used == 0);
    }
    CHECK(replies.all[0]->completion.finish_reason == FinishReason::Cancelled);
    CHECK(replies.all[0]->completion.completion_tokens >= 1);
    CHECK_FALSE(replies.all[0]->text.empty());
    CHECK(replies.all[1]->completion.finish_reason == FinishReason::Cancelled);
    CHECK(replies.all[1]->completion.completion_tokens == 0);
    for (const auto& r : replies.all) CHECK(r->done_calls == 1);
}

TEST_CASE("requests still open when the scheduler ends end as cancelled", "[scheduler]") {
    const Tokenizer tokenizer = Tokenizer::from_json(scheduler_tokenizer_json(), kVocab);
    ChainBackend backend(64, 4, 16);
    Replies replies;
    {
        SchedulerOptions options;
        options.context = 64;
        options.parallel = 2;
        Scheduler scheduler(backend, chain_config(64), tokenizer, options, 64, 4);
        for (int i = 0; i < 5; ++i) {
            Request r = greedy_request({1, 5 + i}, 0);
            replies.attach(r);
            scheduler.submit(r);
        }
    }
    for (const auto& r : replies.all) CHECK(r->done_calls == 1);
}

TEST_CASE("1,000 requests with random cancels and preemptions end with every block free",
          "[scheduler]") {
    const Tokenizer tokenizer = Tokenizer::from_json(scheduler_tokenizer_json(), kVocab);
    std::mt19937 random(10);
    Setup setup;
    setup.blocks = 40;  // 160 positions for 8 sequences of up to 70
    setup.context = 70;
    setup.options.max_queue = 1000;
    ChainBackend backend(setup.blocks, setup.block_size, setup.max_batch);
    Replies replies;
    std::vector<Request> requests;
    std::vector<bool> cancel_from_text;
    SchedulerMetrics metrics;
    {
        SchedulerOptions options = setup.options;
        options.context = setup.context;
        Scheduler scheduler(backend, chain_config(setup.context), tokenizer, options, setup.blocks,
                            setup.block_size);
        std::vector<uint64_t> ids;
        for (int i = 0; i < 1000; ++i) {
            std::vector<int> prompt = random_prompt(random, 8, 20);
            const int max_tokens = std::uniform_int_distribution<int>(1, 40)(random);
            Request r = i % 3 ? greedy_request(prompt, max_tokens)
                              : seeded_request(prompt, max_tokens, uint64_t(i));
            requests.push_back(r);
            replies.attach(r);
            const int how = std::uniform_int_distribution<int>(0, 9)(random);
            cancel_from_text.push_back(how == 0);
            if (how == 0) {
                // Cancelled from its callback at its first text (like a client that leaves).
                auto* s = &scheduler;
                auto shared_id = std::make_shared<std::atomic<uint64_t>>(0);
                const auto on_text = r.on_text;
                r.on_text = [s, shared_id, on_text](const std::string& text) {
                    on_text(text);
                    if (shared_id->load()) s->cancel(shared_id->load());
                };
                shared_id->store(scheduler.submit(r));
            } else {
                ids.push_back(scheduler.submit(r));
                if (how == 1) scheduler.cancel(ids.back());  // at once, most while waiting
            }
            if (how == 2 && ids.size() > 3) scheduler.cancel(ids[ids.size() - 3]);  // maybe running
        }
        replies.wait_all();
        metrics = Replies::idle_metrics(scheduler);
    }
    int cancelled = 0, compared = 0;
    for (size_t i = 0; i < requests.size(); ++i) {
        const Reply& reply = *replies.all[i];
        REQUIRE(reply.done_calls == 1);
        if (reply.completion.finish_reason == FinishReason::Cancelled) {
            ++cancelled;
            continue;
        }
        const Expected expected = expected_reply(tokenizer, requests[i], setup.context);
        INFO("request " << i);
        REQUIRE(reply.text == expected.text);
        REQUIRE(reply.completion.finish_reason == expected.reason);
        ++compared;
    }
    CHECK(cancelled > 100);
    CHECK(compared > 500);
    CHECK(metrics.preemptions_total > 10);
    CHECK(metrics.kv_blocks_used == 0);
    CHECK(metrics.kv_blocks_free == setup.blocks);
    CHECK(metrics.kv_tokens_held == 0);
    CHECK(metrics.requests_total == 1000);
}
