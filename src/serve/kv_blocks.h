// The books of the server's paged KV cache: which block of the backend's cache holds which
// positions of which sequence. No keys or values here: the backend holds those
// (BackendOptions::kv_blocks, Backend::step, Backend::copy_kv_block).
//
// A pool of blocks of block_size positions each. Every open sequence has a block table:
// position p lives in slot p % block_size of block table[p / block_size]. A block counts the
// tables that hold it. A full block whose keys and values are computed is published under a
// chained hash of (the previous block's hash, its block_size token ids); a sequence opened on
// tokens that begin with published blocks takes them (one more reference) instead of
// computing them again. The match compares the ids and the previous block too, never the
// hash alone. A published block that no table holds stays cached, evictable (least recently
// used first), until a sequence needs its space; blocks never published are taken first.
// Writing into a block that other tables hold gives the writer a private copy first (copy
// on write).
#pragma once
#include <cstdint>
#include <list>
#include <unordered_map>
#include <vector>

namespace barellm::serve {

// Block `from`'s keys and values must be copied to block `to` before the step writes.
struct BlockCopy {
    int from, to;
};

class KvBlocks {
public:
    KvBlocks(int blocks, int block_size);

    int block_size() const { return block_size_; }
    int total_blocks() const { return int(blocks_.size()); }
    // Blocks that hold `positions` positions.
    int blocks_for(int positions) const { return (positions + block_size_ - 1) / block_size_; }
    // Blocks some table holds, and the rest (never used, or cached and evictable).
    int used_blocks() const { return used_; }
    int free_blocks() const { return total_blocks() - used_; }
    // Published blocks no table holds (a part of free_blocks()).
    int cached_blocks() const { return int(evictable_.size()); }
    int ref_count(int block) const { return blocks_.at(block).refs; }

    // Free blocks that open(tokens) would take now: the blocks of tokens.size() positions
    // less the published blocks it begins with that some table already holds.
    int blocks_to_open(const std::vector<int>& tokens) const;
    // Opens sequence `id` (not open) on `tokens` (its prompt, or its prompt and the tokens
    // drawn so far when it comes back after a preemption): its table takes the published
    // blocks `tokens` begins with, then free blocks up to tokens.size() positions. Returns
    // the positions whose keys and values it found cached (a multiple of block_size, at most
    // tokens.size()), or -1 when the free blocks are too few (nothing changes).
    int open(uint64_t id, const std::vector<int>& tokens);
    // Makes position `pos` of `id` writable: appends a block when `pos` is the first position
    // past the table (pos may not be further), and replaces a block that other tables hold by
    // a private copy, appended to `copies`. False when that needs a block and none is free
    // (nothing changes).
    bool make_writable(uint64_t id, int pos, std::vector<BlockCopy>& copies);
    // Publishes the full blocks of `id` whose positions lie in [0, computed): their keys and
    // values are in the cache now. `tokens` are the sequence's ids (at least `computed`).
    void publish(uint64_t id, const std::vector<int>& tokens, int computed);
    // Closes `id`: each block of its table loses a reference; published ones stay cached.
    void close(uint64_t id);

    bool is_open(uint64_t id) const { return sequences_.count(id) != 0; }
    const std::vector<int>& table(uint64_t id) const;

private:
    struct Block {
        int refs = 0;
        // Incremented each time the block is taken for new contents: a link to it (parent)
        // holds the version it saw, so a child of evicted contents never matches.
        uint64_t version = 0;
        bool published = false;
        uint64_t hash = 0;
        int parent = -1;  // the previous block of the chain it was published in, -1: first
        uint64_t parent_version = 0;
        std::vector<int> tokens;            // its block_size ids, when published
        std::list<int>::iterator lru_slot;  // in evictable_, when published and refs == 0
    };
    struct Sequence {
        std::vector<int> table;
        // The chain of published blocks this sequence's first `published` blocks match: its
        // hash so far and its last block (the parent of the next), as published.
        int published = 0;
        bool chain_ended = false;  // a hash collision: publish no more
        uint64_t chain_hash = 0;
        int chain_block = -1;
        uint64_t chain_version = 0;
    };

    // The published block that holds tokens[first, first + block_size) after chain block
    // `parent` (version `parent_version`), whose chain hash is `hash`; -1 if none.
    int find_published(uint64_t hash, const int* tokens, int parent, uint64_t parent_version) const;
    // The published blocks `tokens` begins with, as a chain from the first block.
    std::vector<int> cached_prefix(const std::vector<int>& tokens) const;
    uint64_t chain_hash(uint64_t previous, const int* tokens) const;
    // A free block with one reference: a never published one, else the least recently used
    // cached one (unpublished first). The caller has checked free_blocks() > 0.
    int take_free_block();
    void add_reference(int block);
    void drop_reference(int block);
    Sequence& sequence(uint64_t id);

    int block_size_;
    std::vector<Block> blocks_;
    int used_ = 0;
    std::vector<int> unused_;                    // never published, no references
    std::list<int> evictable_;                   // published, no references; oldest first
    std::unordered_map<uint64_t, int> by_hash_;  // chain hash -> published block
    std::unordered_map<uint64_t, Sequence> sequences_;
};

}  // namespace barellm::serve
