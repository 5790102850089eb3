// libFuzzer entry point for barellm::fuzz::command_line (see targets.h).
#include "targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    barellm::fuzz::command_line(data, size);
    return 0;
}
