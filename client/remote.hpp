// The client's link to a server: a session (opened at cuInit) and one lane per application thread.
// Each lane is its own connection, served by its own thread in the server, so a thread blocked in a
// synchronize never delays another thread's calls; order within a lane is the order of the calls.
// runs on: any application thread; a lane is used only by the thread that owns it.
#pragma once

#include <flatbuffers/flatbuffers.h>

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "client/bulk.hpp"
#include "common/transport.hpp"
#include "ops.hpp"
#include "vcuda_generated.h"

namespace vcuda::client {

// The CUresult every call returns once the server connection is lost (documented in the README).
inline constexpr int connection_lost_result = 46;  // CUDA_ERROR_DEVICE_UNAVAILABLE
// What lane::call answers a call with bulk chunks (after_send) that found its session moved to another
// server: the chunks went to the old one, so the caller makes the copy again (client/copy_paths.cpp). Never
// returned to the application.
inline constexpr int moved_retry_result = -1;

struct call_request {
    op operation{};
    int device = -1;  // server-side device index of the caller's current context
    std::span<const uint64_t> args;
    std::span<const std::span<const std::byte>> blobs;
    std::span<const std::byte> payload;  // bulk bytes after the metadata
    // Called once the call's frame is sent (or queued to be): striped copies queue their chunks there.
    const std::function<void()>* after_send = nullptr;
    // Its bytes travel on the session's bulk connections (striped copies): if the session moves to another
    // server meanwhile, the call answers moved_retry_result instead of being sent there again.
    bool uses_bulk = false;
    // A file descriptor that travels with the call (Unix sockets; synchronous calls only); the caller keeps
    // and closes its own.
    int pass_fd = -1;
};

struct call_reply {
    int result = 0;
    std::vector<uint64_t> outs;
    std::vector<std::vector<std::byte>> blobs;
    std::string detail;
    int fd = -1;  // a file descriptor passed with the reply (Unix sockets); the caller owns it
    // Where a reply payload goes: into payload_dst (exactly payload_cap bytes expected) or, if null,
    // `payload`.
    std::byte* payload_dst = nullptr;
    size_t payload_cap = 0;
    std::vector<std::byte> payload;
};

class session;

// How many calls this process sent, by kind: what `VCUDA_STATS` logs at exit and the private table's slot 3
// answers (tests count the round trips of a training step with it).
struct call_counters {
    std::atomic<uint64_t> round_trips{0};  // synchronous calls: the caller waited for the server
    std::atomic<uint64_t> posted{0};       // asynchronous calls: sent without waiting
    // The same by operation, kept only under VCUDA_CALL_STATS=1, which prints them to stderr at exit.
    bool by_op = false;
    std::array<std::atomic<uint64_t>, op_id_limit> sync_by_op{}, async_by_op{};
};
call_counters& counters();

// Frames leave a lane through its writer thread: the calling thread appends the encoded frame to a queue and
// goes on; the writer sends whatever has accumulated in one write. So frames are batched while a write is in
// flight and sent at once when the link is idle. Frames with a large payload are written by the calling
// thread itself, after the queue has drained, so bulk bytes are never copied twice.
class lane {
  public:
    lane(session& s, frame_stream fs, uint32_t number);
    ~lane();

    // Sends a call and waits for its reply. Returns the call's CUresult (or connection_lost_result).
    int call(const call_request& rq, call_reply& rp);
    // Sends a call without waiting; its error, if any, comes back with the next synchronous reply.
    int post(const call_request& rq);
    uint32_t number() const { return number_; }
    // Another lane learnt that the session moved to `to`: this one follows now when its thread is not in a
    // call (an idle thread's posted frames that the old server did not run may be what other threads' calls
    // wait for there); a thread in a call follows at its reply.
    void follow_if_idle(const std::string& to);

  private:
    int call_held(const call_request& rq, call_reply& rp);  // use_mu_ held
    int post_held(const call_request& rq);
    outgoing_frame build(const call_request& rq, bool async);
    int lost(const transport_error& e);
    // The session moved to `to` (an operator's migrate): this lane joins it there, sends again every posted
    // frame after `ran_through` (the last call the old server ran) and then `again`, the call whose reply
    // said so (unless it is null). False, the session marked lost, when that fails.
    // `others`: then every other idle lane of the session follows too. ran_through 0: the receiver leaves
    // out posted frames it ran already (their sequence is within the progress it was sent).
    bool follow(const std::string& to, uint64_t ran_through, const outgoing_frame* again, bool others = true);
    // Queues the frame (or writes it directly when its payload is large). False when the link is gone.
    bool send(const outgoing_frame& f, bool wait_for_reply, int pass_fd = -1);
    void writer_loop();

    static constexpr size_t direct_payload = 64u << 10;
    std::mutex mu_;
    std::condition_variable cv_;
    std::vector<std::byte> queue_;
    bool writing_ = false, stop_ = false, failed_ = false;
    transport_error failure_;
    std::thread writer_;
    int owner_pid_ = 0;  // a forked child has no writer thread: it writes directly
    // Posted frames, as written, since the last reply: a session that moved runs them again where it went
    // (follow). The owning thread's only. Past `unacked_limit` the next call waits for its reply.
    std::vector<std::byte> unacked_;
    static constexpr size_t unacked_limit = 32u << 20;

