// GET /metrics: the scheduler's counters and state in Prometheus' text format (version 0.0.4),
// each metric with its HELP and TYPE lines, named barellm_*.
#pragma once
#include <string>

#include "serve/scheduler.h"

namespace barellm::serve {

// `http_requests` counts the HTTP requests answered (every route and status), beside the
// scheduler's generation requests.
std::string prometheus_text(const SchedulerMetrics& metrics, uint64_t http_requests);

}  // namespace barellm::serve
