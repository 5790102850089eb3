// The program's side of the terminal: writing to standard output so that failures are
// seen, Ctrl-C as a flag the commands check, and lines read from standard input.
#pragma once
#include <atomic>
#include <optional>
#include <string>

#include "util/error.h"

namespace barellm {

// Writes `text` to standard output now; throws Error when it does not get there.
void write_now(const std::string& text);

// Throws Error unless everything written to standard output, through std::cout or stdio,
// got there.
void check_standard_output();

// Set by Ctrl-C (SIGINT) once catch_interrupts() was called; the commands stop at the next
// token or chunk and clear it when they go on.
extern std::atomic<bool> interrupted;

// Sends SIGINT to `interrupted`; interrupted system calls are restarted, except the wait
// of LineReader::read_line, which then returns Interrupted.
void catch_interrupts();

bool is_terminal(int fd);

// Lines of standard input, waited for with poll(2) so that Ctrl-C interrupts the wait.
class LineReader {
public:
    enum class Status { Line, End, Interrupted, TooLong };
    // The next line, without its newline ("\r\n" too) in `line`. End: standard input ended
    // (a last line without a newline still comes as a Line first). Interrupted: Ctrl-C
    // before or during the wait (`interrupted` is set). TooLong: a line longer than
    // kMaxLineBytes, read to its end and dropped (`line` is empty). Throws Error when the
    // read fails.
    Status read_line(std::string* line);

    static constexpr size_t kMaxLineBytes = size_t(1) << 20;

private:
    std::string buffer_;  // read but not yet returned
    bool ended_ = false;
    bool skipping_ = false;  // in a line longer than kMaxLineBytes, dropping it
};

}  // namespace barellm
