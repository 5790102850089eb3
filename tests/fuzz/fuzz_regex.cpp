// libFuzzer entry point for barellm::fuzz::regex (see targets.h).
#include "targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    barellm::fuzz::regex(data, size);
    return 0;
}
