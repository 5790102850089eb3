// Regular files only, and text up to a limit (files.h).
#include "files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "error.h"

namespace barellm {

namespace {

constexpr size_t kReadChunkBytes = size_t(1) << 20;

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

}  // namespace barellm
