// Pre-copy of a moving session's device memory (server/session_transfer.cpp): while the application still
// runs, the sender copies every mapping out piece by piece and sends it, noting each piece's digest; once the
// session is paused it reads every piece again and sends only those whose digest changed, the receiver
// keeping the others from the first pass. What changed is found by reading, not guessed from launches: a
// kernel may reach memory through pointers stored in memory, so only the bytes themselves tell.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "server/device_memory.hpp"

namespace vcuda::server {

// 128 bits over a piece's bytes: two sums of mixed 8-byte words, each word mixed with its index in the
// mapping, so that moved or swapped words change it too. Sums, so that parts can be digested in parallel and
// added up. Not a defence against a tenant who crafts collisions: that tenant would only corrupt its own
// memory.
struct piece_digest {
    uint64_t a = 0, b = 0;
    bool operator==(const piece_digest&) const = default;
};

// `n` bytes at `p`, the first of them at byte offset `offset` of its mapping (a multiple of 8; a tail shorter
// than a word counts zero-padded). Spread over up to `threads` threads for large pieces.
piece_digest digest_piece(const std::byte* p, size_t n, uint64_t offset, unsigned threads = 8);

// The sender's record of what it pre-copied: per mapping address, the mapping's size and each piece's digest
// (none for a piece it could not copy, which is then sent in full).
struct precopy_record {
    struct mapping {
        size_t size = 0;
        std::vector<std::unique_ptr<piece_digest>> pieces;
    };
    std::map<uint64_t, mapping> mappings;
    uint64_t piece_bytes = 0;
    uint64_t bytes = 0;  // pre-copied in all
    // The digest the piece at `offset` of the mapping at `va` had when it was pre-copied, if it was.
    const piece_digest* find(uint64_t va, size_t size, uint64_t offset) const;
};

// The receiver's store of pre-copied pieces: each mapping's bytes in host memory of the mapping's size, where
// the paused pass's pieces land too. Bounded: the pieces' mappings may not add up to more than `limit` bytes.
class precopy_store {
  public:
    explicit precopy_store(uint64_t limit) : limit_(limit) {}
    // Where a pre-copied piece of `len` bytes at `offset` of the mapping at `va` (of `size` bytes) goes; null
    // with `why` when it does not fit what came before or the limit.
    std::byte* place(uint64_t va, uint64_t size, uint64_t offset, uint64_t len, std::string& why);
    // The mapping's bytes, if any piece of it came, for the image (the store lets go of them); `have` tells
    // which offsets came.
    struct taken {
        device_memory::saved_mapping::bytes_type bytes{nullptr, device_memory::unmap_bytes{0}};
        std::vector<uint64_t> have;  // offsets of the pieces that came, in order
    };
    taken take(uint64_t va, uint64_t size);
    uint64_t bytes() const { return bytes_; }

  private:
    struct mapping {
        uint64_t size = 0;
        device_memory::saved_mapping::bytes_type bytes{nullptr, device_memory::unmap_bytes{0}};
        std::vector<uint64_t> have;
    };
    std::map<uint64_t, mapping> mappings_;
    uint64_t limit_;
    uint64_t reserved_ = 0;  // the mappings' sizes
    uint64_t bytes_ = 0;     // the pieces that came
};

}  // namespace vcuda::server
