// libFuzzer entry point for barellm::fuzz::model_file (see targets.h).
#include "targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    barellm::fuzz::model_file(data, size);
    return 0;
}
