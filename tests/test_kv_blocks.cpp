// The paged KV cache's books (src/serve/kv_blocks.h): prefix sharing, copy on write and
// eviction on hand-built cases, then random workloads of 1,000 sequences against a model of
// the expected state. The test plays the backend: each slot of its emulated cache holds a key
// of the tokens up to and including the position written there, so a block table that reads
// another sequence's different prefix, or a copy that did not happen, shows as a wrong key.
#include <catch2/catch.hpp>
#include <map>
#include <random>
#include <vector>

#include "serve/kv_blocks.h"
#include "util/error.h"

using barellm::Error;
using barellm::serve::BlockCopy;
using barellm::serve::KvBlocks;

namespace {

// What the emulated backend writes for position `pos` of a sequence of `tokens`: a key of
// tokens[0..pos] (FNV-1a over the ids).
uint64_t prefix_key(const std::vector<int>& tokens, int pos) {
    uint64_t key = 1469598103934665603ULL;
    for (int i = 0; i <= pos; ++i) {
        key ^= uint64_t(tokens[i]) + 1;
        key *= 1099511628211ULL;
    }
    return key;
}

// The emulated backend's cache: block_size keys per block; 0 = never written.
struct EmulatedCache {
    int block_size;
    std::vector<uint64_t> slots;
    EmulatedCache(int blocks, int block_size)
        : block_size(block_size), slots(size_t(blocks) * block_size) {}
    uint64_t& at(const std::vector<int>& table, int pos) {
        return slots[size_t(table[pos / block_size]) * block_size + pos % block_size];
    }
    void copy(const BlockCopy& c) {
        std::copy_n(slots.begin() + size_t(c.from) * block_size, block_size,
                    slots.begin() + size_t(c.to) * block_size);
    }
};

// Writes positions [first, end) of sequence `id` the way the scheduler does: each made
// writable (copies applied), checked private, then written; then the full blocks published.
// Returns the first position not written: `end`, or the one that needed a block when none
// was free.
int write_positions(KvBlocks& books, EmulatedCache& cache, uint64_t id,
                    const std::vector<int>& tokens, int first, int end) {
    int pos = first;
    for (; pos < end; ++pos) {
        std::vector<BlockCopy> copies;
        if (!books.make_writable(id, pos, copies)) break;
        for (const BlockCopy& c : copies) cache.copy(c);
        const std::vector<int>& table = books.table(id);
        REQUIRE(books.ref_count(table[pos / books.block_size()]) == 1);
        cache.at(table, pos) = prefix_key(tokens, pos);
    }
    books.publish(id, tokens, pos);
    return pos;
}

std::vector<int> iota_tokens(int count, int first) {
    std::vector<int> tokens(count);
    for (int i = 0; i < count; ++i) tokens[i] = first + i;
    return tokens;
}

}  // namespace

TEST_CASE("a sequence whose prompt begins with computed blocks shares them", "[kv_blocks]") {
    KvBlocks books(8, 4);
    EmulatedCache cache(8, 4);
    const std::vector<int> a = iota_tokens(10, 100);
    REQUIRE(books.open(1, a) == 0);
    CHECK(books.table(1).size() == 3);
    CHECK(books.used_blocks() == 3);
    REQUIRE(write_positions(books, cache, 1, a, 0, 10) == 10);

    std::vector<int> b(a.begin(), a.begin() + 9);
    b.back() = 7;  // the same two first blocks, then other ids
    b.push_back(8);
    REQUIRE(books.blocks_to_open(b) == 1);  // 3 blocks, 2 of them held by sequence 1
    REQUIRE(books.open(2, b) == 8);
    CHECK(books.table(2)[0] == books.table(1)[0]);
    CHECK(books.table(2)[1] == books.table(1)[1]);
    CHECK(books.table(2)[2] != books.table(1)[2]);
    CHECK(books.ref_count(books.table(1)[0]) == 2);
    CHECK(books.ref_count(books.table(1)[2]) == 1);
    CHECK(books.used_blocks() == 4);
    for (int pos = 0; pos < 8; ++pos) CHECK(cache.at(books.table(2), pos) == prefix_key(b, pos));

    // The same ids after another first block are another chain: nothing shared.
    std::vector<int> c = a;
    c[0] = 99;
    CHECK(books.open(3, c) == 0);
    CHECK(books.used_blocks() == 7);

    books.close(1);
    books.close(2);
    books.close(3);
    CHECK(books.used_blocks() == 0);
    CHECK(books.free_blocks() == 8);
    CHECK(books.cached_blocks() == 2);  // a's two full blocks (c never wrote)
}

