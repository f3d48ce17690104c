// Striped copies (protocol/README.md, *Bulk connections*): a session's bulk connections carry the bytes of
// large host-to-device and device-to-host copies as chunks, so that several threads and sockets move them
// instead of one lane. This is the session's rendezvous between them and the lanes.
// - Each bulk connection has its own pinned staging buffers, allocated on first need and reused (nothing is
//   allocated per chunk): receive_buffers for host-to-device chunks, send_buffers for device-to-host ones
//   (two pools, so that chunks waiting for a later call never starve the copy before it). Its receiver thread
//   reads a chunk only into a free buffer of its own, so a receiver whose buffers are all in use stops
//   reading (backpressure), and hands the chunk to the transfer it names. Chunks may come before the lane's
//   call: they wait here for it.
// - The lane running copy_htod_striped takes its transfer's chunks in any order, issues each copy on the
//   call's stream and gives the buffer back with an event recorded after the copy; the buffer is reused once
//   that copy completed.
// - The lane running copy_dtoh_striped copies chunks into free buffers of the connections, round robin, and
//   queues them; each connection's sender thread waits for a chunk's copy and writes it.
// - A bulk connection that ends breaks its set: the copies of that set fail (the lane answers
//   CUDA_ERROR_DEVICE_UNAVAILABLE) and its connections are closed; the client opens a new set for later
//   copies.
// All CUDA calls that copy run on the lane's thread, in its context and on the call's stream.
// runs on: lanes, bulk connection threads. locks: mu_ guards everything the connections and transfers hold.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/transport.hpp"
#include "driver_table.hpp"

namespace vcuda::server {

class bulk_hub {
  public:
    static constexpr size_t buffer_size = 8u << 20;  // the largest chunk
    static constexpr size_t min_chunk = 64u << 10;   // the smallest chunk size a striped copy may name
    static constexpr size_t receive_buffers = 4;     // per connection: at most 48 MiB of staging in all
    static constexpr size_t send_buffers = 2;
    // A host-to-device copy fails when none of its chunks arrives for this long while the set's receivers are
    // waiting on the network (not while they wait for buffers: that is the GPU's pace).
    static constexpr std::chrono::seconds stall_limit{60};

    bulk_hub(const driver_table& drv, uint64_t session_id);
    ~bulk_hub();
    bulk_hub(const bulk_hub&) = delete;
    bulk_hub& operator=(const bulk_hub&) = delete;

    struct connection;

    // ---- bulk connections (server.cpp: after HELLO)
    // Admits a connection to set `set` (at most `per_set` in one set); a new set replaces the session's older
    // ones. Null with `why` when the hub is closed, the set was broken or is full.
    connection* join(uint32_t set, uint32_t per_set, frame_stream& fs, std::string& why);
    // Serves the connection until it ends (a receiver loop here, a sender thread beside it), then releases
    // it.
    void serve(connection* c);

    // ---- lanes (handlers_memory.cpp). Arguments are checked by the caller; `rc` not CUDA_SUCCESS: the copy
    // is refused, but its chunks are still taken and dropped so none is left behind. Returns the copy's
    // result.
    CUresult to_device(uint32_t set, uint64_t transfer, CUdeviceptr dst, uint64_t n, uint64_t chunk,
                       CUstream s, CUresult rc, std::string& detail);
    CUresult to_host(uint32_t set, uint64_t transfer, CUdeviceptr src, uint64_t n, uint64_t chunk, CUstream s,
                     std::string& detail);
    // A striped call too malformed to account for its chunks: its set is closed.
    void abandon(uint32_t set, const std::string& why);

    // ---- the session
    // No more connections; every set is broken and its connections closed (the session's lanes are gone).
    void close(const std::string& why);
    // Context `ctx` is about to be destroyed (it was synchronized): forget its events and registrations.
    void forget_context(CUcontext ctx);

  private:
    struct buffer;
    struct set_state {
        int joined = 0, live = 0;
        bool broken = false;
        std::string why;
    };
    struct inbound;   // a host-to-device transfer, or chunks waiting for their call
    struct outbound;  // a device-to-host transfer under way

    // A buffer of `c`'s receive or send pool that is free to fill; may wait (unlocked) for the copy that last
    // used it. Null if none.
    buffer* take_free(connection* c, bool send, std::unique_lock<std::mutex>& lock);
    bool deliver(connection* c, buffer* b, uint64_t transfer, uint64_t offset, uint64_t len,
                 std::string& refusal);
    void send_loop(connection* c);
    void break_set(uint32_t set, const std::string& why);  // mu_ held
    void leave(connection* c, const std::string& why);
    // mu_ held: empty when set `set` can carry copies, else why not.
    std::string unusable(uint32_t set) const;
    bool recently_finished(uint64_t transfer) const;
    void finished(uint64_t transfer);
    // On the lane's thread, mu_ held: page-lock `b` in the current context (once); record `b`'s event after
    // the copy just issued on `s` (false when none could be recorded: the caller waits for the stream
    // instead).
    void pin(buffer* b);
    bool after_copy(buffer* b, CUstream s);
    // Frees a buffer no one uses any more: waits for its last copy, unpins it, unmaps it. mu_ not held.
    void destroy(buffer* b);

    const driver_table& drv_;
    const uint64_t session_;
    std::mutex mu_;
    std::condition_variable cv_;
    bool closed_ = false;
    std::map<uint32_t, set_state> sets_;
    std::vector<std::unique_ptr<connection>> connections_;
    std::unordered_map<uint64_t, std::unique_ptr<inbound>> inbound_;
    std::deque<uint64_t>
        finished_;  // the latest finished host-to-device transfers: their late chunks are refused
};

}  // namespace vcuda::server
