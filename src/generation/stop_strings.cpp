// The stop strings of stop_strings.h.
#include "generation/stop_strings.h"

#include <algorithm>

namespace barellm {

StopStrings::StopStrings(std::vector<std::string> stops) : stops_(std::move(stops)) {}

size_t StopStrings::possible_start_length() const {
    size_t longest = 0;
    for (const std::string& stop : stops_)
        for (size_t length = std::min(stop.size() - 1, pending_.size()); length > longest; --length)
            if (pending_.compare(pending_.size() - length, length, stop, 0, length) == 0) {
                longest = length;
                break;
            }
    return longest;
}

std::string StopStrings::push(const std::string& piece) {
    if (stopped_) return "";
    pending_ += piece;
    size_t first = std::string::npos;
    for (const std::string& stop : stops_) first = std::min(first, pending_.find(stop));
    if (first != std::string::npos) {
        stopped_ = true;
        const std::string before = pending_.substr(0, first);
        pending_.clear();
        return before;
    }
    const size_t printable = pending_.size() - possible_start_length();
    const std::string out = pending_.substr(0, printable);
    pending_.erase(0, printable);
    return out;
}

std::string StopStrings::flush() {
    std::string out;
    out.swap(pending_);
    return out;
}

}  // namespace barellm
