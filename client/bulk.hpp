// Striped copies over TCP (protocol/README.md, *Bulk connections*): a session's bulk connections carry the
// bytes of large copies as chunks, so that several sockets, threads and kernel contexts move them instead of
// one lane.
// - Host to device: the lane sends copy_htod_striped; right after, the copy's chunks are queued here, and
//   each connection's sender thread writes the next chunk in the queue. Calls take order() around sending
//   the call and queueing, so chunks go out in the order of the calls on every connection (the server runs
//   striped copies in that order and takes chunks only into its bounded buffers: out of order, they could
//   wait for ever).
// - Device to host: the copy is registered, the lane sends copy_dtoh_striped, and each connection's
//   receiver thread reads the chunks the server writes straight into the caller's buffer at their offsets.
// Any failure closes every connection: the copies under way fail, and the session opens a new set at its
// next large copy (server/bulk.hpp has the server's half).
// runs on: application threads (calls) and two threads per connection. locks: mu_ guards the queue, the
// transfers' counters and the link's state; order_mu_ is taken before mu_.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/transport.hpp"

namespace vcuda::client {

class bulk_link {
  public:
    static constexpr size_t max_chunk = 8u << 20;  // the server's staging buffers (server/bulk.hpp)
    static constexpr size_t min_chunk = 1u << 20;

    // Opens `count` connections of bulk set `set` to session `session_id` at `ep`. Null, with `why`, if one
    // fails.
    static std::shared_ptr<bulk_link> open(const endpoint& ep, uint64_t session_id, const std::string& key,
                                           uint32_t set, unsigned count, std::chrono::milliseconds timeout,
                                           std::string& why);
    ~bulk_link();
    bulk_link(const bulk_link&) = delete;
    bulk_link& operator=(const bulk_link&) = delete;

    uint32_t set() const { return set_; }
    bool broken();
    // The chunk size for a copy of n bytes: a few chunks for each connection, whole MiB, at most max_chunk.
    size_t chunk_for(size_t n) const;

    // One copy. The caller sets id, host, n and chunk, and keeps it (and the host bytes) until wait_written()
    // or finish() returned; the counters are the link's.
    struct transfer {
        uint64_t id = 0;
        std::byte* host = nullptr;
        uint64_t n = 0, chunk = 0;
        uint64_t total = 0, done = 0;  // chunks: all, and written or received
        uint64_t outstanding = 0;      // host to device: chunks queued or being written
        int writers = 0;               // device to host: receivers reading into `host` now
        std::vector<bool> seen;
        bool failed = false;
    };

    // Host to device. Under order(): send the call, then queue(). wait_written(): until no chunk is queued or
    // being written any more; true when all were written.
    std::mutex& order() { return order_mu_; }
    void queue(transfer& t);
    bool wait_written(transfer& t);

    // Device to host. expect() before the call is sent; finish() after its reply: with `all` (the server
    // succeeded), waits for every chunk; then forgets t once no receiver writes into its buffer. True when
    // every chunk came.
    void expect(transfer& t);
    bool finish(transfer& t, bool all);

    // The server closed this set (a striped call answered CUDA_ERROR_DEVICE_UNAVAILABLE): the next large copy
    // opens a new one.
    void close(const std::string& why);

  private:
    struct connection;
    explicit bulk_link(uint32_t set);
    void send_loop(connection& c);
    void receive_loop(connection& c);
    void fail(const std::string& why);  // mu_ held

    const uint32_t set_;
    std::mutex order_mu_;
    std::mutex mu_;
    std::condition_variable cv_;
    struct item {
        transfer* t;
        uint64_t offset;
    };
    std::deque<item> queue_;
    std::unordered_map<uint64_t, transfer*> downloads_;
    bool broken_ = false, stopping_ = false;
    std::vector<std::unique_ptr<connection>> connections_;
};

}  // namespace vcuda::client
