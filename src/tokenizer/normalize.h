// Normalizers: the first step of encoding, which rewrites the text before it is split into
// words (Sequence, Prepend, Replace, NFC).
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace barellm::tok {

// How long normalizing may make a text: at most kMaxNormalizedGrowth times as long, plus
// kNormalizedSlackBytes. Real normalizers stay within 3 times plus a few bytes (Replace " "
// by the 3 bytes of "▁", Prepend "▁"); without a bound, a Sequence of Replace normalizers
// that each double the text would exhaust memory (20 of them make 1 KB into 1 GB).
constexpr size_t kMaxNormalizedGrowth = 8;
constexpr size_t kNormalizedSlackBytes = 4096;

class Normalizer {
public:
    virtual ~Normalizer() = default;

    // Normalizes `text`; throws Error when the result would be longer than the bound above.
    void apply(std::string& text) const {
        rewrite(text, kMaxNormalizedGrowth * text.size() + kNormalizedSlackBytes);
    }

    // Rewrites `text`; throws Error rather than make it longer than `max_size` bytes.
    virtual void rewrite(std::string& text, size_t max_size) const = 0;
};

// Each step in turn.
class SequenceNormalizer : public Normalizer {
public:
    explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> steps)
        : steps_(std::move(steps)) {}
    void rewrite(std::string& text, size_t max_size) const override;

private:
    std::vector<std::unique_ptr<Normalizer>> steps_;
};

// Puts `prefix` before the text, only if the text is not empty.
class PrependNormalizer : public Normalizer {
public:
    explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
    void rewrite(std::string& text, size_t max_size) const override;

private:
    std::string prefix_;
};

// Replaces every occurrence of a string.
class ReplaceNormalizer : public Normalizer {
public:
    ReplaceNormalizer(std::string pattern, std::string content)
        : pattern_(std::move(pattern)), content_(std::move(content)) {}
    void rewrite(std::string& text, size_t max_size) const override;

private:
    std::string pattern_, content_;
};

// Unicode normalization form C (canonical composition), as Hugging Face computes it:
// characters after Unicode 9.0 pass through unchanged.
class NfcNormalizer : public Normalizer {
public:
    void rewrite(std::string& text, size_t max_size) const override;
};

}  // namespace barellm::tok
