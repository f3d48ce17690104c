// Shared-memory byte rings for a connection whose two ends share a host. One memfd holds two single-producer
// single-consumer rings, one per direction; frames are copied through them instead of through the socket, so
// a call and its reply cost no system call while the reader is awake (spinning). The socket stays: it carries
// file descriptors, it is the doorbell that wakes a reader that went to sleep (one byte, sent only when the
// reader said it sleeps), and its closing tells either side that the other is gone (common/transport.cpp).
//
// The creator (the server) maps the memory and passes its descriptor with HELLO's reply; the other side maps
// it too. Neither side trusts the other's counters: a ring whose counters make no sense reads as a protocol
// error.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/result.hpp"

namespace vcuda {

// Counters of one direction, each on its own cache line (producer and consumer write different lines).
struct ring_control {
    alignas(64) std::atomic<uint64_t> head{0};  // bytes ever written (producer)
    alignas(64) std::atomic<uint64_t> tail{0};  // bytes ever read (consumer)
    alignas(64) std::atomic<uint32_t> reader_sleeping{
        0};                             // the consumer waits on the socket: ring the doorbell
    std::atomic<uint64_t> fds_sent{0};  // descriptors sent on the socket with this direction's bytes
};

// One direction, as seen by one side. Each side keeps the last value it read of the peer's counter and reads
// the shared one again only when that runs out, and the consumer publishes its tail in steps (a quarter of
// the ring, or whenever it finds the ring empty): the counters' cache lines then move between the cores once
// per batch of frames, not several times per frame.
class ring_end {
  public:
    ring_end() = default;
    ring_end(ring_control* c, std::byte* data, size_t size) : c_(c), data_(data), size_(size) {}

    // Copies what fits (producer); returns bytes written. The reader sees them after publish().
    size_t write_some(const std::byte* src, size_t n);
    // Makes the bytes written so far visible to the reader (producer).
    void publish() {
        c_->head.store(mine_, std::memory_order_seq_cst);
    }  // seq_cst: pairs with reader_sleeping
    // Copies what is there, up to n (consumer); returns bytes read, or SIZE_MAX if the counters are corrupt.
    size_t read_some(std::byte* dst, size_t n);
    bool readable();
    bool writable();
    ring_control& control() { return *c_; }

  private:
    void release_read();  // consumer: publish the tail

    ring_control* c_ = nullptr;
    std::byte* data_ = nullptr;
    size_t size_ = 0;
    uint64_t mine_ = 0;       // this side's own counter (head or tail): the shared copy is the peer's to read
    uint64_t peer_ = 0;       // the peer's counter as last read
    uint64_t published_ = 0;  // consumer: the tail the producer last saw
};

class shm_rings {
  public:
    static constexpr size_t default_ring_bytes = size_t(4) << 20;

    ~shm_rings();
    shm_rings(const shm_rings&) = delete;
    shm_rings& operator=(const shm_rings&) = delete;

    // The creating side: a new memfd with two rings of `ring_bytes` each (a power of two). `fd` is the
    // caller's to pass and close.
    static result<std::unique_ptr<shm_rings>, std::string> create(size_t ring_bytes, int& fd);
    // The other side: maps a descriptor received from the creator (checked: size, magic).
    static result<std::unique_ptr<shm_rings>, std::string> open(int fd);

    ring_end& outbound() { return out_; }
    ring_end& inbound() { return in_; }

  private:
    shm_rings() = default;
    static result<std::unique_ptr<shm_rings>, std::string> map(int fd, size_t total, bool creator);

    void* base_ = nullptr;
    size_t total_ = 0;
    ring_end out_, in_;
};

}  // namespace vcuda
