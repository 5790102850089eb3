// --stop: the generated text cut before the first stop string, which may arrive split
// across several tokens. Text that could be the start of a stop string is held back until
// the next pieces show whether it is one.
#pragma once
#include <string>
#include <vector>

namespace barellm {

class StopStrings {
public:
    explicit StopStrings(std::vector<std::string> stops);
    // Takes the next piece of text; returns what can be printed now. Once a stop string is
    // complete, that is the text before it, and stopped() is true.
    std::string push(const std::string& piece);
    bool stopped() const { return stopped_; }
    // The text held back, when the generation ends before a stop string completes it.
    std::string flush();

private:
    // The length of the longest end of pending_ that begins some stop string.
    size_t possible_start_length() const;

    std::vector<std::string> stops_;
    std::string pending_;  // text not printed yet
    bool stopped_ = false;
};

}  // namespace barellm
