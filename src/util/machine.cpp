// The machine's CPU as bench reports it (machine.h), read from /proc/cpuinfo and CPUID, and
// the threads it lets the process start.
#include "util/machine.h"

#include <pthread.h>
#include <sched.h>

#include <fstream>
#include <set>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

namespace barellm {

namespace {

constexpr const char* kCpuinfoPath = "/proc/cpuinfo";

// Splits a /proc/cpuinfo line "key<tabs>: value" into its trimmed key and value; false
// for lines without a colon (the blank lines between processors).
bool split_field(const std::string& line, std::string* key, std::string* value) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) return false;
    auto trim = [](const std::string& text) {
        const size_t first = text.find_first_not_of(" \t");
        const size_t last = text.find_last_not_of(" \t\r");
        return first == std::string::npos ? std::string() : text.substr(first, last - first + 1);
    };
    *key = trim(line.substr(0, colon));
    *value = trim(line.substr(colon + 1));
    return true;
}

std::string read_cpuinfo() {
    std::ifstream file(kCpuinfoPath);
    std::ostringstream text;
    text << file.rdbuf();
    return text.str();
}

// How many CPUs this process may be scheduled on (a container or taskset may allow fewer
// than the machine has); 0 when unknown.
int schedulable_cpu_count() {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) != 0) return 0;
    return CPU_COUNT(&set);
}

}  // namespace

int count_physical_cores(const std::string& cpuinfo) {
    std::set<std::pair<std::string, std::string>> cores;
    std::string physical_id, core_id;
    bool in_processor = false, complete = true;
    auto finish_processor = [&] {
        if (!in_processor) return;
        if (physical_id.empty() || core_id.empty()) complete = false;
        cores.insert({physical_id, core_id});
        physical_id.clear();
        core_id.clear();
    };
    std::istringstream lines(cpuinfo);
    std::string line, key, value;
    while (std::getline(lines, line)) {
        if (!split_field(line, &key, &value)) continue;
        if (key == "processor") {
            finish_processor();
            in_processor = true;
        } else if (key == "physical id") {
            physical_id = value;
        } else if (key == "core id") {
            core_id = value;
        }
    }
    finish_processor();
    return complete ? int(cores.size()) : 0;
}

std::string cpu_model_name(const std::string& cpuinfo) {
    std::istringstream lines(cpuinfo);
    std::string line, key, value;
    while (std::getline(lines, line))
        if (split_field(line, &key, &value) && key == "model name") return value;
    return "";
}

int physical_core_count() {
    int cores = count_physical_cores(read_cpuinfo());
    if (cores == 0) cores = int(std::thread::hardware_concurrency());
    const int schedulable = schedulable_cpu_count();
    if (schedulable > 0 && (cores == 0 || schedulable < cores)) cores = schedulable;
    return cores > 0 ? cores : 1;
}

int threads_that_start(int wanted, int* error) {
    // Each thread returns at once, but keeps its stack until it is joined: all of them
    // are held together, as a team of `wanted` OpenMP threads holds them.
    const auto do_nothing = [](void*) -> void* { return nullptr; };
    std::vector<pthread_t> started;
    *error = 0;
    for (int i = 1; i < wanted; ++i) {
        pthread_t thread;
        const int result = pthread_create(&thread, nullptr, do_nothing, nullptr);
        if (result != 0) {
            *error = result;
            break;
        }
        started.push_back(thread);
    }
    for (pthread_t thread : started) pthread_join(thread, nullptr);
    return int(started.size()) + 1;
}

std::string machine_cpu_model() {
    const std::string name = cpu_model_name(read_cpuinfo());
    return name.empty() ? "unknown" : name;
}

std::string cpu_vector_extensions() {
    __builtin_cpu_init();
    std::string names;
    auto add_if = [&names](bool present, const char* name) {
        if (!present) return;
        if (!names.empty()) names += ' ';
        names += name;
    };
    add_if(__builtin_cpu_supports("avx"), "avx");
    add_if(__builtin_cpu_supports("avx2"), "avx2");
    add_if(__builtin_cpu_supports("fma"), "fma");
    add_if(__builtin_cpu_supports("avx512f"), "avx512f");
    add_if(__builtin_cpu_supports("avx512bw"), "avx512bw");
    add_if(__builtin_cpu_supports("avx512vl"), "avx512vl");
    add_if(__builtin_cpu_supports("avx512vnni"), "avx512vnni");
    add_if(__builtin_cpu_supports("avx512bf16"), "avx512bf16");
    return names.empty() ? "none" : names;
}

}  // namespace barellm
