#include "common/shm_ring.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>

namespace vcuda {

namespace {

constexpr uint64_t rings_magic = 0x31474e4952414356ull;  // "VCARING1"
constexpr size_t header_bytes = 4096;

// The first page of the mapping. Ring 0 carries the opener's bytes to the creator, ring 1 the other way.
struct rings_header {
    uint64_t magic;
    uint64_t ring_bytes;
    ring_control control[2];
};
static_assert(sizeof(rings_header) <= header_bytes);

bool power_of_two(size_t n) { return n >= 4096 && (n & (n - 1)) == 0; }

}  // namespace

size_t ring_end::write_some(const std::byte* src, size_t n) {
    if (size_ - (mine_ - peer_) < n) peer_ = c_->tail.load(std::memory_order_acquire);
    uint64_t used = mine_ - peer_;
    if (used > size_) return SIZE_MAX;
    n = std::min<uint64_t>(n, size_ - used);
    if (n == 0) return 0;
    size_t off = mine_ & (size_ - 1), first = std::min(n, size_ - off);
    std::memcpy(data_ + off, src, first);
    std::memcpy(data_, src + first, n - first);
    mine_ += n;
    return n;
}

size_t ring_end::read_some(std::byte* dst, size_t n) {
    if (peer_ - mine_ < n) peer_ = c_->head.load(std::memory_order_acquire);
    uint64_t avail = peer_ - mine_;
    if (avail > size_) return SIZE_MAX;
    n = std::min<uint64_t>(n, avail);
    if (n == 0) {
        release_read();  // about to wait: the producer may be waiting for room
        return 0;
    }
    size_t off = mine_ & (size_ - 1), first = std::min(n, size_ - off);
    std::memcpy(dst, data_ + off, first);
    std::memcpy(dst + first, data_, n - first);
    mine_ += n;
    if (mine_ - published_ >= size_ / 4 || mine_ == peer_) release_read();
    return n;
}

void ring_end::release_read() {
    if (published_ == mine_) return;
    published_ = mine_;
    c_->tail.store(mine_, std::memory_order_release);
}

bool ring_end::readable() {
    if (peer_ == mine_) peer_ = c_->head.load(std::memory_order_acquire);
    return peer_ != mine_;
}

bool ring_end::writable() {
    if (mine_ - peer_ >= size_) peer_ = c_->tail.load(std::memory_order_acquire);
    return mine_ - peer_ < size_;
}

shm_rings::~shm_rings() {
    if (base_) munmap(base_, total_);
}

result<std::unique_ptr<shm_rings>, std::string> shm_rings::map(int fd, size_t total, bool creator) {
    void* p = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) return unexpected{std::string("mmap of the frame rings: ") + std::strerror(errno)};
    auto r = std::unique_ptr<shm_rings>(new shm_rings());
    r->base_ = p;
    r->total_ = total;
    auto* h = static_cast<rings_header*>(p);
    size_t ring = (total - header_bytes) / 2;
    auto* data = static_cast<std::byte*>(p) + header_bytes;
    ring_end to_creator(&h->control[0], data, ring), to_opener(&h->control[1], data + ring, ring);
    r->out_ = creator ? to_opener : to_creator;
    r->in_ = creator ? to_creator : to_opener;
    return r;
}

result<std::unique_ptr<shm_rings>, std::string> shm_rings::create(size_t ring_bytes, int& fd) {
    if (!power_of_two(ring_bytes))
        return unexpected{std::string("ring size must be a power of two of at least 4 KiB")};
    fd = memfd_create("vcuda-frame-rings", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) return unexpected{std::string("memfd_create: ") + std::strerror(errno)};
    size_t total = header_bytes + 2 * ring_bytes;
    // Sealed at its size: a peer that shrank it would make this side's reads fault (SIGBUS).
    if (ftruncate(fd, static_cast<off_t>(total)) != 0 ||
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
        std::string why = std::string("sizing the frame rings: ") + std::strerror(errno);
        close(fd);
        fd = -1;
        return unexpected{why};
    }
    auto r = map(fd, total, true);
    if (!r) {
        close(fd);
        fd = -1;
        return r;
    }
    auto* h = static_cast<rings_header*>((*r)->base_);
    new (h) rings_header{rings_magic, ring_bytes, {}};
    return r;
}

result<std::unique_ptr<shm_rings>, std::string> shm_rings::open(int fd) {
    struct stat st {};
    if (fstat(fd, &st) != 0)
        return unexpected{std::string("fstat of the frame rings: ") + std::strerror(errno)};
    size_t total = static_cast<size_t>(st.st_size);
    if (total < header_bytes + size_t{2} * 4096) return unexpected{std::string("frame rings too small")};
    auto r = map(fd, total, false);
    if (!r) return r;
    auto* h = static_cast<const rings_header*>((*r)->base_);
    if (h->magic != rings_magic || !power_of_two(h->ring_bytes) || header_bytes + 2 * h->ring_bytes != total)
        return unexpected{std::string("frame rings: bad header")};
    return r;
}

}  // namespace vcuda
