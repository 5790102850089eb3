// The /metrics text (metrics.h).
#include "serve/metrics.h"

namespace barellm::serve {

namespace {

void append_metric(std::string& text, const char* name, const char* type, const char* help,
                   uint64_t value) {
    text += std::string("# HELP barellm_") + name + " " + help + "\n# TYPE barellm_" + name + " " +
            type + "\nbarellm_" + name + " " + std::to_string(value) + "\n";
}

}  // namespace

std::string prometheus_text(const SchedulerMetrics& m, uint64_t http_requests) {
    std::string text;
    append_metric(text, "http_requests_total", "counter", "HTTP requests answered.", http_requests);
    append_metric(text, "requests_total", "counter", "Generation requests accepted.",
                  m.requests_total);
    append_metric(text, "prompt_tokens_total", "counter", "Prompt tokens of accepted requests.",
                  m.prompt_tokens_total);
    append_metric(text, "generated_tokens_total", "counter", "Tokens generated.",
                  m.generated_tokens_total);
    append_metric(text, "preemptions_total", "counter",
                  "Sequences preempted when KV blocks ran out, to be recomputed later.",
                  m.preemptions_total);
    append_metric(text, "queue_length", "gauge", "Requests waiting to be admitted.",
                  uint64_t(m.queue_length));
    append_metric(text, "running_sequences", "gauge", "Sequences in the running batch.",
                  uint64_t(m.running));
    append_metric(text, "batch_rows", "gauge", "Rows (tokens) of the last batched step.",
                  uint64_t(m.last_batch_rows));
    append_metric(text, "kv_blocks_used", "gauge", "KV cache blocks in use.",
                  uint64_t(m.kv_blocks_used));
    append_metric(text, "kv_blocks_free", "gauge", "KV cache blocks free.",
                  uint64_t(m.kv_blocks_free));
    append_metric(text, "kv_block_size", "gauge", "Positions per KV cache block.",
                  uint64_t(m.kv_block_size));
    append_metric(text, "kv_tokens_held", "gauge", "Positions the running sequences hold.",
                  uint64_t(m.kv_tokens_held));
    return text;
}

}  // namespace barellm::serve
