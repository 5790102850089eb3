// libFuzzer entry point for barellm::fuzz::tokenizer_decode (see targets.h).
#include "targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    barellm::fuzz::tokenizer_decode(data, size);
    return 0;
}
