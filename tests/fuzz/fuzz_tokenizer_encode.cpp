// libFuzzer entry point for barellm::fuzz::tokenizer_encode (see targets.h).
#include "targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    barellm::fuzz::tokenizer_encode(data, size);
    return 0;
}
