// Standard output, Ctrl-C and standard input lines (terminal.h).
#include "util/terminal.h"

#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <iostream>

namespace barellm {

namespace {

// The Error for output that did not reach standard output (a full disk, say).
Error standard_output_error() {
    return Error(std::string("cannot write to standard output") +
                 (errno != 0 ? std::string(": ") + std::strerror(errno) : ""));
}

void on_interrupt(int) { interrupted = true; }

constexpr size_t kReadBytes = 4096;

}  // namespace

std::atomic<bool> interrupted{false};

void write_now(const std::string& text) {
    errno = 0;
    std::cout << text << std::flush;
    if (!std::cout) throw standard_output_error();
}

void check_standard_output() {
    errno = 0;
    std::cout.flush();
    if (std::fflush(stdout) != 0 || std::ferror(stdout) || !std::cout)
        throw standard_output_error();
}

void catch_interrupts() {
    struct sigaction action {};
    action.sa_handler = on_interrupt;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;  // writes and reads go on; poll() still returns EINTR
    sigaction(SIGINT, &action, nullptr);
}

bool is_terminal(int fd) { return isatty(fd) == 1; }

LineReader::Status LineReader::read_line(std::string* line) {
    size_t newline = buffer_.find('\n');
    while (newline == std::string::npos && !ended_) {
        if (buffer_.size() > kMaxLineBytes) {  // dropped from here to its newline
            skipping_ = true;
            buffer_.clear();
        }
        // poll() is never restarted after a signal: Ctrl-C ends the wait.
        if (interrupted) return Status::Interrupted;
        pollfd input{STDIN_FILENO, POLLIN, 0};
        if (poll(&input, 1, -1) < 0) {
            if (errno == EINTR) continue;
            throw Error(std::string("cannot wait for standard input: ") + std::strerror(errno));
        }
        char chunk[kReadBytes];
        const ssize_t got = read(STDIN_FILENO, chunk, sizeof chunk);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0)
            throw Error(std::string("cannot read standard input: ") + std::strerror(errno));
        if (got == 0) {
            ended_ = true;
            break;
        }
        const size_t searched = buffer_.size();
        buffer_.append(chunk, size_t(got));
        newline = buffer_.find('\n', searched);
    }
    if (newline == std::string::npos) {
        if (buffer_.empty() && !skipping_) return Status::End;
        newline = buffer_.size();
    }
    *line = buffer_.substr(0, newline);
    buffer_.erase(0, std::min(newline + 1, buffer_.size()));
    if (skipping_) {
        skipping_ = false;
        line->clear();
        return Status::TooLong;
    }
    if (!line->empty() && line->back() == '\r') line->pop_back();
    return Status::Line;
}

}  // namespace barellm
