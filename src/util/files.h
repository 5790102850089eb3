// Opening the files named on the command line. Only regular files are read: a FIFO would
// block, a directory reads as empty and a device may never end. Text is read up to a limit.
// The one file barellm writes (chat's /save) goes through a temporary file and replaces
// only a regular file that is none of the files being read.
#pragma once
#include <sys/types.h>

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

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

// Which file a path names, however it is spelled (a symbolic link, '..', another hard link).
struct FileIdentity {
    dev_t device = 0;
    ino_t inode = 0;
    bool operator==(const FileIdentity& other) const {
        return device == other.device && inode == other.inode;
    }
};

// The identity of the file `path` names (links followed); nullopt when it cannot be stat'ed.
std::optional<FileIdentity> file_identity(const std::string& path);

// What write_file_safely may replace.
struct WriteRules {
    bool replace_existing = false;     // false: a path that exists is refused
    std::string how_to_replace;        // said when an existing path is refused
    std::vector<FileIdentity> inputs;  // files being read, never replaced
};

// The most bytes of a path that messages quote in full.
constexpr size_t kShownPathBytes = 256;

// `path` as a message shows it: itself when at most kShownPathBytes bytes long and free of
// control characters, else a quoted excerpt (json.h), so that a name typed in a chat
// (untrusted text) cannot flood or break the line.
std::string shown_path(const std::string& path);

// Writes `text` to `path`, or to standard output when `path` is "-". The text goes to a
// temporary file in the directory of `path`, which is renamed over `path` only once
// written and fsync'ed, so that `path` is never left half-written. Refused, with an Error
// naming `path`: a directory, anything other than a regular file (a device, a FIFO, a
// socket; a symbolic link to such), one of `rules.inputs`, and an existing path unless
// `rules.replace_existing`. A symbolic link to a regular file is kept: its target is
// replaced. Every failure says why (the system's message: no space left, permission
// denied...) and leaves no temporary file.
void write_file_safely(const std::string& path, const std::string& text, const WriteRules& rules);

}  // namespace barellm