    // Held by the owning thread through each call and post, and by another thread that makes this idle lane
    // follow a moved session (follow_if_idle).
    std::mutex use_mu_;
    std::string server_;  // the address this lane is connected to (use_mu_)
    session& session_;
    frame_stream fs_;
    uint32_t number_;
    uint64_t sequence_ = 0;
    flatbuffers::FlatBufferBuilder fbb_{1024};
    std::vector<flatbuffers::Offset<wire::Blob>> blob_offsets_;
};

struct server_device {
    std::string name;
    std::array<unsigned char, 16> uuid{};
    uint64_t total_memory = 0;    // the vGPU's size: the quota when one is set
    std::vector<int> attributes;  // indexed by CUdevice_attribute
    int server_index = 0;         // the GPU's index on its server
    session* owner = nullptr;     // the session that serves it

    // Attribute `attr` (a CUdevice_attribute); 0 for one the server did not send.
    int attribute(int attr) const {
        return attr >= 0 && static_cast<size_t>(attr) < attributes.size() ? attributes[attr] : 0;
    }
};

class session {
  public:
    // Connects, says HELLO and fetches the devices. `why` explains a failure in one line.
    // `tag` (0-15) distinguishes this session's handles from those of the client's other sessions.
    static std::unique_ptr<session> open(const std::string& address, std::chrono::milliseconds timeout,
                                         const std::string& token, uint32_t tag, std::string& why);
    uint32_t tag() const { return tag_; }
    static constexpr uint32_t max_sessions = 16;
    // The process handed its lease back at exit: the servers end its sessions while libraries' destructors
    // may still call, so a lost connection is expected from now on (logged at debug, not as an error).
    static void expect_disconnect();

    // This thread's lane, connected on first use. Null when the server cannot be reached (reason logged).
    lane* this_thread_lane();
    const std::vector<server_device>& devices() const { return devices_; }
    std::string address() {
        std::lock_guard lock(endpoint_mu_);
        return address_;
    }
    // The server is on this host (Unix socket): pinned host memory can be shared with it.
    bool local() const { return local_.load(); }
    bool lost() const { return lost_.load(); }
    void mark_lost(const std::string& why);
    // Lanes are separate connections served by separate server threads, so frames of two threads are not
    // ordered on the server by themselves. Each frame notes itself here; a frame from another lane than the
    // previous frame's carries that frame as a dependency, which the server waits for (program order across
    // threads, as the real driver keeps it: a launch made after another thread's launch runs after it on a
    // shared stream).
    struct frame_ref {
        uint32_t lane = 0;
        uint64_t seq = 0;  // 0: none
    };
    frame_ref note_send(uint32_t lane, uint64_t seq);

    // The session moved to the server at `to`: lanes connect there from now on (each lane follows at its own
    // next reply), striped copies open new bulk connections. False when `to` is not an address.
    bool moved(const std::string& to);
    // The lanes alive in this process, for a moved session's lanes to follow together (lane::follow).
    void add_lane(lane* l);
    void remove_lane(lane* l);
    void follow_others(const std::string& to, lane* self);
    // A connection to the session's server for lane `number`, HELLO done; `why` says why not.
    std::optional<frame_stream> connect_stream(uint32_t number, std::string& why);

    // Striped copies (client/bulk.hpp): this session's bulk connections, opened at the first large copy. Null
    // when striping is off (VCUDA_BULK_STREAMS=0, a Unix socket, a server that does not offer it, a forked
    // child) or the connections cannot be opened; after three sets that failed, striping stays off.
    std::shared_ptr<bulk_link> bulk();
    uint64_t next_transfer() { return ++transfers_; }

  private:
    std::unique_ptr<lane> connect_lane(uint32_t number, std::string& why);

    std::mutex endpoint_mu_;  // endpoint_ and address_ change when the session moves
    endpoint endpoint_;
    std::string address_;
    std::atomic<bool> local_{false};
    std::string token_;
    std::chrono::milliseconds timeout_{5000};
    uint64_t id_ = 0;
    std::string key_;  // the session's key from the first HELLO reply: later lanes present it to join
    uint32_t tag_ = 0;
    std::atomic<uint32_t> next_lane_{0};
    std::atomic<bool> lost_{false};
    std::mutex order_mu_;
    frame_ref last_sent_;
    std::mutex lanes_mu_;
    std::vector<lane*> lanes_;
    std::vector<server_device> devices_;
    uint32_t bulk_cap_ = 0;  // from HELLO's reply: the most connections of a bulk set; 0: no striping
    int pid_ = 0;            // the process that opened the session (a forked child has none of its threads)
    std::mutex bulk_mu_;
    std::shared_ptr<bulk_link> bulk_;
    uint32_t bulk_sets_ = 0, bulk_failures_ = 0;
    bool bulk_off_ = false;
    std::atomic<uint64_t> transfers_{0};
};

}  // namespace vcuda::client
