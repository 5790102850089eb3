// The server's loop (scheduler.h). Each step:
//   1. cancels: requests cancel() named end, their blocks freed;
//   2. admits waiting requests, oldest first, while the batch has room and their KV blocks
//      fit (the cached blocks of a shared prompt prefix are taken, not computed again);
//   3. plans the rows: the last drawn token of each decoding sequence, then up to
//      prefill_chunk prompt tokens of the sequences still reading their prompt, oldest first;
//      every row's slot made writable (a new block, or a private copy of a shared one). When
//      blocks run out the youngest sequence is preempted: its blocks are freed and it goes
//      back to the front of the queue with its prompt and the tokens drawn so far, which it
//      computes again when readmitted (its sampler and text stream continue where they were);
//   4. runs them through one Backend::step;
//   5. samples each sequence that had its last token's logits, streams the new text and
//      retires the finished ones.
// Requests are parsed on the caller's thread (submit) and handed over under the mutex; the
// block books and the running sequences belong to the loop's thread alone.
#include "serve/scheduler.h"

#include <omp.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_set>

#include "generation/generate.h"
#include "generation/stop_strings.h"
#include "serve/kv_blocks.h"
#include "util/error.h"
#include "util/timing.h"

namespace barellm::serve {

namespace {

struct Sequence {
    uint64_t id = 0;  // 0 once finished
    Request request;
    std::vector<int> tokens;  // the prompt, then every token drawn
    int computed = 0;         // leading positions whose keys and values are in the cache
    int drawn = 0;
    bool admitted_before = false;
    int cached_prompt_tokens = 0;  // at its first admission
    Clock::time_point submitted;
    double seconds_to_first_token = 0;
    Sampler sampler;
    StreamDecoder decoder;
    StopStrings stops;

    Sequence(Request&& r, const Config& config, const Tokenizer& tokenizer)
        : request(std::move(r)),
          tokens(request.prompt),
          submitted(Clock::now()),
          sampler(config.vocab_size, request.sampling, request.seed),
          decoder(tokenizer, /*skip_special=*/!request.keep_special_text),
          stops(request.stop_strings) {
        for (int token : tokens) {
            decoder.push(token);  // so that the continuation decodes in context
            sampler.accept(token);
        }
    }
    int pending() const { return int(tokens.size()) - computed; }
};

// The rows one sequence runs in a step: positions [first, first + count).
struct Planned {
    Sequence* sequence;
    int first, count;
};

}  // namespace

struct Scheduler::State {
    Backend& backend;
    const Config config;        // copies: the caller's may be temporaries
    const Tokenizer tokenizer;  // (it shares its tables)
    SchedulerOptions options;
    int parallel, context;
    KvBlocks books;

    std::mutex mutex;
    std::condition_variable wake;
    // Guarded by `mutex`:
    std::deque<std::unique_ptr<Sequence>> waiting;  // the queue, oldest first
    std::unordered_set<uint64_t> cancelled;         // ids cancel() named since the last step
    bool stopping = false;
    uint64_t next_id = 1;
    SchedulerMetrics metrics;

    // The loop's thread only:
    std::vector<std::unique_ptr<Sequence>> running;  // sorted oldest first by plan_rows()
    std::vector<float> scratch;                      // [vocab_size], the sampler's input
    std::thread loop;

    State(Backend& backend, const Config& config, const Tokenizer& tokenizer,
          const SchedulerOptions& options, int kv_blocks, int kv_block_size)
        : backend(backend),
          config(config),
          tokenizer(tokenizer),
          options(options),
          parallel(std::min(options.parallel, backend.max_batch())),
          context(options.context > 0 ? options.context : config.max_context),
          books(kv_blocks, kv_block_size),
          scratch(config.vocab_size) {
        if (options.parallel < 1 || options.max_queue < 0 || options.prefill_chunk < 1)
            throw Error(
                "scheduler: parallel and prefill_chunk must be at least 1, max_queue "
                "at least 0");
        if (context < 2) throw Error("scheduler: the context must hold at least 2 positions");
        metrics.kv_block_size = kv_block_size;
        metrics.kv_blocks_free = kv_blocks;
    }

