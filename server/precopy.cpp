#include "server/precopy.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <future>

namespace vcuda::server {

namespace {

// Two independent 64-bit mixes of a word and its index (multiply-xorshift rounds, as in well-known integer
// finalizers); summed over the piece.
inline void mix_into(uint64_t w, uint64_t index, uint64_t& a, uint64_t& b) {
    uint64_t x = w ^ (index * 0x9e3779b97f4a7c15ull);
    x ^= x >> 31;
    x *= 0xd6e8feb86659fd93ull;
    x ^= x >> 32;
    a += x;
    uint64_t y = (w + index) * 0xa0761d6478bd642full;
    y ^= y >> 29;
    y *= 0xe7037ed1a0b428dbull;
    b += y ^ (y >> 32);
}

piece_digest digest_range(const std::byte* p, size_t n, uint64_t first_index) {
    uint64_t a = 0, b = 0;
    const size_t words = n / 8;
    for (size_t i = 0; i < words; ++i) {
        uint64_t w;
        std::memcpy(&w, p + i * 8, 8);
        mix_into(w, first_index + i, a, b);
    }
    if (n % 8) {
        uint64_t w = 0;
        std::memcpy(&w, p + words * 8, n % 8);
        mix_into(w, first_index + words, a, b);
    }
    return {a, b};
}

}  // namespace

piece_digest digest_piece(const std::byte* p, size_t n, uint64_t offset, unsigned threads) {
    constexpr size_t parallel_from = size_t{4} << 20;
    const uint64_t first = offset / 8;
    if (threads <= 1 || n < parallel_from) return digest_range(p, n, first);
    // Parts of whole words each; the sums add up to the single-threaded digest.
    const size_t part = (n / threads + 7) / 8 * 8;
    std::vector<std::future<piece_digest>> parts;
    for (size_t off = part; off < n; off += part)
        parts.push_back(
            std::async(std::launch::async, digest_range, p + off, std::min(part, n - off), first + off / 8));
    piece_digest d = digest_range(p, std::min(part, n), first);
    for (auto& f : parts) {
        piece_digest x = f.get();
        d.a += x.a;
        d.b += x.b;
    }
    return d;
}

const piece_digest* precopy_record::find(uint64_t va, size_t size, uint64_t offset) const {
    auto it = mappings.find(va);
    if (it == mappings.end() || it->second.size != size || !piece_bytes || offset % piece_bytes)
        return nullptr;
    const uint64_t k = offset / piece_bytes;
    return k < it->second.pieces.size() ? it->second.pieces[k].get() : nullptr;
}

std::byte* precopy_store::place(uint64_t va, uint64_t size, uint64_t offset, uint64_t len, std::string& why) {
    if (!size || !len || offset >= size || len > size - offset) {
        why = "a pre-copied piece outside its mapping";
        return nullptr;
    }
    auto it = mappings_.find(va);
    if (it == mappings_.end()) {
        // A mapping must not overlap one that came before (addresses are the sender's mappings').
        auto next = mappings_.lower_bound(va);
        if ((next != mappings_.end() && next->first < va + size) ||
            (next != mappings_.begin() && std::prev(next)->first + std::prev(next)->second.size > va)) {
            why = "pre-copied mappings overlap";
            return nullptr;
        }
        if (size > limit_ || reserved_ > limit_ - size) {
            why = "the pre-copied memory exceeds what this server takes for the session";
            return nullptr;
        }
        void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) {
            why = "no host memory for a pre-copied mapping";
            return nullptr;
        }
        mapping m;
        m.size = size;
        m.bytes = {static_cast<std::byte*>(p), device_memory::unmap_bytes{size}};
        reserved_ += size;
        it = mappings_.emplace(va, std::move(m)).first;
    } else if (it->second.size != size) {
        why = "a pre-copied mapping changed its size";
        return nullptr;
    }
    auto& m = it->second;
    if (!m.have.empty() && offset <= m.have.back()) {
        why = "pre-copied pieces out of order";
        return nullptr;
    }
    m.have.push_back(offset);
    bytes_ += len;
    return m.bytes.get() + offset;
}

precopy_store::taken precopy_store::take(uint64_t va, uint64_t size) {
    taken t;
    auto it = mappings_.find(va);
    if (it == mappings_.end() || it->second.size != size) return t;
    t.bytes = std::move(it->second.bytes);
    t.have = std::move(it->second.have);
    reserved_ -= it->second.size;
    mappings_.erase(it);
    return t;
}

}  // namespace vcuda::server
