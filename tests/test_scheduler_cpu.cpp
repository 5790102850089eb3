// The scheduler end to end on the CPU backend's paged KV cache (Backend::step) and a small
// synthetic f32 model with random weights: every reply of a batch, token for token, equal to
// what generate() (the `run` path: one prefill, then one forward per token, on a backend
// with a contiguous KV cache) gives for the same request alone, with prompts that share a
// beginning, prompts longer than a prefill chunk, block sizes 16/32/64, a pool so small that
// sequences are preempted and recomputed, and 1,000 requests with random cancels.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "generation/generate.h"
#include "scheduler_tokenizer.h"
#include "serve/scheduler.h"

using namespace barellm;
using namespace barellm::serve;
using nlohmann::json;

namespace {

constexpr int kVocab = kSchedulerVocab;
constexpr int kContext = 160;

// A llama-shaped f32 model with random weights (dim 48, feed-forward 100, 2 layers, 4 query
// heads over 2 KV heads of 12), written once per process, removed at its end.
struct SynthModel {
    std::string path;
    SynthModel() {
        path = "/tmp/barellm_test_" + std::to_string(getpid()) + "_scheduler_cpu.barellm";
        const int dim = 48, hidden = 100, layers = 2, heads = 4, kv_heads = 2, head_dim = 12;
        const json config = {{"architecture", "llama"},
                             {"dim", dim},
                             {"hidden_dim", hidden},
                             {"layers", layers},
                             {"heads", heads},
                             {"kv_heads", kv_heads},
                             {"head_dim", head_dim},
                             {"vocab_size", kVocab},
                             {"max_context", kContext},
                             {"rope_theta", 10000.0},
                             {"norm_eps", 1e-5},
                             {"tied_embeddings", true},
                             {"bos_id", 1},
                             {"eos_ids", {2}},
                             {"weight_dtype", "F32"}};
        json header;
        std::string data;
        std::mt19937 random(42);
        const auto add = [&](const std::string& name, std::vector<int64_t> shape, float scale,
                             float offset) {
            size_t count = 1;
            for (int64_t d : shape) count *= size_t(d);
            std::normal_distribution<float> normal(offset, scale);
            const size_t begin = data.size();
            for (size_t i = 0; i < count; ++i) {
                const float value = normal(random);
                data.append(reinterpret_cast<const char*>(&value), sizeof value);
            }
            header[name] = {
                {"dtype", "F32"}, {"shape", shape}, {"data_offsets", {begin, data.size()}}};
        };
        add("token_embedding", {kVocab, dim}, 1.0f, 0.0f);
        for (int l = 0; l < layers; ++l) {
            const std::string p = "layers." + std::to_string(l) + ".";
            add(p + "attn_norm", {dim}, 0.1f, 1.0f);
            add(p + "wq", {heads * head_dim, dim}, 0.3f, 0.0f);
            add(p + "wk", {kv_heads * head_dim, dim}, 0.3f, 0.0f);
            add(p + "wv", {kv_heads * head_dim, dim}, 0.3f, 0.0f);
            add(p + "wo", {dim, heads * head_dim}, 0.15f, 0.0f);
            add(p + "ffn_norm", {dim}, 0.1f, 1.0f);
            add(p + "w1", {hidden, dim}, 0.15f, 0.0f);
            add(p + "w3", {hidden, dim}, 0.15f, 0.0f);
            add(p + "w2", {dim, hidden}, 0.1f, 0.0f);
        }
        add("final_norm", {dim}, 0.1f, 1.0f);
        header["__metadata__"] = {{"barellm.format", "1"},
                                  {"barellm.config", config.dump()},
                                  {"barellm.tokenizer", scheduler_tokenizer_json()}};
        std::string text = header.dump();
        text.resize((text.size() + 7) / 8 * 8, ' ');
        const uint64_t length = text.size();
        std::ofstream out(path, std::ios::binary);
        out.write(reinterpret_cast<const char*>(&length), sizeof length);
        out << text << data;
    }
    ~SynthModel() { std::remove(path.c_str()); }
};

const ModelAndTokenizer& model() {
    static SynthModel file;
    static const ModelAndTokenizer loaded = load_model_and_tokenizer(file.path);
    return loaded;
}

struct Reply {
    std::string text;
    Completion completion;
    int done_calls = 0;
};

struct Replies {
    std::mutex mutex;
    std::condition_variable changed;
    std::vector<std::shared_ptr<Reply>> all;

