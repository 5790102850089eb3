// The server's engine: requests in, text out, many sequences at once. One loop on its own
// thread runs, at each step, one batched forward (Backend::step) over every active sequence:
// the next token of each decoding sequence plus a chunk of a waiting prompt (chunked prefill),
// samples each sequence with its own sampler and seed, hands out the new text, retires the
// finished sequences and admits waiting ones while their KV blocks fit (continuous batching).
// The keys and values live in the backend's paged KV cache; src/serve/kv_blocks.h keeps the
// books: block tables, the free list, prompt prefixes shared between sequences.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend.h"
#include "generation/sampler.h"
#include "tokenizer/tokenizer.h"
#include "weights/config.h"

namespace barellm::serve {

// Why a request ended: Stop (the model's EOS, the end-of-turn token or a stop string),
// Length (max_tokens, or the sequence filled the context), Cancelled (cancel(), a client
// gone), Failed (the step threw, e.g. logits that are not finite; `error` says why).
enum class FinishReason { Stop, Length, Cancelled, Failed };

struct Completion {
    FinishReason finish_reason = FinishReason::Stop;
    int prompt_tokens = 0;
    int completion_tokens = 0;          // the tokens drawn, a stopping EOS included
    int cached_prompt_tokens = 0;       // prompt tokens whose keys and values were shared
    double seconds_to_first_token = 0;  // from submit to the first token drawn
    std::string error;                  // FinishReason::Failed only
};

struct Request {
    std::vector<int> prompt;  // token ids, BOS included; 1 <= size < the context
    int max_tokens = 0;       // the most new tokens; 0: until the context is full
    SamplingOptions sampling;
    uint64_t seed = 0;
    std::vector<std::string> stop_strings;  // end the text before them (held back as in `run`)
    int end_of_turn = -1;                   // a chat template's end-of-turn token, -1: none
    bool keep_special_text = false;         // on_text gets the special tokens' texts too (harmony)
    // Called on the scheduler's thread; must return at once (no blocking I/O).
    // on_text: each new piece of text, complete UTF-8, stop strings held back.
    // on_done: once, last.
    std::function<void(const std::string& text)> on_text;
    std::function<void(const Completion& completion)> on_done;
};

// Where the loop runs: on a thread the scheduler starts (Own), or on the thread that calls
// run() (Caller). `barellm serve` runs it on the main thread, whose OpenMP team the backend's
// kernels then use: a second team on another thread would make more OpenMP threads than
// cores, and their waits between kernels would sleep and wake at every step.
enum class LoopThread { Own, Caller };

struct SchedulerOptions {
    int parallel = 8;         // the most sequences in the running batch
    int context = 0;          // the most positions of one sequence
    int max_queue = 256;      // waiting requests beyond this are refused
    int prefill_chunk = 256;  // the most prompt tokens one step runs
    LoopThread loop_thread = LoopThread::Own;
};

// What /metrics reports: counters since start, and the state now.
struct SchedulerMetrics {
    uint64_t requests_total = 0;
    uint64_t prompt_tokens_total = 0;
    uint64_t generated_tokens_total = 0;
    uint64_t preemptions_total = 0;
    int queue_length = 0;     // requests waiting to be admitted
    int running = 0;          // sequences in the batch
    int last_batch_rows = 0;  // rows of the last step
    int kv_blocks_used = 0;
    int kv_blocks_free = 0;
    int kv_block_size = 0;
    int kv_tokens_held = 0;  // positions the running sequences hold
};

class Scheduler {
public:
    // `backend` was made with BackendOptions::kv_blocks > 0; the scheduler uses it alone.
    Scheduler(Backend& backend, const Config& config, const Tokenizer& tokenizer,
              const SchedulerOptions& options, int kv_blocks, int kv_block_size);
    ~Scheduler();  // stops the loop; requests still open end as Cancelled

    // LoopThread::Caller: runs the loop on the calling thread until stop() (once).
    void run();
    // Ends the loop (run() returns, or the own thread ends); requests still open end as
    // Cancelled.
    void stop();

    // Queues a request and returns its id. Throws Error (nothing queued) when the prompt is
    // empty, has ids outside the vocabulary or does not fit the context, or the queue is full.
    uint64_t submit(Request request);
    // Ends request `id` (waiting or running) as Cancelled at the next step: its blocks are
    // freed, on_done is called. Nothing when it has ended already.
    void cancel(uint64_t id);
    SchedulerMetrics metrics() const;

private:
    struct State;
    std::unique_ptr<State> state_;
};

}  // namespace barellm::serve
