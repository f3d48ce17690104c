// The paths of copies and sets between the application's memory and the server's (declared in
// client/copy_paths.hpp): pinned memory shared with a server on this host (memory the server allocated and
// exported as a file descriptor, mapped here), the staging-slot pool for large pageable copies to such a
// server, striped copies over the bulk connections (client/bulk.hpp) to a server over TCP, and the routing
// that picks one of these or plain frames on the calling thread's lane for each copy. The exported functions
// are in client/api_memory.cpp.
#include "client/copy_paths.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "client/bulk.hpp"
#include "client/deferred_copies.hpp"
#include "client/env_switch.hpp"
#include "client/host_functions.hpp"
#include "client/managed.hpp"
#include "client/parallel_copy.hpp"
#include "client/plain_call.hpp"
#include "client/remote_call.hpp"
#include "client/state.hpp"
#include "client_ops.hpp"
#include "common/log.hpp"

namespace vcuda::client {

namespace {

// Host-to-device copies travel in chunks so the server can stage them through reused pinned buffers.
constexpr size_t copy_chunk = 8u << 20;

std::span<const std::byte> bytes(const void* p, size_t n) { return {static_cast<const std::byte*>(p), n}; }

bool device_range(CUdeviceptr p, size_t n) {
    device_allocation a;
    return state::get().find_allocation(p, n, a);
}

uint64_t stream_arg(CUstream s) { return reinterpret_cast<uint64_t>(s); }
// Waits for the stream's earlier work, for a step this process then takes in the device's place (a copy or a
// memset of its own memory): copies that work left under way land first (client/deferred_copies.hpp).
CUresult stream_done_here(CUstream stream) {
    CUresult rc = remote(op::cuStreamSynchronize, {stream_arg(stream)});
    if (rc == CUDA_SUCCESS) settle_finished();
    return rc;
}

}  // namespace

CUresult check_stream(CUstream s) {
    return valid_handle(stream_arg(s), handle_kind::stream) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

namespace {

// ---------------------------------------------------------------- pinned host memory shared with the server

// Whether pinned allocations are shared with a server on this host: VCUDA_SHARED_HOST=0 turns it off (to
// compare with the copy-over-the-socket path).
bool sharing_enabled() {
    static const bool on = env_switch_on("VCUDA_SHARED_HOST");
    return on;
}

}  // namespace

// Pinned memory the server created and registered, mapped here at the server's address where that is free
// (then host pointer == device pointer, as unified addressing promises). CUDA_ERROR_NOT_SUPPORTED when the
// server is on another host (or sharing is off): the caller falls back to its own pages.
CUresult shared_host_alloc(host_allocation& h) {
    session& s = state::get().remote();
    if (!s.local() || !sharing_enabled()) return CUDA_ERROR_NOT_SUPPORTED;
    host_alloc_call c("cuMemHostAlloc", h.size);
    CUresult rc = c.send_sync();
    const int fd = c.reply().fd;
    if (rc != CUDA_SUCCESS || fd < 0) {
        if (fd >= 0) ::close(fd);
        return rc == CUDA_SUCCESS ? CUDA_ERROR_UNKNOWN : rc;
    }
    const uint64_t server_addr = c.server_address(), device_ptr = c.device_pointer();
    void* want = reinterpret_cast<void*>(server_addr);
    void* p = mmap(want, h.size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED_NOREPLACE, fd, 0);
    if (p == MAP_FAILED) p = mmap(nullptr, h.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    if (p == MAP_FAILED) {
        (void)host_free_call("cuMemFreeHost", server_addr).send_async();
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (p != want)
        VCUDA_LOG_DEBUG(
            "pinned memory mapped at {} (the server's address {} is taken here): host and device pointers "
            "differ",
            p, want);
    h.base = reinterpret_cast<uintptr_t>(p);
    h.server_addr = server_addr;
    h.device_ptr = device_ptr;
    h.owner = &s;
    return CUDA_SUCCESS;
}

void shared_host_free(const host_allocation& h) {
    if (!h.owner->lost()) (void)host_free_call("cuMemFreeHost", h.server_addr).send_sync();
}

namespace {

// The server's address for [p, p+n) when it lies in shared pinned memory of the current device's server, else
// 0.
uint64_t shared_address(const void* p, size_t n) {
    host_allocation h;
    auto a = reinterpret_cast<uintptr_t>(p);
    if (!state::get().find_host(a, h) || !h.shared() || h.owner != &state::get().remote()) return 0;
    if (n > h.size - (a - h.base)) return 0;
    return h.server_addr + (a - h.base);
}

// ---------------------------------------------------------------- pageable copies through staging slots

// Pageable copies of at least this size to a server on this host go through staging slots: pinned pages
// shared with the server (as cuMemAllocHost's), which the client fills or empties while the GPU reads or
// writes the other slot of the copy. One memcpy here (spread over helper threads: client/parallel_copy.hpp)
// and none on the server, where a frame costs one on each side.
constexpr size_t staged_min = 1u << 20;
constexpr size_t slot_size = 4u << 20;
constexpr size_t slots_per_session = 4;  // two copies at a time; a third thread's copy goes in frames

struct staging_slot {
    host_allocation h;
    bool busy = false;  // a copy is using it
    bool pending =
        false;  // a marked copy may still read or write it: wait (host_region_wait) before touching it
};

// The slots of each session, made at its first large pageable copy and kept for the process's life (the
// server frees them with the session). Not in a forked child: the pages are shared with the parent.
class staging_slots {
  public:
    // Two free slots of the current device's session; false when there are none to be had.
    bool take(staging_slot*& a, staging_slot*& b) {
        session& s = state::get().remote();
        std::lock_guard lock(mu_);
        auto& mine = sessions_[&s];
        if (mine.pid == 0) {
            mine.pid = getpid();
            for (size_t i = 0; i < slots_per_session; ++i) {
                auto slot = std::make_unique<staging_slot>();
                slot->h.size = slot_size;
                if (shared_host_alloc(slot->h) != CUDA_SUCCESS) break;
                mine.slots.push_back(std::move(slot));
            }
            if (mine.slots.size() < 2)
                VCUDA_LOG_INFO("no staging slots for pageable copies: they travel in frames");
        }
        if (mine.pid != getpid()) return false;
        staging_slot* two[2] = {};
        size_t found = 0;
        for (auto& slot : mine.slots)
            if (!slot->busy && found < 2) two[found++] = slot.get();
        if (found < 2) return false;
        a = two[0];
        b = two[1];
        a->busy = b->busy = true;
        return true;
    }
    void give_back(staging_slot* a, staging_slot* b) {
        std::lock_guard lock(mu_);
        a->busy = b->busy = false;
    }
    // Frees the current session's slots when none is in use, for an allocation of the application's that the
    // server's host memory quota refused; pageable copies then go in frames. False when there were none to
    // free.
    bool release_for_application() {
        session& s = state::get().remote();
        std::vector<std::unique_ptr<staging_slot>> freed;
        {
            std::lock_guard lock(mu_);
            auto it = sessions_.find(&s);
            if (it == sessions_.end() || it->second.pid != getpid() || it->second.slots.empty()) return false;
            for (auto& slot : it->second.slots)
                if (slot->busy) return false;
            freed = std::move(it->second.slots);
            it->second.slots.clear();
        }
        for (auto& slot : freed) {
            shared_host_free(slot->h);
            munmap(reinterpret_cast<void*>(slot->h.base), slot->h.size);
        }
        VCUDA_LOG_INFO(
            "the host memory quota is reached: staging slots freed for the application's pinned memory");
        return true;
    }

  private:
    struct per_session {
        int pid = 0;
        std::vector<std::unique_ptr<staging_slot>> slots;
    };
    std::mutex mu_;
    std::map<session*, per_session> sessions_;
};

staging_slots& staging() {
    static staging_slots* s = new staging_slots;  // never destroyed: copies may run while the process exits
    return *s;
}

}  // namespace

bool release_staging_slots() { return staging().release_for_application(); }

namespace {

// Whether a pageable copy of n bytes may be staged: large enough, the server on this host, and no capture (a
// captured copy would keep reading the slot).
bool stageable(size_t n) {
    return n >= staged_min && state::get().remote().local() && sharing_enabled() && !capture_under_way();
}

// Waits until the slot's last copy is done with it.
CUresult slot_ready(staging_slot& s) {
    if (!s.pending) return CUDA_SUCCESS;
    CUresult rc = remote(op::host_region_wait, {s.h.server_addr}, mode::sync);
    if (rc == CUDA_SUCCESS) s.pending = false;
    return rc;
}

// Slot-sized chunks alternate between the two slots: the next chunk is copied in while the GPU reads this
// one. The last chunk goes as `m` says (sync: the copy is done when the call returns).
// CUDA_ERROR_NOT_SUPPORTED: no slots, the caller sends the bytes in frames.
CUresult staged_htod(CUdeviceptr dst, const void* src, size_t n, CUstream stream, mode m) {
    staging_slot* slot[2];
    if (!staging().take(slot[0], slot[1])) return CUDA_ERROR_NOT_SUPPORTED;
    CUresult rc = CUDA_SUCCESS;
    for (size_t off = 0, k = 0; off < n && rc == CUDA_SUCCESS; off += slot_size, ++k) {
        staging_slot& s = *slot[k % 2];
        size_t len = std::min(slot_size, n - off);
        if ((rc = slot_ready(s)) != CUDA_SUCCESS) break;
        parallel_copy(reinterpret_cast<void*>(s.h.base), static_cast<const char*>(src) + off, len);
        s.pending = true;
        rc = remote(op::copy_htod_shared, {dst + off, s.h.server_addr, len, stream_arg(stream), 1},
                    off + len == n ? m : mode::post);
    }
    staging().give_back(slot[0], slot[1]);
    return rc;
}

// The GPU fills one slot while the other's bytes are copied out; the call returns with every byte in `dst`.
CUresult staged_dtoh(void* dst, CUdeviceptr src, size_t n, CUstream stream) {
    staging_slot* slot[2];
    if (!staging().take(slot[0], slot[1])) return CUDA_ERROR_NOT_SUPPORTED;
    const size_t chunks = (n + slot_size - 1) / slot_size;
    auto length = [&](size_t k) { return std::min(slot_size, n - k * slot_size); };
    auto issue = [&](size_t k) {
        staging_slot& s = *slot[k % 2];
        if (CUresult rc = slot_ready(s); rc != CUDA_SUCCESS)
            return rc;  // its last copy may be another's upload
        s.pending = true;
        return remote(op::copy_dtoh_shared,
                      {s.h.server_addr, src + k * slot_size, length(k), stream_arg(stream), 1}, mode::post);
    };
    CUresult rc = issue(0);
    for (size_t k = 0; k < chunks && rc == CUDA_SUCCESS; ++k) {
        if (k + 1 < chunks && (rc = issue(k + 1)) != CUDA_SUCCESS) break;
        staging_slot& s = *slot[k % 2];
        if ((rc = slot_ready(s)) != CUDA_SUCCESS) break;
        parallel_copy(static_cast<char*>(dst) + k * slot_size, reinterpret_cast<const void*>(s.h.base),
                      length(k));
    }
    staging().give_back(slot[0], slot[1]);
    return rc;
}

// 1D copies of n bytes as a CUDA_MEMCPY3D.
CUDA_MEMCPY3D linear_to_device(CUdeviceptr dst, const void* src, size_t n) {
    CUDA_MEMCPY3D c{};
    c.srcMemoryType = CU_MEMORYTYPE_HOST;
    c.srcHost = src;
    c.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    c.dstDevice = dst;
    c.WidthInBytes = n;
    c.Height = c.Depth = 1;
    return c;
}
CUDA_MEMCPY3D linear_from_device(void* dst, CUdeviceptr src, size_t n) {
    CUDA_MEMCPY3D c{};
    c.srcMemoryType = CU_MEMORYTYPE_DEVICE;
    c.srcDevice = src;
    c.dstMemoryType = CU_MEMORYTYPE_HOST;
    c.dstHost = dst;
    c.WidthInBytes = n;
    c.Height = c.Depth = 1;
    return c;
}

// ---------------------------------------------------------------- striped copies (client/bulk.hpp)

// Copies of at least this size to a server over TCP travel as chunks over the session's bulk connections.
constexpr size_t striped_threshold = 16u << 20;

// The bulk connections for a copy of n bytes, or null when it goes on its lane. Not while a capture is under
// way: a captured copy would keep the server's staging buffer (the server refuses it too).
std::shared_ptr<bulk_link> striping(size_t n) {
    if (n < striped_threshold || capture_under_way()) return nullptr;
    return state::get().remote().bulk();
}

// The call of a striped copy: {device address, size, stream, transfer id, chunk size, bulk set}.
struct striped_call {
    uint64_t args[6];
    call_request rq;
    striped_call(op o, uint64_t device_ptr, const bulk_link::transfer& t, CUstream stream, uint32_t set)
        : args{device_ptr, t.n, stream_arg(stream), t.id, t.chunk, set} {
        rq.operation = o;
        rq.device = current_server_device();
        rq.args = args;
        rq.uses_bulk = true;
    }
};

bulk_link::transfer striped_transfer(bulk_link& link, const void* host, size_t n) {
    bulk_link::transfer t;
    t.id = state::get().remote().next_transfer();
    t.host = static_cast<std::byte*>(const_cast<void*>(host));
    t.n = n;
    t.chunk = link.chunk_for(n);
    return t;
}

// The call goes on the lane in its place among the thread's calls; the chunks are queued right after it, and
// the caller returns once they are all written (the source may be reused then, as after the lane's own copy).
// A sync copy also waits for the server's reply: by then every chunk was taken and the copy enqueued.
int striped_htod(bulk_link& link, CUdeviceptr dst, const void* src, size_t n, CUstream stream) {
    lane* l = state::get().remote().this_thread_lane();
    if (!l) return connection_lost_result;
    auto t = striped_transfer(link, src, n);
    striped_call c(op::copy_htod_striped, dst, t, stream, link.set());
    std::unique_lock order(link.order());
    const std::function<void()> queue = [&] {
        link.queue(t);
        order.unlock();
    };
    c.rq.after_send = &queue;
    call_reply rp;
    // Always answered, posted or not: a session that moves meanwhile must tell this copy to be made again
    // (its chunks went to the old server), which a posted call would never hear. The reply comes once the
    // chunks are taken, so an asynchronous copy still does not wait for the GPU.
    int rc = l->call(c.rq, rp);
    link.wait_written(
        t);  // a failed write fails the copy on the server too: its reply or the next one says so
    if (rc == CUDA_ERROR_DEVICE_UNAVAILABLE) link.close("the server closed them");
    return rc;
}

// The chunks land in `dst` at their offsets, read by the bulk connections; the call returns once the reply
// and every chunk came.
int striped_dtoh(bulk_link& link, void* dst, CUdeviceptr src, size_t n, CUstream stream) {
    lane* l = state::get().remote().this_thread_lane();
    if (!l) return connection_lost_result;
    auto t = striped_transfer(link, dst, n);
    striped_call c(op::copy_dtoh_striped, src, t, stream, link.set());
    link.expect(t);
    call_reply rp;
    int rc = l->call(c.rq, rp);
    bool complete = link.finish(t, rc == 0);
    if (rc == 0 && !complete) return CUDA_ERROR_DEVICE_UNAVAILABLE;  // the bulk connections failed (logged)
    if (rc == CUDA_ERROR_DEVICE_UNAVAILABLE) link.close("the server closed them");
    return rc;
}

// Whether [p, p+n) lies in the application's pinned host memory, which a copy may name by its device pointer:
// under unified addressing that is the host pointer (XLA reads the counter its redzone kernel writes so).
bool in_pinned_host(uint64_t p, size_t n) {
    host_allocation h;
    return state::get().find_host(p, h) && n <= h.size - (p - h.base);
}

// A copy whose "device" side is such memory, the other side host memory: done in this process once the
// stream's earlier work is done, as the device would in stream order.
CUresult copy_local(void* dst, const void* src, size_t n, CUstream stream) {
    if (CUresult rc = stream_done_here(stream); rc != CUDA_SUCCESS) return rc;
    std::memmove(dst, src, n);
    return CUDA_SUCCESS;
}
// A copy from the device into this process's memory, complete when it returns: striped, through staging
// slots, or in the reply's payload.
CUresult dtoh_now(void* dst, CUdeviceptr src, size_t n, CUstream stream, bool src_on_device) {
    if (src_on_device) {
        if (auto link = striping(n))
            if (int rc = striped_dtoh(*link, dst, src, n, stream); rc != moved_retry_result)
                return static_cast<CUresult>(rc);
        if (stageable(n))
            if (CUresult rc = staged_dtoh(dst, src, n, stream); rc != CUDA_ERROR_NOT_SUPPORTED) return rc;
    }
    call_reply rp;
    rp.payload_dst = static_cast<std::byte*>(dst);
    rp.payload_cap = n;
    CUresult rc = remote(op::copy_dtoh, {src, n, stream_arg(stream)}, mode::sync, &rp);
    if (rc == CUDA_SUCCESS && !rp.payload.empty())
        return CUDA_ERROR_UNKNOWN;  // size mismatch from the server
    return rc;
}
}  // namespace

// Host to device: from shared pinned memory the server copies straight from the pages; large copies over TCP
// go striped, large pageable ones to a server on this host through staging slots; otherwise every chunk but
// the last is queued and the last waits for the server when `m` is sync, so the copy is enqueued on the GPU
// before the call returns, as with the real driver.
CUresult copy_htod(CUdeviceptr dst, const void* src, size_t n, CUstream stream, mode m) {
    VCUDA_REQUIRE_INIT();
    if (n == 0) return CUDA_SUCCESS;
    if (!src) return CUDA_ERROR_INVALID_VALUE;
    const bool dst_on_device = device_range(dst, n);
    if (!dst_on_device && in_pinned_host(dst, n) && !(capture_under_way() && stream_captures(stream)))
        return copy_local(reinterpret_cast<void*>(dst), src, n, stream);
    // Managed memory is the device's: its CPU view is never read here (client/managed.hpp).
    if (managed_contains(reinterpret_cast<uint64_t>(src)))
        return copy_dtod(dst, reinterpret_cast<uint64_t>(src), n, stream, m);
    if (CUresult rc = managed_before_device_access(dst, n, true); rc != CUDA_SUCCESS) return rc;
    if (m == mode::post && !dst_on_device) return CUDA_ERROR_INVALID_VALUE;
    if (uint64_t from = shared_address(src, n))
        return remote(op::copy_htod_shared, {dst, from, n, stream_arg(stream)}, m);
    if (capture_under_way() && stream_captures(stream))  // read when the graph runs, not now
        return capture_copy(linear_to_device(dst, src, n), stream, "a captured copy to the device");
    settle_range(src, n);  // a copy from the device still under way into these bytes lands first
    if (dst_on_device) {   // else the lane's copy gets the server's refusal
        if (auto link = striping(n))
            if (int rc = striped_htod(*link, dst, src, n, stream); rc != moved_retry_result)
                return static_cast<CUresult>(rc);
        if (stageable(n))
            if (CUresult rc = staged_htod(dst, src, n, stream, m); rc != CUDA_ERROR_NOT_SUPPORTED) return rc;
    }
    for (size_t off = 0; off < n; off += copy_chunk) {
        size_t len = std::min(copy_chunk, n - off);
        bool last = off + len == n;
        CUresult rc = remote(op::copy_htod, {dst + off, stream_arg(stream)}, last ? m : mode::post, nullptr,
                             bytes(static_cast<const char*>(src) + off, len));
        if (rc != CUDA_SUCCESS) return rc;
    }
    return CUDA_SUCCESS;
}

// Device to host: into shared pinned memory the GPU writes the pages itself, and the asynchronous form is
// truly asynchronous (the bytes are there once the stream is synchronized with, as with the real driver).
// The asynchronous form into the application's own pinned memory (a server over TCP) is left under way
// (client/deferred_copies.hpp). Otherwise the reply's payload (or a striped copy's chunks, or staging slots)
// fills the caller's buffer before the call returns, as the driver does for pageable memory.
CUresult copy_dtoh(void* dst, CUdeviceptr src, size_t n, CUstream stream, mode m) {
    VCUDA_REQUIRE_INIT();
    if (n == 0) return CUDA_SUCCESS;
    if (!dst) return CUDA_ERROR_INVALID_VALUE;
    const bool src_on_device = device_range(src, n);
    if (!src_on_device && in_pinned_host(src, n) && !(capture_under_way() && stream_captures(stream)))
        return copy_local(dst, reinterpret_cast<const void*>(src), n, stream);
    if (managed_contains(reinterpret_cast<uint64_t>(dst)))
        return copy_dtod(reinterpret_cast<uint64_t>(dst), src, n, stream, m);
    if (CUresult rc = managed_before_device_access(src, n, false); rc != CUDA_SUCCESS) return rc;
    if (uint64_t to = shared_address(dst, n)) {
        if (m == mode::post && (!src_on_device || check_stream(stream) != CUDA_SUCCESS))
            return CUDA_ERROR_INVALID_VALUE;
        return remote(op::copy_dtoh_shared, {to, src, n, stream_arg(stream)}, m);
    }
    if (capture_under_way() && stream_captures(stream))  // written when the graph runs, not now
        return capture_copy(linear_from_device(dst, src, n), stream, "a captured copy from the device");
    // Into the application's own pinned memory, asynchronously: left under way, as the driver leaves it.
    if (CUresult rc; m == mode::post && src_on_device && in_pinned_host(reinterpret_cast<uint64_t>(dst), n) &&
                     defer_dtoh(dst, src, n, stream, rc))
        return rc;
    settle_range(dst, n);  // an earlier copy still under way into these bytes lands first
    CUresult rc = dtoh_now(dst, src, n, stream, src_on_device);
    // The stream reached this copy: what was left under way before it in the stream has finished.
    if (rc == CUDA_SUCCESS) settle_finished();
    return rc;
}

namespace {
// A copy between the GPUs of two sessions (GPUs of two servers, or GPUs a lease holds as a session each): no
// server sees both, so the bytes pass through this process, in pieces, with the calling thread waiting — the
// destination's stream first finishes its earlier work, then each piece is read from the source (its
// session's legacy stream: work the application ordered before, with an event as PyTorch does, is done) and
// written to the destination in the stream.
CUresult copy_between_sessions(CUdeviceptr dst, int dst_device, CUdeviceptr src, int src_device, size_t n,
                               CUstream stream) {
    auto& st = state::get();
    const uint64_t dst_ctx = st.primary_context(dst_device), src_ctx = st.primary_context(src_device);
    {
        context_scope in(dst_ctx);
        if (CUresult rc = stream_done_here(stream); rc != CUDA_SUCCESS) return rc;
    }
    constexpr size_t piece = size_t{64} << 20;
    std::vector<std::byte> bounce(std::min(n, piece));
    for (size_t off = 0; off < n; off += piece) {
        const size_t len = std::min(piece, n - off);
        {
            context_scope in(src_ctx);
            if (CUresult rc = copy_dtoh(bounce.data(), src + off, len, nullptr, mode::sync);
                rc != CUDA_SUCCESS)
                return rc;
        }
        context_scope in(dst_ctx);
        if (CUresult rc = copy_htod(dst + off, bounce.data(), len, stream, mode::sync); rc != CUDA_SUCCESS)
            return rc;
    }
    return CUDA_SUCCESS;
}
}  // namespace

CUresult copy_dtod(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream stream, mode m) {
    VCUDA_REQUIRE_INIT();
    if (n == 0) return CUDA_SUCCESS;
    const bool src_on_device = device_range(src, n), dst_on_device = device_range(dst, n);
    if ((!src_on_device || !dst_on_device) &&
        !(capture_under_way() && stream_captures(stream))) {  // a side in pinned host memory: a host side
        const bool src_here = !src_on_device && in_pinned_host(src, n);
        if (!dst_on_device && in_pinned_host(dst, n))
            return src_here ? copy_local(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), n,
                                         stream)
                            : copy_dtoh(reinterpret_cast<void*>(dst), src, n, stream, mode::sync);
        if (src_here) return copy_htod(dst, reinterpret_cast<const void*>(src), n, stream, m);
    }
    if (m == mode::post && (!dst_on_device || !src_on_device)) return CUDA_ERROR_INVALID_VALUE;
    if (CUresult rc = managed_before_device_access(src, n, false); rc != CUDA_SUCCESS) return rc;
    if (CUresult rc = managed_before_device_access(dst, n, true); rc != CUDA_SUCCESS) return rc;
    auto& st = state::get();
    device_allocation from, to;
    if (st.session_count() > 1 && st.find_allocation(src, n, from) && st.find_allocation(dst, n, to) &&
        st.device(from.device).owner != st.device(to.device).owner)
        return copy_between_sessions(dst, to.device, src, from.device, n, stream);
    return remote(op::copy_dtod, {dst, src, n, stream_arg(stream)}, m);
}

namespace {
// A memset of the application's own pinned memory, which no GPU here reaches (over TCP): done in this process
// once the stream's earlier work is done, as the device would in stream order.
CUresult memset_local(uint64_t dst, size_t pitch, uint32_t value, unsigned elem, size_t width, size_t height,
                      CUstream stream) {
    if (CUresult rc = stream_done_here(stream); rc != CUDA_SUCCESS) return rc;
    for (size_t row = 0; row < height; ++row) {
        auto* p = reinterpret_cast<unsigned char*>(dst + row * pitch);
        for (size_t i = 0; i < width; ++i)
            std::memcpy(p + i * elem, &value, elem);  // little-endian: low bytes
    }
    return CUDA_SUCCESS;
}
}  // namespace

CUresult memset_2d(CUdeviceptr dst, size_t pitch, uint32_t value, unsigned elem, size_t width, size_t height,
                   CUstream stream, mode m) {
    VCUDA_REQUIRE_INIT();
    if (width == 0 || height == 0) return CUDA_SUCCESS;
    if (height > 1 && pitch < width * elem) return CUDA_ERROR_INVALID_VALUE;
    if (m == mode::post && check_stream(stream) != CUDA_SUCCESS) return CUDA_ERROR_INVALID_HANDLE;
    const size_t span = (height - 1) * pitch + width * elem;
    if (CUresult rc = managed_before_device_access(dst, span, true); rc != CUDA_SUCCESS) return rc;
    if (!device_range(dst, span)) {
        // Pinned host memory is the device's to set too (unified addressing): shared pages through the device
        // pointer the server gave them, the process's own pages here.
        host_allocation h;
        if (state::get().find_host(dst, h) && span <= h.size - (dst - h.base)) {
            if (!h.shared()) return memset_local(dst, pitch, value, elem, width, height, stream);
            dst = h.device_ptr + (dst - h.base);
        } else if (m == mode::post && capture_under_way() && stream_captures(stream)) {
            // Recorded, not run: cuDNN captures memsets of placeholder addresses and sets the real ones
            // before its graph runs. The server takes those, and refuses other memory that is not the
            // session's (server/call_context.hpp, memset_range).
        } else {
            static std::atomic<bool> said{false};
            if (!said.exchange(true))
                VCUDA_LOG_WARN(
                    "a memset of [{:#x}, +{}) names memory that is neither the device memory of this "
                    "process's "
                    "vGPUs nor its pinned host memory: CUDA_ERROR_INVALID_VALUE (said once)",
                    dst, span);
            return CUDA_ERROR_INVALID_VALUE;
        }
    }
    return remote(op::memset, {dst, value, elem, width, height, pitch, stream_arg(stream)}, m);
}

namespace {

// Which side a unified-addressing pointer is on.
bool is_device(uint64_t p) {
    device_allocation a;
    return state::get().find_allocation(p, 1, a);
}

}  // namespace

CUresult copy_any(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream stream, mode m) {
    bool dd = is_device(dst), sd = is_device(src);
    if (dd && sd) return copy_dtod(dst, src, n, stream, m);
    if (dd) return copy_htod(dst, reinterpret_cast<const void*>(src), n, stream, m);
    if (sd) return copy_dtoh(reinterpret_cast<void*>(dst), src, n, stream, m);
    if (m == mode::sync) {  // host to host: the copy is ordered after prior work in the stream
        if (CUresult rc = stream_done_here(stream); rc != CUDA_SUCCESS) return rc;
    }
    std::memmove(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), n);
    return CUDA_SUCCESS;
}

// 2D/3D copies: the host side travels packed (rows back to back); the server unpacks into the device
// layout, or packs device rows for us to spread into the caller's pitch. A CUDA array side travels as its
// handle (side kind 2).
CUresult copy_3d(const CUDA_MEMCPY3D& given, CUstream stream, mode m) {
    VCUDA_REQUIRE_INIT();
    CUDA_MEMCPY3D c = given;
    // A host side in managed memory is the device's (client/managed.hpp).
    if (c.srcMemoryType == CU_MEMORYTYPE_HOST && managed_contains(reinterpret_cast<uint64_t>(c.srcHost))) {
        c.srcMemoryType = CU_MEMORYTYPE_DEVICE;
        c.srcDevice = reinterpret_cast<uint64_t>(c.srcHost);
    }
    if (c.dstMemoryType == CU_MEMORYTYPE_HOST && managed_contains(reinterpret_cast<uint64_t>(c.dstHost))) {
        c.dstMemoryType = CU_MEMORYTYPE_DEVICE;
        c.dstDevice = reinterpret_cast<uint64_t>(c.dstHost);
    }
    auto side = [](CUmemorytype t, const void* host, CUdeviceptr dev) -> int {
        if (t == CU_MEMORYTYPE_UNIFIED) return is_device(dev) ? 1 : 0;
        if (t == CU_MEMORYTYPE_DEVICE) return 1;
        if (t == CU_MEMORYTYPE_HOST) return 0;
        if (t == CU_MEMORYTYPE_ARRAY) return 2;  // the server checks the box against the array's extent
        return -1;
    };
    int s = side(c.srcMemoryType, c.srcHost, c.srcDevice), d = side(c.dstMemoryType, c.dstHost, c.dstDevice);
    if (s < 0 || d < 0) return CUDA_ERROR_INVALID_VALUE;
    // A host side in a capture: read or written when the graph runs.
    if ((s == 0 || d == 0) && capture_under_way() && stream_captures(stream))
        return capture_copy(c, stream, "a captured 2D/3D copy");
    if ((s == 2 && !valid_handle(reinterpret_cast<uint64_t>(c.srcArray), handle_kind::array)) ||
        (d == 2 && !valid_handle(reinterpret_cast<uint64_t>(c.dstArray), handle_kind::array)))
        return CUDA_ERROR_INVALID_HANDLE;
    size_t w = c.WidthInBytes, h = c.Height ? c.Height : 1, depth = c.Depth ? c.Depth : 1;
    if (w == 0) return CUDA_SUCCESS;
    size_t spitch = c.srcPitch ? c.srcPitch : w, dpitch = c.dstPitch ? c.dstPitch : w;
    size_t sheight = c.srcHeight ? c.srcHeight : h, dheight = c.dstHeight ? c.dstHeight : h;
    if ((s == 2 && !array_box_fits(reinterpret_cast<uint64_t>(c.srcArray), c.srcXInBytes, c.srcY, c.srcZ, w,
                                   h, depth)) ||
        (d == 2 &&
         !array_box_fits(reinterpret_cast<uint64_t>(c.dstArray), c.dstXInBytes, c.dstY, c.dstZ, w, h, depth)))
        return CUDA_ERROR_INVALID_VALUE;
    // An array's layout is its own: its pitch and height in the descriptor are ignored, as by the driver.
    if ((h > 1 && ((s != 2 && spitch < w + c.srcXInBytes) || (d != 2 && dpitch < w + c.dstXInBytes))))
        return CUDA_ERROR_INVALID_VALUE;
    // The device bytes each side spans, from its first row to the end of its last.
    auto extent = [&](size_t x, size_t y, size_t z, size_t pitch, size_t height) {
        return ((z + depth - 1) * height + y + h - 1) * pitch + x + w;
    };
    if (s == 1)
        if (CUresult rc = managed_before_device_access(
                c.srcDevice, extent(c.srcXInBytes, c.srcY, c.srcZ, spitch, sheight), false);
            rc != CUDA_SUCCESS)
            return rc;
    if (d == 1)
        if (CUresult rc = managed_before_device_access(
                c.dstDevice, extent(c.dstXInBytes, c.dstY, c.dstZ, dpitch, dheight), true);
            rc != CUDA_SUCCESS)
            return rc;
    const char* shost = static_cast<const char*>(
        c.srcMemoryType == CU_MEMORYTYPE_UNIFIED ? reinterpret_cast<void*>(c.srcDevice) : c.srcHost);
    char* dhost = static_cast<char*>(
        c.dstMemoryType == CU_MEMORYTYPE_UNIFIED ? reinterpret_cast<void*>(c.dstDevice) : c.dstHost);
    auto host_row = [&](const char* base, size_t pitch, size_t height, size_t x, size_t y, size_t z,
                        size_t row,
                        size_t slice) { return base + ((z + slice) * height + (y + row)) * pitch + x; };
    // Copies from the device still under way into a host side land first.
    if (s == 0) {
        const char* first = host_row(shost, spitch, sheight, c.srcXInBytes, c.srcY, c.srcZ, 0, 0);
        settle_range(
            first,
            host_row(shost, spitch, sheight, c.srcXInBytes, c.srcY, c.srcZ, h - 1, depth - 1) + w - first);
    }
    if (d == 0) {
        const char* first = host_row(dhost, dpitch, dheight, c.dstXInBytes, c.dstY, c.dstZ, 0, 0);
        settle_range(
            first,
            host_row(dhost, dpitch, dheight, c.dstXInBytes, c.dstY, c.dstZ, h - 1, depth - 1) + w - first);
    }
    if (s == 0 && d == 0) {
        if (m == mode::sync)
            if (CUresult rc = stream_done_here(stream); rc != CUDA_SUCCESS) return rc;
        for (size_t z = 0; z < depth; ++z)
            for (size_t y = 0; y < h; ++y)
                std::memmove(
                    const_cast<char*>(host_row(dhost, dpitch, dheight, c.dstXInBytes, c.dstY, c.dstZ, y, z)),
                    host_row(shost, spitch, sheight, c.srcXInBytes, c.srcY, c.srcZ, y, z), w);
        return CUDA_SUCCESS;
    }
    std::vector<std::byte> packed;
    if (s == 0) {
        packed.resize(w * h * depth);
        for (size_t z = 0; z < depth; ++z)
            for (size_t y = 0; y < h; ++y)
                std::memcpy(&packed[(z * h + y) * w],
                            host_row(shost, spitch, sheight, c.srcXInBytes, c.srcY, c.srcZ, y, z), w);
    }
    call_reply rp;
    CUresult rc;
    {
        lane* l = state::get().remote().this_thread_lane();
        if (!l) return static_cast<CUresult>(connection_lost_result);
        uint64_t args[] = {static_cast<uint64_t>(s),
                           s == 2 ? reinterpret_cast<uint64_t>(c.srcArray) : c.srcDevice,
                           c.srcXInBytes,
                           c.srcY,
                           c.srcZ,
                           spitch,
                           sheight,
                           static_cast<uint64_t>(d),
                           d == 2 ? reinterpret_cast<uint64_t>(c.dstArray) : c.dstDevice,
                           c.dstXInBytes,
                           c.dstY,
                           c.dstZ,
                           dpitch,
                           dheight,
                           w,
                           h,
                           depth,
                           stream_arg(stream)};
        call_request rq;
        rq.operation = op::copy_3d;
        rq.device = current_server_device();
        rq.args = args;
        rq.payload = packed;
        // Copies that return bytes always wait; device-side ones may be queued.
        bool wait = d == 0 || m == mode::sync;
        rc = static_cast<CUresult>(wait ? l->call(rq, rp) : l->post(rq));
    }
    if (rc != CUDA_SUCCESS) return rc;
    if (d == 0) {
        if (rp.payload.size() != w * h * depth) return CUDA_ERROR_UNKNOWN;
        for (size_t z = 0; z < depth; ++z)
            for (size_t y = 0; y < h; ++y)
                std::memcpy(
                    const_cast<char*>(host_row(dhost, dpitch, dheight, c.dstXInBytes, c.dstY, c.dstZ, y, z)),
                    &rp.payload[(z * h + y) * w], w);
    }
    return CUDA_SUCCESS;
}

namespace {

// One side of a 2D/3D copy, as fields of its CUDA_MEMCPY3D.
template <class HostPtr>
struct side_ref {
    CUmemorytype& type;
    HostPtr& host;
    CUdeviceptr& device;
    CUarray& array;
    size_t &x, &y, &z, &pitch, &height;
};

// Where one side of a graph copy is, rewritten as the server must see it: an array or device memory (managed
// memory is the device's) as it is, shared pinned memory by the server's address; `here` set when it is this
// process's own memory (the host pointer then kept).
template <class HostPtr>
CUresult place_side(side_ref<HostPtr> s, size_t w, size_t h, size_t depth, bool& here) {
    here = false;
    if (s.type == CU_MEMORYTYPE_ARRAY) {
        auto id = reinterpret_cast<uint64_t>(s.array);
        return valid_handle(id, handle_kind::array) && array_box_fits(id, s.x, s.y, s.z, w, h, depth)
                   ? CUDA_SUCCESS
                   : CUDA_ERROR_INVALID_VALUE;
    }
    if (s.type != CU_MEMORYTYPE_DEVICE && s.type != CU_MEMORYTYPE_HOST && s.type != CU_MEMORYTYPE_UNIFIED)
        return CUDA_ERROR_INVALID_VALUE;
    const uint64_t p = s.type == CU_MEMORYTYPE_HOST ? reinterpret_cast<uint64_t>(s.host) : s.device;
    const size_t pitch = s.pitch ? s.pitch : w, height = s.height ? s.height : h;
    if (h > 1 && pitch < w + s.x) return CUDA_ERROR_INVALID_VALUE;
    if (managed_contains(p) || is_device(p)) {
        s.type = CU_MEMORYTYPE_DEVICE;
        s.device = p;
        s.host = nullptr;
        return CUDA_SUCCESS;
    }
    // The bytes the side spans, from its first row to the end of its last.
    const size_t first = (s.z * height + s.y) * pitch + s.x;
    const size_t last = ((s.z + depth - 1) * height + s.y + h - 1) * pitch + s.x + w;
    if (uint64_t at = shared_address(reinterpret_cast<const void*>(p + first), last - first)) {
        s.type = CU_MEMORYTYPE_HOST;
        s.host = reinterpret_cast<HostPtr>(at - first);
        s.device = 0;
        return CUDA_SUCCESS;
    }
    host_allocation mine;
    if (s.type == CU_MEMORYTYPE_DEVICE && !state::get().find_host(p, mine))
        return CUDA_SUCCESS;  // no memory of this process: the server's to check
    here = true;
    s.type = CU_MEMORYTYPE_HOST;
    s.host = reinterpret_cast<HostPtr>(p);
    s.device = 0;
    s.pitch = pitch;
    s.height = height;
    return CUDA_SUCCESS;
}

}  // namespace

CUresult graph_copy(CUDA_MEMCPY3D& c, uint64_t& host_copy, const char* name) {
    host_copy = 0;
    const size_t w = c.WidthInBytes, h = c.Height ? c.Height : 1, depth = c.Depth ? c.Depth : 1;
    if (w == 0) return CUDA_ERROR_INVALID_VALUE;
    c.Height = h;
    c.Depth = depth;
    bool src_here = false, dst_here = false;
    side_ref<const void*> src{c.srcMemoryType, c.srcHost, c.srcDevice, c.srcArray, c.srcXInBytes,
                              c.srcY,          c.srcZ,    c.srcPitch,  c.srcHeight};
    side_ref<void*> dst{c.dstMemoryType, c.dstHost, c.dstDevice, c.dstArray, c.dstXInBytes,
                        c.dstY,          c.dstZ,    c.dstPitch,  c.dstHeight};
    if (CUresult rc = place_side(src, w, h, depth, src_here); rc != CUDA_SUCCESS) return rc;
    if (CUresult rc = place_side(dst, w, h, depth, dst_here); rc != CUDA_SUCCESS) return rc;
    if (src_here && dst_here) {
        std::string what = std::string(name) + " (a copy between two host buffers in a graph)";
        return static_cast<CUresult>(unsupported(what.c_str()));
    }
    if (!src_here && !dst_here) return CUDA_SUCCESS;
    host_copy_side side;
    side.to_device = src_here;
    side.base = const_cast<char*>(static_cast<const char*>(src_here ? c.srcHost : c.dstHost));
    side.x = src_here ? c.srcXInBytes : c.dstXInBytes;
    side.y = src_here ? c.srcY : c.dstY;
    side.z = src_here ? c.srcZ : c.dstZ;
    side.pitch = src_here ? c.srcPitch : c.dstPitch;
    side.height = src_here ? c.srcHeight : c.dstHeight;
    side.w = w;
    side.h = h;
    side.depth = depth;
    host_copy = graph_host_copy(side);
    return CUDA_SUCCESS;
}

CUresult capture_copy(const CUDA_MEMCPY3D& given, CUstream stream, const char* name) {
    CUDA_MEMCPY3D c = given;
    uint64_t id = 0;
    if (CUresult rc = graph_copy(c, id, name); rc != CUDA_SUCCESS) return rc;
    const uint64_t params[] = {id};
    CUresult rc = capture_add_node_call(name, stream, static_cast<unsigned>(CU_GRAPH_NODE_TYPE_MEMCPY),
                                        std::as_bytes(std::span(&c, 1)), params)
                      .send_sync();
    if (rc != CUDA_SUCCESS && id) forget_host_function(id);
    return rc;
}

CUDA_MEMCPY3D from_2d(const CUDA_MEMCPY2D& p) {
    CUDA_MEMCPY3D c{};
    c.srcXInBytes = p.srcXInBytes;
    c.srcY = p.srcY;
    c.srcMemoryType = p.srcMemoryType;
    c.srcHost = p.srcHost;
    c.srcDevice = p.srcDevice;
    c.srcArray = p.srcArray;
    c.srcPitch = p.srcPitch;
    c.dstXInBytes = p.dstXInBytes;
    c.dstY = p.dstY;
    c.dstMemoryType = p.dstMemoryType;
    c.dstHost = p.dstHost;
    c.dstDevice = p.dstDevice;
    c.dstArray = p.dstArray;
    c.dstPitch = p.dstPitch;
    c.WidthInBytes = p.WidthInBytes;
    c.Height = p.Height;
    c.Depth = 1;
    return c;
}

}  // namespace vcuda::client
