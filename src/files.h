// Opening the files named on the command line. Only regular files are read: a FIFO would
// block, a directory reads as empty and a device may never end. Text is read up to a limit.
#pragma once
#include <cstddef>
#include <string>

namespace barellm {

// The most bytes read as a text (a prompt or a ppl text from -f).
constexpr size_t kMaxTextBytes = size_t(1) << 30;

// A read-only descriptor of the regular file `path`, for the caller to close, and its size
// in `size`. Throws Error naming the path when it cannot be opened or is not a regular
// file; never blocks.
int open_regular_file(const std::string& path, size_t* size);

// The contents of the regular file `path`, or of standard input when `path` is "-".
// Throws Error when they are longer than `limit` bytes, having read at most limit + 1.
std::string read_text_file(const std::string& path, size_t limit = kMaxTextBytes);

// Throws Error when `path` is a Hugging Face checkpoint directory (it holds config.json)
// or a GGUF file (it starts with "GGUF") instead of a barellm weight file, with the
// command that converts it. Anything else is left for the loader to judge.
void check_model_path(const std::string& path);

}  // namespace barellm