TEST_CASE("a prompt made of cached blocks gets a private copy of the block it writes",
          "[kv_blocks]") {
    KvBlocks books(4, 4);
    EmulatedCache cache(4, 4);
    const std::vector<int> prompt = iota_tokens(8, 1);
    REQUIRE(books.open(1, prompt) == 0);
    REQUIRE(write_positions(books, cache, 1, prompt, 0, 8) == 8);

    REQUIRE(books.open(2, prompt) == 8);  // every position cached
    const int shared_last = books.table(1)[1];
    CHECK(books.ref_count(shared_last) == 2);
    // The last prompt token runs again for its logits: position 7 is written.
    std::vector<BlockCopy> copies;
    REQUIRE(books.make_writable(2, 7, copies));
    REQUIRE(copies.size() == 1);
    CHECK(copies[0].from == shared_last);
    CHECK(copies[0].to == books.table(2)[1]);
    CHECK(copies[0].to != shared_last);
    CHECK(books.ref_count(shared_last) == 1);
    CHECK(books.ref_count(copies[0].to) == 1);
    CHECK(books.table(2)[0] == books.table(1)[0]);

    // Held only by sequence 2 once 1 closes: no copy needed.
    copies.clear();
    books.close(1);
    REQUIRE(books.make_writable(2, 0, copies) == true);  // block 0: refs 1 now
    CHECK(copies.empty());
    // A full pool: a block to grow into, or for a copy, is missing; false, nothing changes.
    REQUIRE(books.make_writable(2, 8, copies));
    REQUIRE(books.open(3, prompt) == 8);  // one block held by 2, the other cached
    CHECK(books.free_blocks() == 0);
    const std::vector<int> before = books.table(3);
    CHECK_FALSE(books.make_writable(3, 3, copies));  // its block 0 is 2's too
    CHECK(books.table(3) == before);
    CHECK_FALSE(books.make_writable(2, 12, copies));
    CHECK(copies.empty());
    CHECK_THROWS_AS(books.make_writable(2, 16, copies), Error);  // past the table
    books.close(2);
    books.close(3);
    CHECK(books.used_blocks() == 0);
}

TEST_CASE("cached blocks are evicted least recently used first, when space is needed",
          "[kv_blocks]") {
    KvBlocks books(4, 2);
    EmulatedCache cache(4, 2);
    const std::vector<int> a = iota_tokens(4, 10);
    REQUIRE(books.open(1, a) == 0);
    REQUIRE(write_positions(books, cache, 1, a, 0, 4) == 4);
    books.close(1);
    CHECK(books.cached_blocks() == 2);
    CHECK(books.free_blocks() == 4);

    // 3 blocks of other ids: the 2 never used, then a's last block (its chain's end).
    const std::vector<int> b = iota_tokens(6, 50);
    const int a_first = 0;  // blocks are taken from 0 up
    REQUIRE(books.blocks_to_open(b) == 3);
    REQUIRE(books.open(2, b) == 0);
    CHECK(books.cached_blocks() == 1);
    CHECK(books.free_blocks() == 1);
    // Too few blocks: -1, and nothing changes.
    CHECK(books.open(4, iota_tokens(3, 70)) == -1);
    CHECK_FALSE(books.is_open(4));
    CHECK(books.used_blocks() == 3);
    CHECK_THROWS_AS(books.open(2, a), Error);  // open already
    books.close(2);
    // a again: its first block is still cached, its second was given away.
    REQUIRE(books.open(3, a) == 2);
    CHECK(books.table(3)[0] == a_first);
    CHECK(books.cached_blocks() == 0);
    CHECK(books.used_blocks() == 2);
    books.close(3);
    CHECK(books.used_blocks() == 0);
    CHECK_THROWS_AS(books.close(3), Error);
}

TEST_CASE("two sequences that compute the same prefix at once share it afterwards", "[kv_blocks]") {
    KvBlocks books(8, 2);
    EmulatedCache cache(8, 2);
    const std::vector<int> prompt = iota_tokens(5, 3);
    REQUIRE(books.open(1, prompt) == 0);
    REQUIRE(books.open(2, prompt) == 0);  // before 1 computed anything
    REQUIRE(write_positions(books, cache, 1, prompt, 0, 5) == 5);
    REQUIRE(write_positions(books, cache, 2, prompt, 0, 5) == 5);  // twins of 1's blocks
    books.close(1);
    // A third finds 1's chain; 2's blocks stay its own.
    REQUIRE(books.open(3, prompt) == 4);
    CHECK(books.table(3)[0] != books.table(2)[0]);
    CHECK(books.ref_count(books.table(2)[0]) == 1);
    books.close(2);
    books.close(3);
    CHECK(books.used_blocks() == 0);
}

