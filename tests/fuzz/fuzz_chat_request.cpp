// libFuzzer entry point for barellm::fuzz::chat_request (see targets.h).
#include "targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    barellm::fuzz::chat_request(data, size);
    return 0;
}
