// The block books of kv_blocks.h.
#include "serve/kv_blocks.h"

#include <algorithm>
#include <string>

#include "util/error.h"

namespace barellm::serve {

namespace {

// splitmix64's finaliser: every bit of the input moves about half the output bits.
uint64_t mix(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

}  // namespace

KvBlocks::KvBlocks(int blocks, int block_size) : block_size_(block_size), blocks_(blocks) {
    if (blocks < 1 || block_size < 1)
        throw Error("KV blocks: need at least one block of at least one position, got " +
                    std::to_string(blocks) + " blocks of " + std::to_string(block_size));
    // Popped from the back: block 0 is taken first.
    for (int b = blocks - 1; b >= 0; --b) unused_.push_back(b);
}

uint64_t KvBlocks::chain_hash(uint64_t previous, const int* tokens) const {
    uint64_t hash = mix(previous + 0x9e3779b97f4a7c15ULL);
    for (int i = 0; i < block_size_; ++i) hash = mix(hash ^ uint32_t(tokens[i]));
    return hash;
}

int KvBlocks::find_published(uint64_t hash, const int* tokens, int parent,
                             uint64_t parent_version) const {
    const auto found = by_hash_.find(hash);
    if (found == by_hash_.end()) return -1;
    const Block& block = blocks_[found->second];
    const bool same = block.parent == parent &&
                      (parent < 0 || block.parent_version == parent_version) &&
                      std::equal(block.tokens.begin(), block.tokens.end(), tokens);
    return same ? found->second : -1;
}

std::vector<int> KvBlocks::cached_prefix(const std::vector<int>& tokens) const {
    std::vector<int> chain;
    uint64_t hash = 0;
    int parent = -1;
    for (size_t first = 0; first + block_size_ <= tokens.size(); first += block_size_) {
        hash = chain_hash(hash, tokens.data() + first);
        const int block = find_published(hash, tokens.data() + first, parent,
                                         parent < 0 ? 0 : blocks_[parent].version);
        if (block < 0) break;
        chain.push_back(block);
        parent = block;
    }
    return chain;
}

int KvBlocks::blocks_to_open(const std::vector<int>& tokens) const {
    int held = 0;
    for (int block : cached_prefix(tokens))
        if (blocks_[block].refs > 0) ++held;
    return blocks_for(int(tokens.size())) - held;
}

int KvBlocks::take_free_block() {
    int block;
    if (!unused_.empty()) {
        block = unused_.back();
        unused_.pop_back();
    } else {
        block = evictable_.front();
        evictable_.pop_front();
        Block& evicted = blocks_[block];
        by_hash_.erase(evicted.hash);
        evicted.published = false;
        evicted.tokens.clear();
    }
    Block& taken = blocks_[block];
    ++taken.version;
    taken.refs = 1;
    ++used_;
    return block;
}

void KvBlocks::add_reference(int block) {
    Block& b = blocks_[block];
    if (b.refs == 0) {
        evictable_.erase(b.lru_slot);  // only published blocks are shared
        ++used_;
    }
    ++b.refs;
}

void KvBlocks::drop_reference(int block) {
    Block& b = blocks_[block];
    if (--b.refs > 0) return;
    --used_;
    if (b.published)
        b.lru_slot = evictable_.insert(evictable_.end(), block);
    else
        unused_.push_back(block);
}

KvBlocks::Sequence& KvBlocks::sequence(uint64_t id) {
    const auto found = sequences_.find(id);
    if (found == sequences_.end())
        throw Error("KV blocks: sequence " + std::to_string(id) + " is not open");
    return found->second;
}

const std::vector<int>& KvBlocks::table(uint64_t id) const {
    const auto found = sequences_.find(id);
    if (found == sequences_.end())
        throw Error("KV blocks: sequence " + std::to_string(id) + " is not open");
    return found->second.table;
}

int KvBlocks::open(uint64_t id, const std::vector<int>& tokens) {
    if (is_open(id)) throw Error("KV blocks: sequence " + std::to_string(id) + " is open already");
    const std::vector<int> cached = cached_prefix(tokens);
    int held = 0;
    for (int block : cached)
        if (blocks_[block].refs > 0) ++held;
    if (blocks_for(int(tokens.size())) - held > free_blocks()) return -1;

    Sequence& seq = sequences_[id];
    for (int block : cached) {
        add_reference(block);  // before any take_free_block() could evict it
        seq.table.push_back(block);
        seq.chain_hash = blocks_[block].hash;
        seq.chain_block = block;
        seq.chain_version = blocks_[block].version;
    }
    seq.published = int(cached.size());
    while (int(seq.table.size()) < blocks_for(int(tokens.size())))
        seq.table.push_back(take_free_block());
    return int(cached.size()) * block_size_;
}

bool KvBlocks::make_writable(uint64_t id, int pos, std::vector<BlockCopy>& copies) {
    Sequence& seq = sequence(id);
    const int index = pos / block_size_;
    if (pos < 0 || index > int(seq.table.size()))
        throw Error("KV blocks: position " + std::to_string(pos) + " lies past the table of " +
                    std::to_string(seq.table.size()) + " blocks");
    if (index == int(seq.table.size())) {
        if (free_blocks() == 0) return false;
        seq.table.push_back(take_free_block());
        return true;
    }
    const int shared = seq.table[index];
    if (blocks_[shared].refs == 1) return true;
    if (free_blocks() == 0) return false;
    const int copy = take_free_block();
    drop_reference(shared);  // others still hold it: it stays used
    seq.table[index] = copy;
    copies.push_back({shared, copy});
    return true;
}

void KvBlocks::publish(uint64_t id, const std::vector<int>& tokens, int computed) {
    Sequence& seq = sequence(id);
    const int full = std::min(computed / block_size_, int(seq.table.size()));
    while (!seq.chain_ended && seq.published < full) {
        const int* ids = tokens.data() + size_t(seq.published) * block_size_;
        const uint64_t hash = chain_hash(seq.chain_hash, ids);
        int index = seq.table[seq.published];
        if (by_hash_.count(hash)) {
            // A twin: the same ids after the same chain, computed by another sequence at the
            // same time. The chain goes on through the twin; this block stays unpublished.
            // Else a hash collision: this sequence publishes no more.
            index = find_published(hash, ids, seq.chain_block, seq.chain_version);
            if (index < 0) {
                seq.chain_ended = true;
                break;
            }
        } else {
            Block& block = blocks_[index];
            block.published = true;
            block.hash = hash;
            block.parent = seq.chain_block;
            block.parent_version = seq.chain_version;
            block.tokens.assign(ids, ids + block_size_);
            by_hash_[hash] = index;
        }
        seq.chain_hash = hash;
        seq.chain_block = index;
        seq.chain_version = blocks_[index].version;
        ++seq.published;
    }
}

void KvBlocks::close(uint64_t id) {
    Sequence& seq = sequence(id);
    // The last blocks first: they become the least recently used, evicted before the blocks
    // their chains start with.
    for (auto block = seq.table.rbegin(); block != seq.table.rend(); ++block)
        drop_reference(*block);
    sequences_.erase(id);
}

}  // namespace barellm::serve