    std::shared_ptr<Reply> attach(Request& request) {
        auto reply = std::make_shared<Reply>();
        request.on_text = [this, reply](const std::string& text) {
            std::lock_guard<std::mutex> lock(mutex);
            reply->text += text;
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
    void wait_all() {
        std::unique_lock<std::mutex> lock(mutex);
        REQUIRE(changed.wait_for(lock, std::chrono::seconds(300), [&] {
            for (const auto& r : all)
                if (r->done_calls == 0) return false;
            return true;
        }));
    }
};

SchedulerMetrics idle_metrics(const Scheduler& scheduler) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    SchedulerMetrics m = scheduler.metrics();
    while ((m.running > 0 || m.queue_length > 0) && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        m = scheduler.metrics();
    }
    return m;
}

struct Expected {
    std::string text;
    FinishReason reason;
    int completion_tokens;
};

// What `barellm run` prints for the request: generate() on a backend of its own.
Expected generate_alone(const Request& request, int context) {
    const ModelAndTokenizer& m = model();
    BackendOptions options;
    options.context = context;
    options.kv_type = KvType::F32;
    const std::unique_ptr<Backend> backend = make_cpu_backend(m.model, options);
    Sampler sampler(kVocab, request.sampling, request.seed);
    GenerateOptions generate_options;
    generate_options.max_tokens = request.max_tokens > 0 ? request.max_tokens : context;
    generate_options.context = context;
    generate_options.end_of_turn = request.end_of_turn;
    generate_options.stop_strings = request.stop_strings;
    Expected expected{"", FinishReason::Stop, 0};
    const GenerateStats stats =
        generate(*backend, m.model.config, m.tokenizer, sampler, request.prompt, generate_options,
                 [&](const std::string& text) { expected.text += text; });
    expected.completion_tokens = stats.generated_tokens;
    expected.reason =
        stats.stop_reason == StopReason::TokenLimit || stats.stop_reason == StopReason::ContextFull
            ? FinishReason::Length
            : FinishReason::Stop;
    return expected;
}

struct Pool {
    int blocks = 64, block_size = 16;
    SchedulerOptions options;
    Pool() {
        options.parallel = 8;
        options.context = kContext;
        options.prefill_chunk = 32;
    }
};

struct Run {
    std::vector<std::shared_ptr<Reply>> replies;
    SchedulerMetrics metrics;
};

// Submits every request at once to a scheduler on a paged CPU backend; waits for them all.
Run run_batch(const Pool& pool, std::vector<Request> requests) {
    const ModelAndTokenizer& m = model();
    BackendOptions options;
    options.context = kContext;
    options.kv_type = KvType::F32;
    options.kv_blocks = pool.blocks;
    options.kv_block_size = pool.block_size;
    const std::unique_ptr<Backend> backend = make_cpu_backend(m.model, options);
    Replies replies;
    Run run;
    {
        Scheduler scheduler(*backend, m.model.config, m.tokenizer, pool.options, pool.blocks,
                            pool.block_size);
        for (Request& r : requests) {
            replies.attach(r);
            scheduler.submit(r);
        }
        replies.wait_all();
        run.metrics = idle_metrics(scheduler);
    }
    run.replies = replies.all;
    CHECK(run.metrics.kv_blocks_used == 0);
    CHECK(run.metrics.kv_blocks_free == pool.blocks);
    return run;
}

void check_equal(const Reply& reply, const Expected& expected) {
    CHECK(reply.done_calls == 1);
    CHECK(reply.text == expected.text);
    CHECK(reply.completion.finish_reason == expected.reason);
    CHECK(reply.completion.completion_tokens == expected.completion_tokens);
}

// BOS, one of three shared beginnings of `shared` tokens, a tail of 1..max_tail.
std::vector<int> random_prompt(std::mt19937& random, int shared, int max_tail) {
    std::vector<int> prompt = {1};
    std::mt19937 beginning(uint32_t(random() % 3));
    for (int i = 0; i < shared; ++i)
        prompt.push_back(std::uniform_int_distribution<int>(6, kVocab - 1)(beginning));
    const int tail = std::uniform_int_distribution<int>(1, max_tail)(random);
    for (int i = 0; i < tail; ++i)
        prompt.push_back(std::uniform_int_distribution<int>(6, kVocab - 1)(random));
    return prompt;
}

Request make_request(std::vector<int> prompt, int max_tokens, float temperature, uint64_t seed) {
    Request request;
    request.prompt = std::move(prompt);
    request.max_tokens = max_tokens;
    request.sampling.temperature = temperature;
    request.seed = seed;
    return request;
}

}  // namespace

TEST_CASE("8 concurrent greedy requests on the CPU are token for token what run gives",
          "[scheduler_cpu]") {
    std::mt19937 random(1);
    std::vector<Request> requests;
    for (int i = 0; i < 8; ++i)  // some prompts longer than a prefill chunk of 32
        requests.push_back(make_request(random_prompt(random, 20, i % 2 ? 50 : 8), 40, 0, 0));
    std::vector<Expected> expected;
    for (const Request& r : requests) expected.push_back(generate_alone(r, kContext));
    int lengths = 0;
    for (const Expected& e : expected) lengths += e.completion_tokens;
    CHECK(lengths > 8 * 10);  // the replies are not all cut short by an EOS

    for (const int block_size : {16, 32, 64}) {
        DYNAMIC_SECTION("blocks of " << block_size) {
            Pool pool;
            pool.block_size = block_size;
            pool.blocks = 1024 / block_size;
            const Run batched = run_batch(pool, requests);
            for (size_t i = 0; i < requests.size(); ++i) {
                INFO("request " << i);
                check_equal(*batched.replies[i], expected[i]);
            }
            CHECK(batched.metrics.preemptions_total == 0);
            // And each alone through the scheduler.
            for (size_t i = 0; i < requests.size(); i += 3)
                check_equal(*run_batch(pool, {requests[i]}).replies[0], expected[i]);
        }
    }
}

TEST_CASE("seeded requests on the CPU give the same text alone and batched", "[scheduler_cpu]") {
    std::mt19937 random(2);
    std::vector<Request> requests;
    const std::vector<int> prompt = random_prompt(random, 10, 10);
    for (int i = 0; i < 6; ++i) {
        requests.push_back(make_request(prompt, 30, 0.9f, 1000 + i % 3));
        requests.back().stop_strings = {"wzq"};
    }
    const Run batched = run_batch(Pool(), requests);
    for (size_t i = 0; i < requests.size(); ++i) {
        INFO("request " << i);
        check_equal(*batched.replies[i], generate_alone(requests[i], kContext));
    }
    CHECK(batched.replies[0]->text == batched.replies[3]->text);
    CHECK(batched.replies[0]->text != batched.replies[1]->text);
}

TEST_CASE("a tight pool on the CPU preempts and the replies stay what run gives",
          "[scheduler_cpu]") {
    std::mt19937 random(3);
    std::vector<Request> requests;
    std::vector<Expected> expected;
    while (requests.size() < 8) {  // long replies, so that the pool runs out
        Request r = make_request(random_prompt(random, 16, 20), 60, requests.size() % 2 ? 0.8f : 0,
                                 requests.size());
        const Expected e = generate_alone(r, kContext);
        if (e.completion_tokens < 40) continue;
        requests.push_back(r);
        expected.push_back(e);
    }
    Pool pool;
    pool.blocks = 14;  // 224 positions for 8 x up to 97
    const Run run = run_batch(pool, requests);
    for (size_t i = 0; i < requests.size(); ++i) {
        INFO("request " << i);
        check_equal(*run.replies[i], expected[i]);
    }
    CHECK(run.metrics.preemptions_total > 0);
}

TEST_CASE("1,000 requests on the CPU with random cancels end with every block free",
          "[scheduler_cpu]") {
    const ModelAndTokenizer& m = model();
    std::mt19937 random(4);
    Pool pool;
    pool.blocks = 12;
    pool.options.max_queue = 1000;
    BackendOptions options;
    options.context = kContext;
    options.kv_type = KvType::F32;
    options.kv_blocks = pool.blocks;
    options.kv_block_size = pool.block_size;
    const std::unique_ptr<Backend> backend = make_cpu_backend(m.model, options);
    std::vector<Request> requests;
    Replies replies;
    SchedulerMetrics metrics;
    {
        Scheduler scheduler(*backend, m.model.config, m.tokenizer, pool.options, pool.blocks,
                            pool.block_size);
        std::vector<uint64_t> ids;
        for (int i = 0; i < 1000; ++i) {
            Request r = make_request(random_prompt(random, 18, 12),
                                     std::uniform_int_distribution<int>(1, 40)(random),
                                     i % 2 ? 0.7f : 0, uint64_t(i));
            requests.push_back(r);
            replies.attach(r);
            ids.push_back(scheduler.submit(r));
            if (random() % 6 == 0) scheduler.cancel(ids[random() % ids.size()]);
        }
        replies.wait_all();
        metrics = idle_metrics(scheduler);
    }
    int cancelled = 0;
    for (size_t i = 0; i < requests.size(); ++i) {
        REQUIRE(replies.all[i]->done_calls == 1);
        const FinishReason reason = replies.all[i]->completion.finish_reason;
        REQUIRE(reason != FinishReason::Failed);
        cancelled += reason == FinishReason::Cancelled;
    }
    // A sample of the finished ones against run.
    for (size_t i = 0; i < requests.size(); i += 50)
        if (replies.all[i]->completion.finish_reason != FinishReason::Cancelled) {
            INFO("request " << i);
            check_equal(*replies.all[i], generate_alone(requests[i], kContext));
        }
    CHECK(cancelled > 50);
    CHECK(metrics.preemptions_total > 0);
    CHECK(metrics.kv_blocks_used == 0);
    CHECK(metrics.kv_blocks_free == pool.blocks);
    CHECK(metrics.kv_tokens_held == 0);
    CHECK(metrics.requests_total == 1000);
}
