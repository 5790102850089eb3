// Available memory from /proc/meminfo, and the check made before each large allocation.
#include "util/memory.h"

#include <cstdio>
#include <fstream>
#include <sstream>

#include "util/error.h"

namespace barellm {

size_t available_memory_bytes() {
    std::ifstream meminfo("/proc/meminfo");
    std::string line;
    while (std::getline(meminfo, line)) {
        std::istringstream fields(line);
        std::string key;
        size_t kibibytes = 0;
        if (fields >> key >> kibibytes && key == "MemAvailable:") return kibibytes * 1024;
    }
    return 0;
}

void require_memory(size_t bytes, const std::string& what) {
    const size_t available = available_memory_bytes();
    if (available == 0 || bytes <= available) return;
    char message[256];
    std::snprintf(message, sizeof message,
                  "%s needs %.2f GiB of memory but only %.2f GiB is available", what.c_str(),
                  bytes / double(1u << 30), available / double(1u << 30));
    throw Error(message);
}

}  // namespace barellm
