// One exception type for every failure the library reports. Library code
// throws; main() catches, prints e.what() as one line and exits non-zero.
#pragma once
#include <stdexcept>
#include <string>

namespace barellm {

struct Error : std::runtime_error {
    explicit Error(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace barellm
