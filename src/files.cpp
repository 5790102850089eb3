// Regular files only, and text up to a limit (files.h).
#include "files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string_view>
#include <vector>

#include "error.h"

namespace barellm {

namespace {

constexpr size_t kReadChunkBytes = size_t(1) << 20;
constexpr std::string_view kGgufMagic = "GGUF";

// Closes a descriptor when it goes out of scope.
struct FileCloser {
    int fd;
    ~FileCloser() {
        if (fd >= 0) close(fd);
    }
};

}  // namespace

int open_regular_file(const std::string& path, size_t* size) {
    // O_NONBLOCK: opening a FIFO with no writer returns at once instead of waiting for one.
    const int fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) throw Error(path + ": cannot open: " + std::strerror(errno));
    struct stat info;
    if (fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
        close(fd);
        throw Error(path + ": not a regular file");
    }
    *size = size_t(info.st_size);
    return fd;
}

std::string read_text_file(const std::string& path, size_t limit) {
    const bool from_stdin = path == "-";
    const std::string name = from_stdin ? "standard input" : path;
    size_t file_size = 0;
    const FileCloser file{from_stdin ? -1 : open_regular_file(path, &file_size)};
    const int fd = from_stdin ? STDIN_FILENO : file.fd;
    const auto too_long = [&] {
        return Error(name + ": longer than " + std::to_string(limit) +
                     " bytes, the most barellm reads as a text");
    };
    if (file_size > limit) throw too_long();
    std::string text;
    text.reserve(file_size + 1);  // + 1: the read that finds the end
    std::vector<char> chunk(kReadChunkBytes);
    while (text.size() <= limit) {
        const size_t room = std::min(chunk.size(), limit + 1 - text.size());
        const ssize_t got = read(fd, chunk.data(), room);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) throw Error(name + ": read error: " + std::strerror(errno));
        if (got == 0) return text;
        text.append(chunk.data(), size_t(got));
    }
    throw too_long();
}

void check_model_path(const std::string& path) {
    const std::string convert = "python3 convert/convert.py " + path + " -o OUT.bin";
    struct stat info;
    if (stat(path.c_str(), &info) != 0) return;
    if (S_ISDIR(info.st_mode)) {
        struct stat config;
        if (stat((path + "/config.json").c_str(), &config) == 0)
            throw Error(path +
                        " is a Hugging Face checkpoint directory, not a barellm weight file: " +
                        "convert it with `" + convert + "`");
        return;
    }
    if (!S_ISREG(info.st_mode)) return;
    size_t size = 0;
    const FileCloser file{open_regular_file(path, &size)};
    char magic[kGgufMagic.size()] = {};
    if (read(file.fd, magic, sizeof magic) == ssize_t(sizeof magic) &&
        std::string_view(magic, sizeof magic) == kGgufMagic)
        throw Error(path + " is a GGUF file, not a barellm weight file: convert it with `" +
                    convert + "`");
}

}  // namespace barellm
