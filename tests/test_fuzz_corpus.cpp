// Replays the fuzz seed corpus and every input that once crashed a fuzz target, so the
// fixes stay fixed without running libFuzzer (`make fuzz` runs the fuzzers themselves).
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <vector>

#include "fuzz/targets.h"

namespace fs = std::filesystem;

TEST_CASE("fuzz corpus and crash regressions replay cleanly") {
    const std::map<std::string, void (*)(const uint8_t*, size_t)> targets = {
        {"model_file", barellm::fuzz::model_file},
        {"tokenizer_encode", barellm::fuzz::tokenizer_encode},
        {"tokenizer_decode", barellm::fuzz::tokenizer_decode},
        {"command_line", barellm::fuzz::command_line},
        {"regex", barellm::fuzz::regex},
        {"chat_request", barellm::fuzz::chat_request}};
    int replayed = 0;
    for (const char* root : {"tests/fuzz/corpus", "tests/fuzz/regressions"}) {
        if (!fs::is_directory(root)) continue;
        for (const auto& [name, target] : targets) {
            const fs::path directory = fs::path(root) / name;
            if (!fs::is_directory(directory)) continue;
            for (const auto& entry : fs::directory_iterator(directory)) {
                std::ifstream in(entry.path(), std::ios::binary);
                const std::vector<uint8_t> bytes{std::istreambuf_iterator<char>(in), {}};
                INFO(entry.path().string());
                target(bytes.data(), bytes.size());
                ++replayed;
            }
        }
    }
    CHECK(replayed > 0);
}