    void run_loop();
    bool step();
    void take_cancels();
    void admit();
    std::vector<Planned> plan_rows();
    bool preempt_youngest(const Sequence& needing);
    void sample(Sequence& seq, const float* logits);
    void finish(Sequence& seq, FinishReason reason, const std::string& error = "");
    void remove_finished();
    void publish_metrics(int batch_rows);
};

void Scheduler::State::finish(Sequence& seq, FinishReason reason, const std::string& error) {
    if (reason == FinishReason::Stop || reason == FinishReason::Length) {
        const std::string rest = seq.stops.push(seq.decoder.flush());
        if (!rest.empty()) seq.request.on_text(rest);
        if (!seq.stops.stopped()) {
            const std::string held = seq.stops.flush();
            if (!held.empty()) seq.request.on_text(held);
        }
    }
    if (books.is_open(seq.id)) books.close(seq.id);
    Completion completion;
    completion.finish_reason = reason;
    completion.prompt_tokens = int(seq.request.prompt.size());
    completion.completion_tokens = seq.drawn;
    completion.cached_prompt_tokens = seq.cached_prompt_tokens;
    completion.seconds_to_first_token = seq.seconds_to_first_token;
    completion.error = error;
    seq.request.on_done(completion);
    seq.id = 0;  // finished: removed from `running` by remove_finished()
}

void Scheduler::State::remove_finished() {
    running.erase(std::remove_if(running.begin(), running.end(),
                                 [](const std::unique_ptr<Sequence>& s) { return s->id == 0; }),
                  running.end());
}

void Scheduler::State::take_cancels() {
    std::vector<std::unique_ptr<Sequence>> dropped;
    std::unordered_set<uint64_t> ids;
    {
        std::lock_guard<std::mutex> lock(mutex);
        ids.swap(cancelled);
        for (auto it = waiting.begin(); it != waiting.end();)
            if (ids.count((*it)->id)) {
                dropped.push_back(std::move(*it));
                it = waiting.erase(it);
            } else {
                ++it;
            }
    }
    for (auto& seq : dropped) finish(*seq, FinishReason::Cancelled);
    for (auto& seq : running)
        if (ids.count(seq->id)) finish(*seq, FinishReason::Cancelled);
    remove_finished();
}

void Scheduler::State::admit() {
    while (int(running.size()) < parallel) {
        std::unique_ptr<Sequence> seq;
        {
            std::lock_guard<std::mutex> lock(mutex);
            if (waiting.empty()) return;
            Sequence& front = *waiting.front();
            // A sequence preempted with more tokens than the whole pool holds can never
            // come back: its context (the pool) is full.
            if (books.blocks_for(int(front.tokens.size())) <= books.total_blocks()) {
                // Keep a block per running sequence for its next token, so that an admission
                // does not at once preempt someone.
                const int reserve = int(running.size());
                if (books.blocks_to_open(front.tokens) + reserve > books.free_blocks()) return;
            }
            seq = std::move(waiting.front());
            waiting.pop_front();
        }
        if (books.blocks_for(int(seq->tokens.size())) > books.total_blocks()) {
            finish(*seq, FinishReason::Length);
            continue;
        }
        const int cached = books.open(seq->id, seq->tokens);
        if (cached < 0) throw Error("scheduler: the KV blocks of an admitted request do not fit");
        if (!seq->admitted_before)
            seq->cached_prompt_tokens = std::min(cached, int(seq->request.prompt.size()));
        seq->admitted_before = true;
        // The last token runs even when cached: its logits give the next token.
        seq->computed = std::min(cached, int(seq->tokens.size()) - 1);
        running.push_back(std::move(seq));
    }
}

bool Scheduler::State::preempt_youngest(const Sequence& needing) {
    const auto youngest = running.end() - 1;  // plan_rows() sorted them
    if (running.size() == 1) {
        // Alone and still out of blocks: the pool is its context, and it is full.
        finish(**youngest, FinishReason::Length);
        remove_finished();
        return false;
    }
    const bool self = (*youngest)->id == needing.id;
    std::unique_ptr<Sequence> seq = std::move(*youngest);
    running.erase(youngest);
    books.close(seq->id);
    seq->computed = 0;
    std::lock_guard<std::mutex> lock(mutex);
    waiting.push_front(std::move(seq));
    ++metrics.preemptions_total;
    return !self;
}

std::vector<Planned> Scheduler::State::plan_rows() {
    std::vector<BlockCopy> copies;
    std::vector<Planned> plan;
    int decoding = 0;
    for (const auto& seq : running) decoding += seq->pending() == 1;
    int prefill_budget =
        std::min(options.prefill_chunk, std::max(0, backend.max_batch() - decoding));
    // Oldest first: the youngest, the one preempted when blocks run out, has no rows yet.
    std::sort(running.begin(), running.end(),
              [](const std::unique_ptr<Sequence>& a, const std::unique_ptr<Sequence>& b) {
                  return a->id < b->id;
              });
    for (size_t i = 0; i < running.size(); ++i) {
        Sequence& seq = *running[i];
        const int count = seq.pending() == 1 ? 1 : std::min(prefill_budget, seq.pending());
        if (count == 0) continue;
        int made = 0;
        while (made < count) {
            if (books.make_writable(seq.id, seq.computed + made, copies)) {
                ++made;
                continue;
            }
            if (!preempt_youngest(seq)) break;  // it was this one (or it is finished)
        }
        if (i >= running.size() || running[i].get() != &seq) break;  // this one left
        if (seq.pending() > 1) prefill_budget -= count;
        plan.push_back({&seq, seq.computed, count});
    }
    for (const BlockCopy& copy : copies) backend.copy_kv_block(copy.from, copy.to);
    return plan;
}

void Scheduler::State::sample(Sequence& seq, const float* logits) {
    const int pos = int(seq.tokens.size()) - 1;
    check_finite(logits, config.vocab_size, pos);
    std::copy(logits, logits + config.vocab_size, scratch.begin());
    const int next = seq.sampler.sample(scratch.data());
    seq.sampler.accept(next);
    if (seq.drawn++ == 0) seq.seconds_to_first_token = seconds_since(seq.submitted);
    {
        std::lock_guard<std::mutex> lock(mutex);
        ++metrics.generated_tokens_total;
    }
    const bool eos =
        next == seq.request.end_of_turn ||
        std::find(config.eos_ids.begin(), config.eos_ids.end(), next) != config.eos_ids.end();
    if (eos) return finish(seq, FinishReason::Stop);
    seq.tokens.push_back(next);
    const std::string text = seq.stops.push(seq.decoder.push(next));
    if (!text.empty()) seq.request.on_text(text);
    if (seq.stops.stopped()) return finish(seq, FinishReason::Stop);
    // The new token would take position tokens.size() - 1.
    if (int(seq.tokens.size()) > context ||
        (seq.request.max_tokens > 0 && seq.drawn >= seq.request.max_tokens))
        finish(seq, FinishReason::Length);
}

bool Scheduler::State::step() {
    take_cancels();
    admit();
    const std::vector<Planned> plan = plan_rows();
    if (plan.empty()) return false;

    std::vector<StepRow> rows;
    for (const Planned& p : plan) {
        const std::vector<int>& table = books.table(p.sequence->id);
        for (int pos = p.first; pos < p.first + p.count; ++pos)
            rows.push_back({p.sequence->tokens[pos], pos, table.data(),
                            pos == int(p.sequence->tokens.size()) - 1});
    }
    const float* logits = nullptr;
    try {
        logits = backend.step(rows.data(), int(rows.size()));
    } catch (const std::exception& e) {
        for (const Planned& p : plan) finish(*p.sequence, FinishReason::Failed, e.what());
        remove_finished();
        publish_metrics(int(rows.size()));
        return true;
    }
    for (const Planned& p : plan) {
        Sequence& seq = *p.sequence;
        seq.computed += p.count;
        books.publish(seq.id, seq.tokens, seq.computed);
        if (seq.pending() > 0) continue;  // more of its prompt next step
        try {
            sample(seq, logits);
        } catch (const std::exception& e) {
            finish(seq, FinishReason::Failed, e.what());
        }
        logits += config.vocab_size;
    }
    remove_finished();
    publish_metrics(int(rows.size()));
    return true;
}

void Scheduler::State::publish_metrics(int batch_rows) {
    int held = 0;
    for (const auto& seq : running) held += int(seq->tokens.size());
    std::lock_guard<std::mutex> lock(mutex);
    metrics.queue_length = int(waiting.size());
    metrics.running = int(running.size());
    metrics.last_batch_rows = batch_rows;
    metrics.kv_blocks_used = books.used_blocks();
    metrics.kv_blocks_free = books.free_blocks();
    metrics.kv_tokens_held = held;
}

void Scheduler::State::run_loop() {
    while (true) {
        {
            std::unique_lock<std::mutex> lock(mutex);
            wake.wait(lock, [&] {
                return stopping || !waiting.empty() || !running.empty() || !cancelled.empty();
            });
            if (stopping) break;
        }
        try {
            if (!step()) publish_metrics(0);
        } catch (const std::exception& e) {
            // The books disagree with themselves: end every request rather than serve wrong
            // text.
            for (auto& seq : running) finish(*seq, FinishReason::Failed, e.what());
            running.clear();
            std::lock_guard<std::mutex> lock(mutex);
            for (auto& seq : waiting) cancelled.insert(seq->id);
        }
    }
    std::deque<std::unique_ptr<Sequence>> left;
    {
        std::lock_guard<std::mutex> lock(mutex);
        left.swap(waiting);
    }
    for (auto& seq : running) finish(*seq, FinishReason::Cancelled);
    for (auto& seq : left) finish(*seq, FinishReason::Cancelled);
    running.clear();
}

Scheduler::Scheduler(Backend& backend, const Config& config, const Tokenizer& tokenizer,
                     const SchedulerOptions& options, int kv_blocks, int kv_block_size)
    : state_(
          std::make_unique<State>(backend, config, tokenizer, options, kv_blocks, kv_block_size)) {
    if (options.loop_thread == LoopThread::Caller) return;
    // The backend's kernels run OpenMP teams on the loop's thread, which would otherwise
    // start with OpenMP's initial thread count rather than the one set here (--threads).
    const int threads = omp_get_max_threads();
    state_->loop = std::thread([this, threads] {
        omp_set_num_threads(threads);
        state_->run_loop();
    });
}

Scheduler::~Scheduler() {
    stop();
    if (state_->loop.joinable()) state_->loop.join();
}

void Scheduler::run() {
    if (state_->options.loop_thread != LoopThread::Caller)
        throw Error("scheduler: run() is for a loop on the caller's thread");
    state_->run_loop();
}

void Scheduler::stop() {
    {
        std::lock_guard<std::mutex> lock(state_->mutex);
        state_->stopping = true;
    }
    state_->wake.notify_one();
}

uint64_t Scheduler::submit(Request request) {
    State& s = *state_;
    const int count = int(request.prompt.size());
    if (count == 0) throw Error("the prompt has no tokens");
    for (int id : request.prompt)
        if (id < 0 || id >= s.config.vocab_size)
            throw Error("the prompt has token id " + std::to_string(id) +
                        ", outside the vocabulary of " + std::to_string(s.config.vocab_size));
    if (count >= s.context)
        throw Error("the prompt has " + std::to_string(count) + " tokens; the context holds " +
                    std::to_string(s.context) + " (prompt and reply together)");
    if (request.max_tokens < 0)
        throw Error("max_tokens must be 0 (until the context is full) or more, got " +
                    std::to_string(request.max_tokens));
    // The pool's size and block size never change: read here without the loop's thread.
    if (s.books.blocks_for(count) > s.books.total_blocks())
        throw Error("the prompt has " + std::to_string(count) + " tokens; the KV cache holds " +
                    std::to_string(s.books.total_blocks() * s.books.block_size()));
    // The sampler and decoder read the whole prompt: outside the lock. The id (the age that
    // preemption goes by) is given under it.
    auto seq = std::make_unique<Sequence>(std::move(request), s.config, s.tokenizer);
    std::unique_lock<std::mutex> lock(s.mutex);
    if (int(s.waiting.size()) >= s.options.max_queue)
        throw Error("the queue is full (" + std::to_string(s.options.max_queue) +
                    " requests waiting)");
    const uint64_t id = s.next_id++;
    seq->id = id;
    s.waiting.push_back(std::move(seq));
    ++s.metrics.requests_total;
    s.metrics.prompt_tokens_total += uint64_t(count);
    s.metrics.queue_length = int(s.waiting.size());
    lock.unlock();
    s.wake.notify_one();
    return id;
}

void Scheduler::cancel(uint64_t id) {
    {
        std::lock_guard<std::mutex> lock(state_->mutex);
        if (id == 0 || id >= state_->next_id) return;
        state_->cancelled.insert(id);
    }
    state_->wake.notify_one();
}

SchedulerMetrics Scheduler::metrics() const {
    std::lock_guard<std::mutex> lock(state_->mutex);
    return state_->metrics;
}

}  // namespace barellm::serve
