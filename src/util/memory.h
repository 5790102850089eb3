// Refusing allocations the machine cannot hold, before making them: a clear error
// beats being killed by the kernel's out-of-memory handler halfway through.
#pragma once
#include <cstddef>
#include <string>

namespace barellm {

// Memory the system can still give this process (MemAvailable), in bytes; 0 if unknown.
size_t available_memory_bytes();

// Throws Error naming `what`, the bytes it needs and the bytes available, when `bytes`
// exceeds the available memory. Does nothing when the available memory is unknown.
void require_memory(size_t bytes, const std::string& what);

}  // namespace barellm
