// The BPE model (declared in bpe.h): where a word's characters are merged into tokens.
#include "tokenizer/bpe.h"

#include <algorithm>
#include <cstdio>

#include "util/error.h"
#include "util/json.h"
#include "tokenizer/unicode.h"

namespace barellm::tok {

namespace {

using unicode::decode_utf8;
using unicode::utf8_length;

// U+2581, SentencePiece's space marker.
// - A merge joins the tokens on either side of a marker only into a token that holds the
//   character before the marker followed by the marker.
// - A SentencePiece vocabulary has few such tokens (Llama 2: "▁▁"; Gemma: ">▁</"), so
//   before most markers a word splits into segments that BPE independently, with exactly
//   the result of merging the whole word, only faster and cacheable.
// - This matters because SentencePiece-style tokenizers have no pre-tokenizer, which makes a
//   whole text one word.
constexpr std::string_view kSpaceMarker = "\xE2\x96\x81";

// The code point of the character that ends at `end` (a character boundary after one).
char32_t character_before(std::string_view text, size_t end) {
    size_t start = end - 1;
    while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
    return decode_utf8(text, start);
}

uint64_t pair_key(int left, int right) { return uint64_t(uint32_t(left)) << 32 | uint32_t(right); }

void add_symbol(std::vector<BpeSymbol>& symbols, int id) {
    const int index = int(symbols.size());
    symbols.push_back({id, index - 1, index + 1, false});
}

// `merge` is a merges_ value: rank << 32 | merged id.
PendingMerge pending_merge(uint64_t merge, int pos) {
    return {(merge >> 32) << 32 | uint32_t(pos), int(uint32_t(merge))};
}

struct ComesLater {  // for std::*_heap, which keep the greatest element first
    bool operator()(const PendingMerge& a, const PendingMerge& b) const {
        return a.order > b.order;
    }
};

}  // namespace

void BpeModel::index_vocab() {
    for (const auto& [text, id] : vocab) {
        if (!text.empty() && utf8_length(text[0]) == text.size())
            char_ids_.insert_or_assign(decode_utf8(text, 0), uint64_t(id));
    }
    for (int b = 0; b < 256; ++b) {
        char name[8];
        std::snprintf(name, sizeof(name), "<0x%02X>", b);
        const auto found = vocab.find(name);
        byte_ids_[b] = found == vocab.end() ? -1 : found->second;
    }
    if (unk_token) {
        const auto found = vocab.find(*unk_token);
        if (found != vocab.end()) unk_id_ = found->second;
    }
    segment_at_space_markers_ = vocab.count(std::string(kSpaceMarker)) != 0;
    for (const auto& [text, id] : vocab) {
        for (size_t pos = text.find(kSpaceMarker, 1); pos != std::string::npos;
             pos = text.find(kSpaceMarker, pos + 1))
            joined_before_marker_.insert_or_assign(character_before(text, pos), 1);
    }
}

// The character before the marker at `marker` is a token of its own (so the symbol that
// ends there ends with it, not with a byte or unknown token) and no token holds it
// followed by the marker: no merge can cross.
bool BpeModel::splits_before_marker(std::string_view word, size_t marker) const {
    const char32_t before = character_before(word, marker);
    return char_ids_.find(before) != nullptr && joined_before_marker_.find(before) == nullptr;
}

void BpeModel::add_merge(const std::string& left, const std::string& right, uint32_t rank) {
    const int left_id = vocab_id(left, left, right);
    const int right_id = vocab_id(right, left, right);
    const int merged_id = vocab_id(left + right, left, right);
    // A pair listed twice keeps its last rank, as Hugging Face's HashMap collect does.
    merges_.insert_or_assign(pair_key(left_id, right_id),
                             uint64_t(rank) << 32 | uint32_t(merged_id));
}

void BpeModel::encode_word(std::string_view word, std::vector<int>& ids,
                           EncodeScratch& scratch) const {
    if (ignore_merges) {
        scratch.key.assign(word);
        if (const auto found = vocab.find(scratch.key); found != vocab.end()) {
            ids.push_back(found->second);
            return;
        }
    }
    if (!segment_at_space_markers_) {
        merge_segment(word, ids, scratch);
        return;
    }
    size_t begin = 0;
    for (size_t marker = word.find(kSpaceMarker, 1); marker != std::string_view::npos;
         marker = word.find(kSpaceMarker, marker + kSpaceMarker.size())) {
        if (splits_before_marker(word, marker)) {
            merge_segment(word.substr(begin, marker - begin), ids, scratch);
            begin = marker;
        }
    }
    merge_segment(word.substr(begin), ids, scratch);
}

void BpeModel::merge_segment(std::string_view word, std::vector<int>& ids,
                             EncodeScratch& scratch) const {
    constexpr size_t kMaxCachedWordBytes = 256;
    const bool cacheable = word.size() < kMaxCachedWordBytes;
    if (cacheable) {
        scratch.key.assign(word);
        if (const auto hit = scratch.cache.find(scratch.key); hit != scratch.cache.end()) {
            const auto [offset, count] = hit->second;
            ids.insert(ids.end(), scratch.cached_ids.begin() + offset,
                       scratch.cached_ids.begin() + offset + count);
            return;
        }
    }
    const size_t first = ids.size();
    initial_symbols(word, scratch.symbols);
    merge_symbols(scratch.symbols, scratch.queue);
    for (const BpeSymbol& s : scratch.symbols)
        if (!s.removed) ids.push_back(s.id);
    if (cacheable) {
        const auto offset = uint32_t(scratch.cached_ids.size());
        scratch.cached_ids.insert(scratch.cached_ids.end(), ids.begin() + first, ids.end());
        scratch.cache.emplace(std::string(word),
                              std::make_pair(offset, uint32_t(ids.size() - first)));
    }
}

int BpeModel::vocab_id(const std::string& token, const std::string& left,
                       const std::string& right) const {
    const auto found = vocab.find(token);
    if (found == vocab.end())
        throw Error("tokenizer.json: merge " + quoted_excerpt(left + " " + right) + " needs " +
                    quoted_excerpt(token) + ", which is not in the vocabulary");
    return found->second;
}

int BpeModel::unk_id() const {
    if (!unk_id_)
        throw Error("tokenizer.json: unk_token " + quoted_excerpt(*unk_token) +
                    " is not in the vocabulary");
    return *unk_id_;
}

// One symbol per character, as Hugging Face's BPE::merge_word. A character outside the
// vocabulary becomes:
// - its <0xXX> byte tokens (byte_fallback),
// - or the unknown token, consecutive unknowns fused into one (fuse_unk),
// - or nothing when there is neither.
void BpeModel::initial_symbols(std::string_view word, std::vector<BpeSymbol>& symbols) const {
    symbols.clear();
    std::optional<int> pending_unk;
    for (size_t pos = 0; pos < word.size();) {
        const size_t length = utf8_length(word[pos]);
        if (const uint64_t* id = char_ids_.find(decode_utf8(word, pos))) {
            if (pending_unk) add_symbol(symbols, *std::exchange(pending_unk, std::nullopt));
            add_symbol(symbols, int(*id));
        } else if (byte_fallback && has_byte_tokens(word.substr(pos, length))) {
            // Hugging Face leaves a pending unknown for later here: it lands after the bytes.
            for (size_t i = 0; i < length; ++i)
                add_symbol(symbols, byte_ids_[static_cast<unsigned char>(word[pos + i])]);
        } else if (unk_token) {
            if (pending_unk && !fuse_unk) add_symbol(symbols, *pending_unk);
            pending_unk = unk_id();
        }
        pos += length;
    }
    if (pending_unk) add_symbol(symbols, *pending_unk);
    if (!symbols.empty()) symbols.back().next = -1;
}

bool BpeModel::has_byte_tokens(std::string_view bytes) const {
    return std::all_of(bytes.begin(), bytes.end(),
                       [&](char b) { return byte_ids_[static_cast<unsigned char>(b)] >= 0; });
}

void BpeModel::push_merge_if_known(std::vector<BpeSymbol>& symbols,
                                   std::vector<PendingMerge>& queue, int pos) const {
    const BpeSymbol& left = symbols[pos];
    if (left.next < 0) return;
    if (const uint64_t* merge = merges_.find(pair_key(left.id, symbols[left.next].id))) {
        queue.push_back(pending_merge(*merge, pos));
        std::push_heap(queue.begin(), queue.end(), ComesLater());
    }
}

// Hugging Face's Word::merge_all: repeatedly apply the best-ranked (then leftmost) merge.
// A queue entry made stale by an earlier merge is recognised because the pair now at its
// position no longer produces its token.
void BpeModel::merge_symbols(std::vector<BpeSymbol>& symbols,
                             std::vector<PendingMerge>& queue) const {
    queue.clear();
    for (int pos = 0; pos + 1 < int(symbols.size()); ++pos) {
        if (const uint64_t* merge = merges_.find(pair_key(symbols[pos].id, symbols[pos + 1].id)))
            queue.push_back(pending_merge(*merge, pos));
    }
    std::make_heap(queue.begin(), queue.end(), ComesLater());
    while (!queue.empty()) {
        std::pop_heap(queue.begin(), queue.end(), ComesLater());
        const PendingMerge top = queue.back();
        queue.pop_back();
        const int pos = int(top.pos());
        BpeSymbol& left = symbols[pos];
        if (left.removed || left.next < 0) continue;
        BpeSymbol& right = symbols[left.next];
        const uint64_t* current = merges_.find(pair_key(left.id, right.id));
        if (current == nullptr || int(uint32_t(*current)) != top.merged_id) continue;
        left.id = top.merged_id;
        right.removed = true;
        left.next = right.next;
        if (right.next >= 0) symbols[right.next].prev = pos;
        if (left.prev >= 0) push_merge_if_known(symbols, queue, left.prev);
        push_merge_if_known(symbols, queue, pos);
    }
}

}  // namespace barellm::tok