TEST_CASE("random workloads keep the books exact and end with every block free", "[kv_blocks]") {
    for (const int block_size : {1, 3, 16}) {
        DYNAMIC_SECTION("blocks of " << block_size) {
            std::mt19937 random(7 + block_size);
            const int total = 40 * 16 / block_size + 5;
            KvBlocks books(total, block_size);
            EmulatedCache cache(total, block_size);
            // Shared beginnings (a system prompt), then tails of a small vocabulary so that
            // the same ids recur after different prefixes.
            std::vector<std::vector<int>> prefixes;
            for (int p = 0; p < 4; ++p) {
                std::vector<int> prefix(std::uniform_int_distribution<int>(0, 40)(random));
                for (int& id : prefix) id = std::uniform_int_distribution<int>(0, 5)(random);
                prefixes.push_back(prefix);
            }
            struct Seq {
                std::vector<int> tokens;
                int computed = 0;  // positions written
            };
            std::map<uint64_t, Seq> running;  // by id: the youngest last
            std::vector<Seq> waiting;         // preempted or not admitted, oldest first
            uint64_t next_id = 1;
            int made = 0, preemptions = 0, shared_positions = 0, refused = 0;

            const auto admit = [&](Seq seq) {
                const int cached = books.open(next_id, seq.tokens);
                if (cached < 0) {
                    ++refused;
                    return false;
                }
                REQUIRE(cached % block_size == 0);
                REQUIRE(cached <= int(seq.tokens.size()));
                shared_positions += cached;
                seq.computed = std::min(cached, int(seq.tokens.size()) - 1);
                running[next_id++] = seq;
                return true;
            };
            const auto preempt_youngest = [&]() {
                auto youngest = std::prev(running.end());
                books.close(youngest->first);
                waiting.insert(waiting.begin(), youngest->second);
                running.erase(youngest);
                ++preemptions;
            };
            const auto check_books = [&]() {
                std::vector<int> refs(total, 0);
                std::map<int, std::pair<const Seq*, int>> holder;  // block -> a holder, index
                for (const auto& [id, seq] : running) {
                    const std::vector<int>& table = books.table(id);
                    REQUIRE(int(table.size()) >= books.blocks_for(seq.computed));
                    for (int k = 0; k < int(table.size()); ++k) {
                        ++refs[table[k]];
                        const auto [other, inserted] = holder.insert({table[k], {&seq, k}});
                        if (inserted) continue;
                        // Shared read-only: the same place in both, the same ids up to its end.
                        REQUIRE(other->second.second == k);
                        const std::vector<int>& a = other->second.first->tokens;
                        const int end = (k + 1) * block_size;
                        REQUIRE(int(a.size()) >= end);
                        REQUIRE(int(seq.tokens.size()) >= end);
                        REQUIRE(std::equal(a.begin(), a.begin() + end, seq.tokens.begin()));
                    }
                    int wrong = 0;
                    for (int pos = 0; pos < seq.computed; ++pos)
                        wrong += cache.at(table, pos) != prefix_key(seq.tokens, pos);
                    REQUIRE(wrong == 0);
                }
                int used = 0, miscounted = 0;
                for (int b = 0; b < total; ++b) {
                    miscounted += books.ref_count(b) != refs[b];
                    used += refs[b] > 0;
                }
                REQUIRE(miscounted == 0);
                REQUIRE(books.used_blocks() == used);
                REQUIRE(books.free_blocks() == total - used);
                REQUIRE(books.cached_blocks() <= books.free_blocks());
            };

            while (made < 1000 || !running.empty() || !waiting.empty()) {
                const int action = std::uniform_int_distribution<int>(0, 9)(random);
                if (!waiting.empty() && action < 3) {
                    if (admit(waiting.front())) waiting.erase(waiting.begin());
                } else if (made < 1000 && action < 5) {
                    Seq seq;
                    seq.tokens = prefixes[std::uniform_int_distribution<int>(0, 3)(random)];
                    const int tail = std::uniform_int_distribution<int>(1, 30)(random);
                    for (int i = 0; i < tail; ++i)
                        seq.tokens.push_back(std::uniform_int_distribution<int>(0, 5)(random));
                    ++made;
                    if (books.blocks_for(int(seq.tokens.size())) > total) continue;
                    if (!admit(seq)) waiting.push_back(seq);
                } else if (!running.empty() && action < 9) {
                    // One step of one sequence: a chunk of its prompt, or one drawn token.
                    auto it = running.begin();
                    std::advance(
                        it, std::uniform_int_distribution<size_t>(0, running.size() - 1)(random));
                    Seq& seq = it->second;
                    if (seq.computed == int(seq.tokens.size())) {
                        if (seq.tokens.size() > 120 || random() % 8 == 0) {  // finished
                            books.close(it->first);
                            running.erase(it);
                            check_books();
                            continue;
                        }
                        seq.tokens.push_back(std::uniform_int_distribution<int>(0, 5)(random));
                    }
                    const int end =
                        std::min(int(seq.tokens.size()), seq.computed + 1 + int(random() % 20));
                    const uint64_t id = it->first;
                    while (true) {
                        seq.computed =
                            write_positions(books, cache, id, seq.tokens, seq.computed, end);
                        if (seq.computed == end) break;
                        const bool self = std::prev(running.end())->first == id;
                        preempt_youngest();
                        if (self) break;
                    }
                } else if (!running.empty()) {  // a cancel
                    auto it = running.begin();
                    std::advance(
                        it, std::uniform_int_distribution<size_t>(0, running.size() - 1)(random));
                    books.close(it->first);
                    running.erase(it);
                }
                check_books();
            }
            CHECK(preemptions > 10);
            CHECK(refused > 10);
            CHECK(shared_positions > 1000);
            CHECK(books.used_blocks() == 0);
            CHECK(books.free_blocks() == total);
            for (int b = 0; b < total; ++b) REQUIRE(books.ref_count(b) == 0);
        }
    }
}
