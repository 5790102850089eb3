// The BPE model: turns one word into token ids by merging adjacent symbols, lowest merge
// rank first, as Hugging Face's BPE does. The merges themselves happen in bpe.cpp.
#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace barellm::tok {

// Open-addressing map from 64-bit keys to 64-bit values, for the BPE hot loops (millions of
// pair and character lookups per megabyte of text).
class FlatMap {
public:
    void insert_or_assign(uint64_t key, uint64_t value) {
        if ((size_ + 1) * 10 > slots_.size() * 7) grow();
        Slot& slot = slots_[find_slot(key)];
        if (slot.key == kEmpty) ++size_;
        slot = {key, value};
    }
    const uint64_t* find(uint64_t key) const {
        if (slots_.empty()) return nullptr;
        const Slot& slot = slots_[find_slot(key)];
        return slot.key == key ? &slot.value : nullptr;
    }

private:
    static constexpr uint64_t kEmpty = ~uint64_t{0};
    struct Slot {
        uint64_t key = kEmpty;
        uint64_t value = 0;
    };
    size_t find_slot(uint64_t key) const {
        const size_t mask = slots_.size() - 1;
        size_t i = size_t((key * 0x9E3779B97F4A7C15ull) >> 32) & mask;
        while (slots_[i].key != kEmpty && slots_[i].key != key) i = (i + 1) & mask;
        return i;
    }
    void grow() {
        std::vector<Slot> old = std::move(slots_);
        slots_.assign(old.empty() ? 64 : old.size() * 2, Slot{});
        size_ = 0;
        for (const Slot& s : old)
            if (s.key != kEmpty) insert_or_assign(s.key, s.value);
    }
    std::vector<Slot> slots_;
    size_t size_ = 0;
};

// A token in the word being merged, in a doubly linked list of the word's symbols.
struct BpeSymbol {
    int id;
    int prev;
    int next;
    bool removed;
};

// A merge waiting in the queue. Hugging Face's Merge order, lowest rank first and then
// leftmost, is the order of `rank << 32 | pos`.
struct PendingMerge {
    uint64_t order;
    int merged_id;

    uint32_t pos() const { return uint32_t(order); }
};

// Working memory of one encode() call, reused across words.
struct EncodeScratch {
    std::vector<BpeSymbol> symbols;
    std::vector<PendingMerge> queue;
    std::string key;
    // Words already tokenized in this call (like Hugging Face's BPE cache, which also only
    // keeps words shorter than 256 bytes): word -> [offset, count) in cached_ids.
    std::unordered_map<std::string, std::pair<uint32_t, uint32_t>> cache;
    std::vector<int> cached_ids;
};

class BpeModel {
public:
    std::unordered_map<std::string, int> vocab;
    bool byte_fallback = false;
    bool fuse_unk = false;
    bool ignore_merges = false;
    std::optional<std::string> unk_token;

    // Call once the vocabulary is filled.
    void index_vocab();
    // The merge of `left` and `right` (tokens of the vocabulary) has rank `rank`.
    void add_merge(const std::string& left, const std::string& right, uint32_t rank);
    // Appends the ids of `word` to `ids`.
    void encode_word(std::string_view word, std::vector<int>& ids, EncodeScratch& scratch) const;

private:
    bool splits_before_marker(std::string_view word, size_t marker) const;
    void merge_segment(std::string_view word, std::vector<int>& ids, EncodeScratch& scratch) const;
    int vocab_id(const std::string& token, const std::string& left, const std::string& right) const;
    int unk_id() const;
    void initial_symbols(std::string_view word, std::vector<BpeSymbol>& symbols) const;
    bool has_byte_tokens(std::string_view bytes) const;
    void push_merge_if_known(std::vector<BpeSymbol>& symbols, std::vector<PendingMerge>& queue,
                             int pos) const;
    void merge_symbols(std::vector<BpeSymbol>& symbols, std::vector<PendingMerge>& queue) const;

    FlatMap merges_;    // (left id, right id) -> rank << 32 | merged id
    FlatMap char_ids_;  // code point -> id of the single-character token
    std::array<int, 256> byte_ids_{};
    std::optional<int> unk_id_;
    bool segment_at_space_markers_ = false;  // see kSpaceMarker in bpe.cpp
    FlatMap joined_before_marker_;           // code points some token holds right before a marker
};

}  // namespace barellm::tok
