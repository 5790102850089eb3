// Fuzz targets: each takes arbitrary bytes and must never crash, hang or leak, whatever
// they are; refusing them with barellm::Error is the expected outcome. libFuzzer drives
// them (tests/fuzz/fuzz_*.cpp, `make fuzz`); the unit tests replay the seed corpus and
// every input that once crashed (tests/fuzz/corpus/, tests/fuzz/regressions/).
#pragma once
#include <cstddef>
#include <cstdint>

namespace barellm::fuzz {

// The bytes as a weight file: header, tensor and config validation (Model::load), the
// tokenizer stored in it, then, where the loader takes the file, three tokens through the CPU
// backend.
void model_file(const uint8_t* data, size_t size);
// The bytes as text for the tokenizer, then decoded back.
void tokenizer_encode(const uint8_t* data, size_t size);
// The bytes as token ids (little-endian u16 pairs) for decode and the stream decoder.
void tokenizer_decode(const uint8_t* data, size_t size);
// The bytes as a command line, arguments separated by NUL bytes.
void command_line(const uint8_t* data, size_t size);
// The bytes as a pre-tokenizer regex, a NUL byte, and a text to find its matches in.
void regex(const uint8_t* data, size_t size);
// The bytes as a /v1/chat/completions body (messages, tools, calls and results) rendered with
// each of tests/data/chat_templates.json's templates; then as a reply, in pieces, through the
// call reader of each tool format, whose text must be the reply itself where it reads no call.
void chat_request(const uint8_t* data, size_t size);

}  // namespace barellm::fuzz
