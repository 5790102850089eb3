// Regular files only, text up to a limit, and writes that replace nothing they must not
// (files.h).
#include "util/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <vector>

#include "util/error.h"
#include "util/json.h"
#include "util/terminal.h"

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

constexpr mode_t kNewFileMode = 0666;      // before the umask, as a shell's `>` creates
constexpr mode_t kPermissionBits = 07777;  // of a replaced file, kept by its replacement
constexpr int kTemporaryNameTries = 100;

std::string system_error(const std::string& what) { return what + ": " + std::strerror(errno); }

FileIdentity identity_of(const struct stat& info) { return {info.st_dev, info.st_ino}; }

// The path that a write to `path` replaces: `path` itself when nothing is there, the
// target of its symbolic links when it names a regular file. Throws Error for what must
// not be replaced; `existing` receives the stat of what is there (st_mode 0: nothing).
std::string replacement_target(const std::string& path, const WriteRules& rules,
                               struct stat* existing) {
    std::memset(existing, 0, sizeof *existing);
    if (path.back() == '/') throw Error(shown_path(path) + ": is a directory");
    if (stat(path.c_str(), existing) != 0) {
        if (errno != ENOENT) throw Error(system_error(shown_path(path)));
        struct stat link;
        if (lstat(path.c_str(), &link) == 0)
            throw Error(shown_path(path) + ": a symbolic link to a file that does not exist");
        return path;
    }
    if (std::find(rules.inputs.begin(), rules.inputs.end(), identity_of(*existing)) !=
        rules.inputs.end())
        throw Error(shown_path(path) + ": is a file being read, never replaced");
    if (S_ISDIR(existing->st_mode)) throw Error(shown_path(path) + ": is a directory");
    if (!S_ISREG(existing->st_mode))
        throw Error(shown_path(path) +
                    ": not a regular file (a device, a FIFO or a socket), never replaced");
    if (!rules.replace_existing)
        throw Error(shown_path(path) + " exists already" +
                    (rules.how_to_replace.empty() ? "" : "; " + rules.how_to_replace));
    char resolved[PATH_MAX];
    if (realpath(path.c_str(), resolved) == nullptr) throw Error(system_error(shown_path(path)));
    return resolved;
}

// A new file beside `target` (same directory, so that rename(2) can replace `target` with
// it), opened for writing; its path goes to `temporary`.
int create_temporary_beside(const std::string& target, std::string* temporary) {
    const size_t slash = target.rfind('/');
    const std::string directory = slash == std::string::npos ? "" : target.substr(0, slash + 1);
    const std::string name = slash == std::string::npos ? target : target.substr(slash + 1);
    for (int attempt = 0; attempt < kTemporaryNameTries; ++attempt) {
        *temporary = directory + "." + name + ".tmp" + std::to_string(getpid()) + "." +
                     std::to_string(attempt);
        const int fd =
            open(temporary->c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, kNewFileMode);
        if (fd >= 0) return fd;
        if (errno != EEXIST) throw Error(system_error("cannot write " + shown_path(target)));
    }
    throw Error("cannot write " + shown_path(target) + ": no free temporary name beside it");
}

void write_all(int fd, const std::string& text) {
    for (size_t done = 0; done < text.size();) {
        const ssize_t wrote = write(fd, text.data() + done, text.size() - done);
        if (wrote < 0 && errno == EINTR) continue;
        if (wrote < 0) throw Error(std::strerror(errno));
        done += size_t(wrote);
    }
}

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

std::string shown_path(const std::string& path) {
    const bool plain = std::none_of(path.begin(), path.end(), [](char c) {
        return static_cast<unsigned char>(c) < 0x20 || c == 0x7F;
    });
    return plain && path.size() <= kShownPathBytes ? path : quoted_excerpt(path);
}

std::optional<FileIdentity> file_identity(const std::string& path) {
    struct stat info;
    if (stat(path.c_str(), &info) != 0) return std::nullopt;
    return identity_of(info);
}

void write_file_safely(const std::string& path, const std::string& text, const WriteRules& rules) {
    if (path == "-") {
        write_now(text);
        return;
    }
    if (path.empty()) throw Error("no file name given");
    if (path.find('\0') != std::string::npos)
        throw Error("a file name cannot hold a NUL byte");
    struct stat existing;
    const std::string target = replacement_target(path, rules, &existing);
    std::string temporary;
    int fd = create_temporary_beside(target, &temporary);
    try {
        try {
            if (existing.st_mode != 0 && fchmod(fd, existing.st_mode & kPermissionBits) != 0)
                throw Error(std::strerror(errno));
            write_all(fd, text);
            if (fsync(fd) != 0) throw Error(std::strerror(errno));
            const int closed = close(fd);
            fd = -1;
            if (closed != 0) throw Error(std::strerror(errno));
        } catch (const Error& e) {
            throw Error("cannot write " + shown_path(path) + ": " + e.what());
        }
        // Checked again: what is there may have changed while the text was written.
        struct stat there_now;
        replacement_target(path, rules, &there_now);
        if (rename(temporary.c_str(), target.c_str()) != 0)
            throw Error(system_error("cannot write " + shown_path(path)));
    } catch (const Error&) {
        if (fd >= 0) close(fd);
        unlink(temporary.c_str());
        throw;
    }
    // The rename reaches the disk with its directory; a failure to sync that loses nothing
    // the file system was not already told, so it is not reported.
    const size_t slash = target.rfind('/');
    const std::string directory = slash == std::string::npos ? "." : target.substr(0, slash + 1);
    const int directory_fd = open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (directory_fd >= 0) {
        fsync(directory_fd);
        close(directory_fd);
    }
}

}  // namespace barellm
