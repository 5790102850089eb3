// Normalizers: the first step of encoding, which rewrites the text before it is split into
// words (Sequence, Prepend, Replace, NFC).
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace barellm::tok {

class Normalizer {
public:
    virtual ~Normalizer() = default;
    virtual void apply(std::string& text) const = 0;
};

// Each step in turn.
class SequenceNormalizer : public Normalizer {
public:
    explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> steps)
        : steps_(std::move(steps)) {}
    void apply(std::string& text) const override;

private:
    std::vector<std::unique_ptr<Normalizer>> steps_;
};

// Puts `prefix` before the text, only if the text is not empty.
class PrependNormalizer : public Normalizer {
public:
    explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
    void apply(std::string& text) const override;

private:
    std::string prefix_;
};

// Replaces every occurrence of a string.
class ReplaceNormalizer : public Normalizer {
public:
    ReplaceNormalizer(std::string pattern, std::string content)
        : pattern_(std::move(pattern)), content_(std::move(content)) {}
    void apply(std::string& text) const override;

private:
    std::string pattern_, content_;
};

// Unicode normalization form C (canonical composition), as Hugging Face computes it:
// characters after Unicode 9.0 pass through unchanged.
class NfcNormalizer : public Normalizer {
public:
    void apply(std::string& text) const override;
};

}  // namespace barellm::tok
