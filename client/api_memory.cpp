// Device memory (server allocations at the server's real addresses), host memory (the client's own),
// pointer queries (answered from the mirror), copies and sets.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>

#include "client/bulk.hpp"
#include "client/host_register.hpp"
#include "client/parallel_copy.hpp"
#include "client/plain_call.hpp"
#include "client/remote_call.hpp"
#include "client/state.hpp"
#include "client/trace.hpp"
#include "common/log.hpp"

#define VCUDA_API extern "C" __attribute__((visibility("default"))) CUresult

using namespace vcuda;
using namespace vcuda::client;

namespace {

// Host-to-device copies travel in chunks so the server can stage them through reused pinned buffers.
constexpr size_t copy_chunk = 8u << 20;

std::span<const std::byte> bytes(const void* p, size_t n) { return {static_cast<const std::byte*>(p), n}; }

bool device_range(CUdeviceptr p, size_t n) {
    device_allocation a;
    return state::get().find_allocation(p, n, a);
}

uint64_t stream_arg(CUstream s) { return reinterpret_cast<uint64_t>(s); }

CUresult check_stream(CUstream s) { return valid_handle(stream_arg(s), handle_kind::stream) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE; }

// ---------------------------------------------------------------- pinned host memory shared with the server

// Whether pinned allocations are shared with a server on this host: VCUDA_SHARED_HOST=0 turns it off (to
// compare with the copy-over-the-socket path).
bool sharing_enabled() {
    static const bool on = [] {
        const char* v = std::getenv("VCUDA_SHARED_HOST");
        return !v || std::strcmp(v, "0") != 0;
    }();
    return on;
}

// Pinned memory the server created and registered, mapped here at the server's address where that is free
// (then host pointer == device pointer, as unified addressing promises). CUDA_ERROR_NOT_SUPPORTED when the
// server is on another host (or sharing is off): the caller falls back to its own pages.
CUresult shared_host_alloc(host_allocation& h) {
    session& s = state::get().remote();
    if (!s.local() || !sharing_enabled()) return CUDA_ERROR_NOT_SUPPORTED;
    call_reply rp;
    CUresult rc = remote(op::host_alloc, {h.size}, mode::sync, &rp);
    if (rc != CUDA_SUCCESS || rp.outs.size() != 2 || rp.fd < 0) {
        if (rp.fd >= 0) ::close(rp.fd);
        return rc == CUDA_SUCCESS ? CUDA_ERROR_UNKNOWN : rc;
    }
    uint64_t server_addr = rp.outs[0], device_ptr = rp.outs[1];
    void* want = reinterpret_cast<void*>(server_addr);
    void* p = mmap(want, h.size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED_NOREPLACE, rp.fd, 0);
    if (p == MAP_FAILED) p = mmap(nullptr, h.size, PROT_READ | PROT_WRITE, MAP_SHARED, rp.fd, 0);
    ::close(rp.fd);
    if (p == MAP_FAILED) {
        remote(op::host_free, {server_addr}, mode::post);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (p != want)
        VCUDA_LOG_DEBUG("pinned memory mapped at {} (the server's address {} is taken here): host and device pointers differ",
                        p, want);
    h.base = reinterpret_cast<uintptr_t>(p);
    h.server_addr = server_addr;
    h.device_ptr = device_ptr;
    h.owner = &s;
    return CUDA_SUCCESS;
}

void shared_host_free(const host_allocation& h) {
    if (!h.owner->lost()) remote(op::host_free, {h.server_addr}, mode::sync);
}

// The server's address for [p, p+n) when it lies in shared pinned memory of the current device's server, else 0.
uint64_t shared_address(const void* p, size_t n) {
    host_allocation h;
    auto a = reinterpret_cast<uintptr_t>(p);
    if (!state::get().find_host(a, h) || !h.shared() || h.owner != &state::get().remote()) return 0;
    if (n > h.size - (a - h.base)) return 0;
    return h.server_addr + (a - h.base);
}

// ---------------------------------------------------------------- pageable copies through staging slots

// Pageable copies of at least this size to a server on this host go through staging slots: pinned pages shared
// with the server (as cuMemAllocHost's), which the client fills or empties while the GPU reads or writes the
// other slot of the copy. One memcpy here (spread over helper threads: client/parallel_copy.hpp) and none on
// the server, where a frame costs one on each side.
constexpr size_t staged_min = 1u << 20;
constexpr size_t slot_size = 4u << 20;
constexpr size_t slots_per_session = 4;  // two copies at a time; a third thread's copy goes in frames

struct staging_slot {
    host_allocation h;
    bool busy = false;     // a copy is using it
    bool pending = false;  // a marked copy may still read or write it: wait (host_region_wait) before touching it
};

// The slots of each session, made at its first large pageable copy and kept for the process's life (the server
// frees them with the session). Not in a forked child: the pages are shared with the parent.
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
            if (mine.slots.size() < 2) VCUDA_LOG_INFO("no staging slots for pageable copies: they travel in frames");
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
    // server's host memory quota refused; pageable copies then go in frames. False when there were none to free.
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
        VCUDA_LOG_INFO("the host memory quota is reached: staging slots freed for the application's pinned memory");
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

// Slot-sized chunks alternate between the two slots: the next chunk is copied in while the GPU reads this one.
// The last chunk goes as `m` says (sync: the copy is done when the call returns). CUDA_ERROR_NOT_SUPPORTED: no
// slots, the caller sends the bytes in frames.
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
        if (CUresult rc = slot_ready(s); rc != CUDA_SUCCESS) return rc;  // its last copy may be another's upload
        s.pending = true;
        return remote(op::copy_dtoh_shared, {s.h.server_addr, src + k * slot_size, length(k), stream_arg(stream), 1},
                      mode::post);
    };
    CUresult rc = issue(0);
    for (size_t k = 0; k < chunks && rc == CUDA_SUCCESS; ++k) {
        if (k + 1 < chunks && (rc = issue(k + 1)) != CUDA_SUCCESS) break;
        staging_slot& s = *slot[k % 2];
        if ((rc = slot_ready(s)) != CUDA_SUCCESS) break;
        parallel_copy(static_cast<char*>(dst) + k * slot_size, reinterpret_cast<const void*>(s.h.base), length(k));
    }
    staging().give_back(slot[0], slot[1]);
    return rc;
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
CUresult striped_htod(bulk_link& link, CUdeviceptr dst, const void* src, size_t n, CUstream stream, mode m) {
    lane* l = state::get().remote().this_thread_lane();
    if (!l) return static_cast<CUresult>(connection_lost_result);
    auto t = striped_transfer(link, src, n);
    striped_call c(op::copy_htod_striped, dst, t, stream, link.set());
    std::unique_lock order(link.order());
    const std::function<void()> queue = [&] {
        link.queue(t);
        order.unlock();
    };
    c.rq.after_send = &queue;
    call_reply rp;
    int rc = m == mode::post ? l->post(c.rq) : l->call(c.rq, rp);
    link.wait_written(t);  // a failed write fails the copy on the server too: its reply or the next one says so
    if (rc == CUDA_ERROR_DEVICE_UNAVAILABLE) link.close("the server closed them");
    return static_cast<CUresult>(rc);
}

// The chunks land in `dst` at their offsets, read by the bulk connections; the call returns once the reply and
// every chunk came.
CUresult striped_dtoh(bulk_link& link, void* dst, CUdeviceptr src, size_t n, CUstream stream) {
    lane* l = state::get().remote().this_thread_lane();
    if (!l) return static_cast<CUresult>(connection_lost_result);
    auto t = striped_transfer(link, dst, n);
    striped_call c(op::copy_dtoh_striped, src, t, stream, link.set());
    link.expect(t);
    call_reply rp;
    int rc = l->call(c.rq, rp);
    bool complete = link.finish(t, rc == 0);
    if (rc == 0 && !complete) return CUDA_ERROR_DEVICE_UNAVAILABLE;  // the bulk connections failed (logged)
    if (rc == CUDA_ERROR_DEVICE_UNAVAILABLE) link.close("the server closed them");
    return static_cast<CUresult>(rc);
}

// Host to device: from shared pinned memory the server copies straight from the pages; large copies over TCP go
// striped, large pageable ones to a server on this host through staging slots; otherwise every chunk but the
// last is queued and the last waits for the server when `m` is sync, so the copy is enqueued on the GPU before
// the call returns, as with the real driver.
CUresult copy_htod(CUdeviceptr dst, const void* src, size_t n, CUstream stream, mode m) {
    VCUDA_REQUIRE_INIT();
    if (n == 0) return CUDA_SUCCESS;
    if (!src) return CUDA_ERROR_INVALID_VALUE;
    if (m == mode::post && !device_range(dst, n)) return CUDA_ERROR_INVALID_VALUE;
    if (uint64_t from = shared_address(src, n)) return remote(op::copy_htod_shared, {dst, from, n, stream_arg(stream)}, m);
    if (device_range(dst, n)) {  // else the lane's copy gets the server's refusal
        if (auto link = striping(n)) return striped_htod(*link, dst, src, n, stream, m);
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
// Otherwise the reply's payload (or a striped copy's chunks, or staging slots) fills the caller's buffer, and the
// asynchronous form also waits, so the bytes are there whenever any later call synchronizes with the stream.
CUresult copy_dtoh(void* dst, CUdeviceptr src, size_t n, CUstream stream, mode m = mode::sync) {
    VCUDA_REQUIRE_INIT();
    if (n == 0) return CUDA_SUCCESS;
    if (!dst) return CUDA_ERROR_INVALID_VALUE;
    if (uint64_t to = shared_address(dst, n)) {
        if (m == mode::post && (!device_range(src, n) || check_stream(stream) != CUDA_SUCCESS)) return CUDA_ERROR_INVALID_VALUE;
        return remote(op::copy_dtoh_shared, {to, src, n, stream_arg(stream)}, m);
    }
    if (device_range(src, n)) {
        if (auto link = striping(n)) return striped_dtoh(*link, dst, src, n, stream);
        if (stageable(n))
            if (CUresult rc = staged_dtoh(dst, src, n, stream); rc != CUDA_ERROR_NOT_SUPPORTED) return rc;
    }
    call_reply rp;
    rp.payload_dst = static_cast<std::byte*>(dst);
    rp.payload_cap = n;
    CUresult rc = remote(op::copy_dtoh, {src, n, stream_arg(stream)}, mode::sync, &rp);
    if (rc == CUDA_SUCCESS && !rp.payload.empty()) return CUDA_ERROR_UNKNOWN;  // size mismatch from the server
    return rc;
}

CUresult copy_dtod(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream stream, mode m) {
    VCUDA_REQUIRE_INIT();
    if (n == 0) return CUDA_SUCCESS;
    if (m == mode::post && (!device_range(dst, n) || !device_range(src, n))) return CUDA_ERROR_INVALID_VALUE;
    return remote(op::copy_dtod, {dst, src, n, stream_arg(stream)}, m);
}

CUresult memset_2d(CUdeviceptr dst, size_t pitch, uint32_t value, unsigned elem, size_t width, size_t height,
                   CUstream stream, mode m) {
    VCUDA_REQUIRE_INIT();
    if (width == 0 || height == 0) return CUDA_SUCCESS;
    if (height > 1 && pitch < width * elem) return CUDA_ERROR_INVALID_VALUE;
    if (m == mode::post) {
        if (check_stream(stream) != CUDA_SUCCESS) return CUDA_ERROR_INVALID_HANDLE;
        size_t span = (height - 1) * pitch + width * elem;
        if (!device_range(dst, span)) return CUDA_ERROR_INVALID_VALUE;
    }
    return remote(op::memset, {dst, value, elem, width, height, pitch, stream_arg(stream)}, m);
}

// Which side a unified-addressing pointer is on.
bool is_device(uint64_t p) {
    device_allocation a;
    return state::get().find_allocation(p, 1, a);
}

CUresult copy_any(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream stream, mode m) {
    bool dd = is_device(dst), sd = is_device(src);
    if (dd && sd) return copy_dtod(dst, src, n, stream, m);
    if (dd) return copy_htod(dst, reinterpret_cast<const void*>(src), n, stream, m);
    if (sd) return copy_dtoh(reinterpret_cast<void*>(dst), src, n, stream, m);
    if (m == mode::sync) {  // host to host: the copy is ordered after prior work in the stream
        if (CUresult rc = remote(op::cuStreamSynchronize, {stream_arg(stream)}); rc != CUDA_SUCCESS) return rc;
    }
    std::memmove(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), n);
    return CUDA_SUCCESS;
}

// 2D/3D copies: the host side travels packed (rows back to back); the server unpacks into the device
// layout, or packs device rows for us to spread into the caller's pitch.
CUresult copy_3d(const CUDA_MEMCPY3D& c, CUstream stream, mode m) {
    VCUDA_REQUIRE_INIT();
    auto side = [](CUmemorytype t, const void* host, CUdeviceptr dev) -> int {
        if (t == CU_MEMORYTYPE_UNIFIED) return is_device(dev) ? 1 : 0;
        if (t == CU_MEMORYTYPE_DEVICE) return 1;
        if (t == CU_MEMORYTYPE_HOST) return 0;
        return -1;  // arrays
    };
    int s = side(c.srcMemoryType, c.srcHost, c.srcDevice), d = side(c.dstMemoryType, c.dstHost, c.dstDevice);
    if (s < 0 || d < 0) return static_cast<CUresult>(unsupported("cuMemcpy2D/3D with CUDA arrays"));
    size_t w = c.WidthInBytes, h = c.Height ? c.Height : 1, depth = c.Depth ? c.Depth : 1;
    if (w == 0) return CUDA_SUCCESS;
    size_t spitch = c.srcPitch ? c.srcPitch : w, dpitch = c.dstPitch ? c.dstPitch : w;
    size_t sheight = c.srcHeight ? c.srcHeight : h, dheight = c.dstHeight ? c.dstHeight : h;
    if ((h > 1 && (spitch < w + c.srcXInBytes || dpitch < w + c.dstXInBytes))) return CUDA_ERROR_INVALID_VALUE;
    const char* shost = static_cast<const char*>(c.srcMemoryType == CU_MEMORYTYPE_UNIFIED ? reinterpret_cast<void*>(c.srcDevice) : c.srcHost);
    char* dhost = static_cast<char*>(c.dstMemoryType == CU_MEMORYTYPE_UNIFIED ? reinterpret_cast<void*>(c.dstDevice) : c.dstHost);
    auto host_row = [&](const char* base, size_t pitch, size_t height, size_t x, size_t y, size_t z, size_t row, size_t slice) {
        return base + ((z + slice) * height + (y + row)) * pitch + x;
    };
    if (s == 0 && d == 0) {
        if (m == mode::sync)
            if (CUresult rc = remote(op::cuStreamSynchronize, {stream_arg(stream)}); rc != CUDA_SUCCESS) return rc;
        for (size_t z = 0; z < depth; ++z)
            for (size_t y = 0; y < h; ++y)
                std::memmove(const_cast<char*>(host_row(dhost, dpitch, dheight, c.dstXInBytes, c.dstY, c.dstZ, y, z)),
                             host_row(shost, spitch, sheight, c.srcXInBytes, c.srcY, c.srcZ, y, z), w);
        return CUDA_SUCCESS;
    }
    std::vector<std::byte> packed;
    if (s == 0) {
        packed.resize(w * h * depth);
        for (size_t z = 0; z < depth; ++z)
            for (size_t y = 0; y < h; ++y)
                std::memcpy(&packed[(z * h + y) * w], host_row(shost, spitch, sheight, c.srcXInBytes, c.srcY, c.srcZ, y, z), w);
    }
    call_reply rp;
    CUresult rc;
    {
        lane* l = state::get().remote().this_thread_lane();
        if (!l) return static_cast<CUresult>(connection_lost_result);
        uint64_t args[] = {static_cast<uint64_t>(s), c.srcDevice, c.srcXInBytes, c.srcY, c.srcZ, spitch, sheight,
                           static_cast<uint64_t>(d), c.dstDevice, c.dstXInBytes, c.dstY, c.dstZ, dpitch, dheight,
                           w, h, depth, stream_arg(stream)};
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
                std::memcpy(const_cast<char*>(host_row(dhost, dpitch, dheight, c.dstXInBytes, c.dstY, c.dstZ, y, z)),
                            &rp.payload[(z * h + y) * w], w);
    }
    return CUDA_SUCCESS;
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

}  // namespace

// ---------------------------------------------------------------- device memory

VCUDA_API cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) noexcept {
    VCUDA_TRACE_HOOK(cuMemAlloc_v2, dptr, bytesize);
    VCUDA_REQUIRE_INIT();
    if (!dptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
    int d = current_device();
    if (d < 0) return CUDA_ERROR_INVALID_CONTEXT;
    call_reply rp;
    CUresult rc = remote(op::mem_alloc, {bytesize}, mode::sync, &rp);
    if (rc != CUDA_SUCCESS) return rc;
    if (rp.outs.size() != 1) return CUDA_ERROR_UNKNOWN;
    *dptr = rp.outs[0];
    state::get().add_allocation(*dptr, bytesize, d);
    state::get().record(op::mem_alloc, {bytesize}, *dptr);
    return CUDA_SUCCESS;
}

VCUDA_API cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pitch, size_t width, size_t height, unsigned int elem) noexcept {
    VCUDA_TRACE_HOOK(cuMemAllocPitch_v2, dptr, pitch, width, height, elem);
    VCUDA_REQUIRE_INIT();
    if (!dptr || !pitch || width == 0 || height == 0 || (elem != 4 && elem != 8 && elem != 16))
        return CUDA_ERROR_INVALID_VALUE;
    int d = current_device();
    if (d < 0) return CUDA_ERROR_INVALID_CONTEXT;
    call_reply rp;
    CUresult rc = remote(op::mem_alloc_pitch, {width, height, elem}, mode::sync, &rp);
    if (rc != CUDA_SUCCESS) return rc;
    if (rp.outs.size() != 2) return CUDA_ERROR_UNKNOWN;
    *dptr = rp.outs[0];
    *pitch = rp.outs[1];
    state::get().add_allocation(*dptr, *pitch * height, d);
    state::get().record(op::mem_alloc_pitch, {width, height, elem}, *dptr);
    return CUDA_SUCCESS;
}

VCUDA_API cuMemFree_v2(CUdeviceptr dptr) noexcept {
    VCUDA_TRACE_HOOK(cuMemFree_v2, dptr);
    VCUDA_REQUIRE_INIT();
    if (dptr == 0) return CUDA_SUCCESS;
    CUresult rc = remote(op::mem_free, {dptr});
    if (rc == CUDA_SUCCESS) {
        device_allocation a;
        state::get().remove_allocation(dptr, a);
        state::get().record(op::mem_free, {dptr});
    }
    return rc;
}

VCUDA_API cuMemGetInfo_v2(size_t* free, size_t* total) noexcept {
    VCUDA_TRACE_HOOK(cuMemGetInfo_v2, free, total);
    VCUDA_REQUIRE_INIT();
    if (!free || !total) return CUDA_ERROR_INVALID_VALUE;
    call_reply rp;
    CUresult rc = remote(op::mem_get_info, {}, mode::sync, &rp);
    if (rc != CUDA_SUCCESS) return rc;
    if (rp.outs.size() != 2) return CUDA_ERROR_UNKNOWN;
    *free = rp.outs[0];
    *total = rp.outs[1];
    return CUDA_SUCCESS;
}

VCUDA_API cuMemGetAddressRange_v2(CUdeviceptr* base, size_t* size, CUdeviceptr dptr) noexcept {
    VCUDA_TRACE_HOOK(cuMemGetAddressRange_v2, base, size, dptr);
    VCUDA_REQUIRE_INIT();
    device_allocation a;
    if (!state::get().find_allocation(dptr, 1, a)) return CUDA_ERROR_NOT_FOUND;
    if (base) *base = a.base;
    if (size) *size = a.size;
    return CUDA_SUCCESS;
}

// ---------------------------------------------------------------- pointer attributes

namespace {
CUresult pointer_attribute(void* data, CUpointer_attribute attr, CUdeviceptr ptr) {
    auto& st = state::get();
    device_allocation a;
    host_allocation h;
    bool dev = st.find_allocation(ptr, 1, a);
    bool host = !dev && st.find_host(ptr, h);
    if (!dev && !host) return CUDA_ERROR_INVALID_VALUE;
    int device = dev ? a.device : 0;
    switch (attr) {
        case CU_POINTER_ATTRIBUTE_CONTEXT:
            *static_cast<CUcontext*>(data) = reinterpret_cast<CUcontext>(st.primary_context(device));
            return CUDA_SUCCESS;
        case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
            *static_cast<unsigned*>(data) = dev ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST;
            return CUDA_SUCCESS;
        case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
            if (!dev && !h.shared()) return CUDA_ERROR_INVALID_VALUE;  // this process's own pages: the GPU cannot reach them
            *static_cast<CUdeviceptr*>(data) = dev ? ptr : h.device_ptr + (ptr - h.base);
            return CUDA_SUCCESS;
        case CU_POINTER_ATTRIBUTE_HOST_POINTER:
            if (dev) return CUDA_ERROR_INVALID_VALUE;
            *static_cast<void**>(data) = reinterpret_cast<void*>(ptr);
            return CUDA_SUCCESS;
        case CU_POINTER_ATTRIBUTE_IS_MANAGED:
            *static_cast<unsigned*>(data) = 0;
            return CUDA_SUCCESS;
        case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
            *static_cast<int*>(data) = device;
            return CUDA_SUCCESS;
        case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
            *static_cast<CUdeviceptr*>(data) = dev ? a.base : h.base;
            return CUDA_SUCCESS;
        case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
            *static_cast<size_t*>(data) = dev ? a.size : h.size;
            return CUDA_SUCCESS;
        case CU_POINTER_ATTRIBUTE_MAPPED:
            *static_cast<unsigned*>(data) = 1;
            return CUDA_SUCCESS;
        case CU_POINTER_ATTRIBUTE_BUFFER_ID:
            *static_cast<unsigned long long*>(data) = dev ? a.base : h.base;
            return CUDA_SUCCESS;
        case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS:
        case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
        case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
        case CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE:
        case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS:
            *static_cast<unsigned*>(data) = 0;
            return CUDA_SUCCESS;
        case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
            *static_cast<void**>(data) = nullptr;
            return CUDA_SUCCESS;
        default: return CUDA_ERROR_INVALID_VALUE;
    }
}
}  // namespace

VCUDA_API cuPointerGetAttribute(void* data, CUpointer_attribute attr, CUdeviceptr ptr) noexcept {
    VCUDA_TRACE_HOOK(cuPointerGetAttribute, data, attr, ptr);
    VCUDA_REQUIRE_INIT();
    if (!data) return CUDA_ERROR_INVALID_VALUE;
    return pointer_attribute(data, attr, ptr);
}

VCUDA_API cuPointerGetAttributes(unsigned int n, CUpointer_attribute* attrs, void** data, CUdeviceptr ptr) noexcept {
    VCUDA_TRACE_HOOK(cuPointerGetAttributes, n, attrs, data, ptr);
    VCUDA_REQUIRE_INIT();
    if (!attrs || !data) return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < n; ++i) {
        if (!data[i]) continue;
        if (pointer_attribute(data[i], attrs[i], ptr) != CUDA_SUCCESS) {
            // Unknown memory: the driver reports it as unregistered instead of failing the whole query.
            if (attrs[i] == CU_POINTER_ATTRIBUTE_MEMORY_TYPE) *static_cast<unsigned*>(data[i]) = 0;
            else if (attrs[i] == CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL) *static_cast<int*>(data[i]) = -2;
            else if (attrs[i] == CU_POINTER_ATTRIBUTE_CONTEXT || attrs[i] == CU_POINTER_ATTRIBUTE_HOST_POINTER ||
                     attrs[i] == CU_POINTER_ATTRIBUTE_DEVICE_POINTER)
                *static_cast<void**>(data[i]) = nullptr;
        }
    }
    return CUDA_SUCCESS;
}

// ---------------------------------------------------------------- host memory: the client's own pages

VCUDA_API cuMemHostAlloc(void** pp, size_t bytesize, unsigned int flags) noexcept {
    VCUDA_TRACE_HOOK(cuMemHostAlloc, pp, bytesize, flags);
    VCUDA_REQUIRE_INIT();
    if (!pp || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
    if (flags & ~(CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED))
        return CUDA_ERROR_INVALID_VALUE;
    host_allocation h;
    h.size = bytesize;
    h.flags = flags;
    CUresult rc = shared_host_alloc(h);
    if (rc == CUDA_ERROR_OUT_OF_MEMORY && staging().release_for_application()) rc = shared_host_alloc(h);
    if (rc != CUDA_ERROR_NOT_SUPPORTED) {
        if (rc != CUDA_SUCCESS) return rc;
    } else {  // a server on another host: this process's own pages, copied over the socket
        void* p = mmap(nullptr, bytesize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
        mlock(p, bytesize);  // page-locked where the system allows it; not fatal when it does not
        h.base = reinterpret_cast<uintptr_t>(p);
    }
    state::get().add_host(h);
    *pp = reinterpret_cast<void*>(h.base);
    return CUDA_SUCCESS;
}

VCUDA_API cuMemAllocHost_v2(void** pp, size_t bytesize) noexcept {
    VCUDA_TRACE_HOOK(cuMemAllocHost_v2, pp, bytesize);
    return cuMemHostAlloc(pp, bytesize, 0);
}

VCUDA_API cuMemFreeHost(void* p) noexcept {
    VCUDA_TRACE_HOOK(cuMemFreeHost, p);
    VCUDA_REQUIRE_INIT();
    host_allocation h;
    if (!p || !state::get().find_host(reinterpret_cast<uintptr_t>(p), h) || h.registered || h.base != reinterpret_cast<uintptr_t>(p))
        return CUDA_ERROR_INVALID_VALUE;
    state::get().remove_host(h.base, h);
    if (h.shared()) shared_host_free(h);
    munmap(p, h.size);
    return CUDA_SUCCESS;
}

VCUDA_API cuMemHostRegister_v2(void* p, size_t bytesize, unsigned int flags) noexcept {
    VCUDA_TRACE_HOOK(cuMemHostRegister_v2, p, bytesize, flags);
    VCUDA_REQUIRE_INIT();
    if (!p || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
    if (flags & ~(CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_IOMEMORY |
                  CU_MEMHOSTREGISTER_READ_ONLY))
        return CUDA_ERROR_INVALID_VALUE;
    if (flags & CU_MEMHOSTREGISTER_IOMEMORY)  // device memory of a third party (PCIe BARs): not this process's pages
        return static_cast<CUresult>(unsupported("cuMemHostRegister with CU_MEMHOSTREGISTER_IOMEMORY"));
    const auto a = reinterpret_cast<uintptr_t>(p);
    uintptr_t end = 0;
    if (__builtin_add_overflow(a, bytesize, &end)) return CUDA_ERROR_INVALID_VALUE;
    // DEVICEMAP moves whole pages (client/host_register.cpp): no other host memory of ours may share them.
    const bool mapped = flags & CU_MEMHOSTREGISTER_DEVICEMAP;
    const uintptr_t lo = mapped ? a & ~uintptr_t{4095} : a, hi = mapped ? (end + 4095) & ~uintptr_t{4095} : end;
    if (state::get().host_overlaps(lo, hi)) return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    host_allocation r;
    r.base = a;
    r.size = bytesize;
    r.flags = flags;
    r.registered = true;
    // PORTABLE and READ_ONLY change nothing here: one context per device, and the GPU only reads what it is given.
    if (mapped)
        if (CUresult rc = share_registered_range(p, bytesize, r); rc != CUDA_SUCCESS) return rc;
    state::get().add_host(r);
    return CUDA_SUCCESS;
}

VCUDA_API cuMemHostUnregister(void* p) noexcept {
    VCUDA_TRACE_HOOK(cuMemHostUnregister, p);
    VCUDA_REQUIRE_INIT();
    host_allocation h;
    if (!p || !state::get().find_host(reinterpret_cast<uintptr_t>(p), h) || !h.registered || h.base != reinterpret_cast<uintptr_t>(p))
        return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
    state::get().remove_host(h.base, h);
    unshare_registered_range(h);
    return CUDA_SUCCESS;
}

VCUDA_API cuMemHostGetFlags(unsigned int* flags, void* p) noexcept {
    VCUDA_TRACE_HOOK(cuMemHostGetFlags, flags, p);
    VCUDA_REQUIRE_INIT();
    host_allocation h;
    if (!flags || !state::get().find_host(reinterpret_cast<uintptr_t>(p), h)) return CUDA_ERROR_INVALID_VALUE;
    *flags = h.flags;
    return CUDA_SUCCESS;
}

VCUDA_API cuMemHostGetDevicePointer_v2(CUdeviceptr* pdptr, void* p, unsigned int Flags) noexcept {
    VCUDA_TRACE_HOOK(cuMemHostGetDevicePointer_v2, pdptr, p, Flags);
    VCUDA_REQUIRE_INIT();
    if (!pdptr || Flags != 0) return CUDA_ERROR_INVALID_VALUE;
    host_allocation h;
    if (!state::get().find_host(reinterpret_cast<uintptr_t>(p), h)) return CUDA_ERROR_INVALID_VALUE;
    if (!h.shared())  // the GPU is on another host: it cannot address this process's pages
        return static_cast<CUresult>(
            unsupported("cuMemHostGetDevicePointer (mapped host memory needs a server on this host, over a Unix socket)"));
    *pdptr = h.device_ptr + (reinterpret_cast<uintptr_t>(p) - h.base);
    return CUDA_SUCCESS;
}

// ---------------------------------------------------------------- copies

VCUDA_API cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t n) noexcept {
    VCUDA_TRACE_HOOK(cuMemcpyHtoD_v2, dst, src, n);
    return copy_htod(dst, src, n, nullptr, mode::sync);
}
VCUDA_API cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, size_t n) noexcept {
    VCUDA_TRACE_HOOK(cuMemcpyDtoH_v2, dst, src, n);
    return copy_dtoh(dst, src, n, nullptr);
}
VCUDA_API cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n) noexcept {
    VCUDA_TRACE_HOOK(cuMemcpyDtoD_v2, dst, src, n);
    return copy_dtod(dst, src, n, nullptr, mode::sync);
}
VCUDA_API cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t n, CUstream s) noexcept {
    VCUDA_TRACE_HOOK(cuMemcpyHtoDAsync_v2, dst, src, n, s);
    if (check_stream(s) != CUDA_SUCCESS) return CUDA_ERROR_INVALID_HANDLE;
    return copy_htod(dst, src, n, s, mode::post);
}
VCUDA_API cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t n, CUstream s) noexcept {
    VCUDA_TRACE_HOOK(cuMemcpyDtoHAsync_v2, dst, src, n, s);
    if (check_stream(s) != CUDA_SUCCESS) return CUDA_ERROR_INVALID_HANDLE;
    return copy_dtoh(dst, src, n, s, mode::post);
}
VCUDA_API cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) noexcept {
    VCUDA_TRACE_HOOK(cuMemcpyDtoDAsync_v2, dst, src, n, s);
    if (check_stream(s) != CUDA_SUCCESS) return CUDA_ERROR_INVALID_HANDLE;
    return copy_dtod(dst, src, n, s, mode::post);
}
VCUDA_API cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n) noexcept {
    VCUDA_TRACE_HOOK(cuMemcpy, dst, src, n);
    VCUDA_REQUIRE_INIT();
    return copy_any(dst, src, n, nullptr, mode::sync);
}
VCUDA_API cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) noexcept {
    VCUDA_TRACE_HOOK(cuMemcpyAsync, dst, src, n, s);
    VCUDA_REQUIRE_INIT();
    if (check_stream(s) != CUDA_SUCCESS) return CUDA_ERROR_INVALID_HANDLE;
    return copy_any(dst, src, n, s, mode::post);
}
VCUDA_API cuMemcpy2D_v2(const CUDA_MEMCPY2D* p) noexcept {
    VCUDA_TRACE_HOOK(cuMemcpy2D_v2, p);
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    return copy_3d(from_2d(*p), nullptr, mode::sync);
}
VCUDA_API cuMemcpy2DUnaligned_v2(const CUDA_MEMCPY2D* p) noexcept {
    VCUDA_TRACE_HOOK(cuMemcpy2DUnaligned_v2, p);
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    return copy_3d(from_2d(*p), nullptr, mode::sync);
}
VCUDA_API cuMemcpy2DAsync_v2(const CUDA_MEMCPY2D* p, CUstream s) noexcept {
    VCUDA_TRACE_HOOK(cuMemcpy2DAsync_v2, p, s);
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    if (check_stream(s) != CUDA_SUCCESS) return CUDA_ERROR_INVALID_HANDLE;
    return copy_3d(from_2d(*p), s, mode::post);
}
VCUDA_API cuMemcpy3D_v2(const CUDA_MEMCPY3D* p) noexcept {
    VCUDA_TRACE_HOOK(cuMemcpy3D_v2, p);
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    return copy_3d(*p, nullptr, mode::sync);
}
VCUDA_API cuMemcpy3DAsync_v2(const CUDA_MEMCPY3D* p, CUstream s) noexcept {
    VCUDA_TRACE_HOOK(cuMemcpy3DAsync_v2, p, s);
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    if (check_stream(s) != CUDA_SUCCESS) return CUDA_ERROR_INVALID_HANDLE;
    return copy_3d(*p, s, mode::post);
}

// ---------------------------------------------------------------- sets

VCUDA_API cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n) noexcept {
    VCUDA_TRACE_HOOK(cuMemsetD8_v2, d, v, n);
    return memset_2d(d, n, v, 1, n, 1, nullptr, mode::sync);
}
VCUDA_API cuMemsetD16_v2(CUdeviceptr d, unsigned short v, size_t n) noexcept {
    VCUDA_TRACE_HOOK(cuMemsetD16_v2, d, v, n);
    return memset_2d(d, n * 2, v, 2, n, 1, nullptr, mode::sync);
}
VCUDA_API cuMemsetD32_v2(CUdeviceptr d, unsigned int v, size_t n) noexcept {
    VCUDA_TRACE_HOOK(cuMemsetD32_v2, d, v, n);
    return memset_2d(d, n * 4, v, 4, n, 1, nullptr, mode::sync);
}
VCUDA_API cuMemsetD2D8_v2(CUdeviceptr d, size_t pitch, unsigned char v, size_t w, size_t h) noexcept {
    VCUDA_TRACE_HOOK(cuMemsetD2D8_v2, d, pitch, v, w, h);
    return memset_2d(d, pitch, v, 1, w, h, nullptr, mode::sync);
}
VCUDA_API cuMemsetD2D16_v2(CUdeviceptr d, size_t pitch, unsigned short v, size_t w, size_t h) noexcept {
    VCUDA_TRACE_HOOK(cuMemsetD2D16_v2, d, pitch, v, w, h);
    return memset_2d(d, pitch, v, 2, w, h, nullptr, mode::sync);
}
VCUDA_API cuMemsetD2D32_v2(CUdeviceptr d, size_t pitch, unsigned int v, size_t w, size_t h) noexcept {
    VCUDA_TRACE_HOOK(cuMemsetD2D32_v2, d, pitch, v, w, h);
    return memset_2d(d, pitch, v, 4, w, h, nullptr, mode::sync);
}
VCUDA_API cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, CUstream s) noexcept {
    VCUDA_TRACE_HOOK(cuMemsetD8Async, d, v, n, s);
    return memset_2d(d, n, v, 1, n, 1, s, mode::post);
}
VCUDA_API cuMemsetD16Async(CUdeviceptr d, unsigned short v, size_t n, CUstream s) noexcept {
    VCUDA_TRACE_HOOK(cuMemsetD16Async, d, v, n, s);
    return memset_2d(d, n * 2, v, 2, n, 1, s, mode::post);
}
VCUDA_API cuMemsetD32Async(CUdeviceptr d, unsigned int v, size_t n, CUstream s) noexcept {
    VCUDA_TRACE_HOOK(cuMemsetD32Async, d, v, n, s);
    return memset_2d(d, n * 4, v, 4, n, 1, s, mode::post);
}
VCUDA_API cuMemsetD2D8Async(CUdeviceptr d, size_t pitch, unsigned char v, size_t w, size_t h,
                            CUstream s) noexcept {
    VCUDA_TRACE_HOOK(cuMemsetD2D8Async, d, pitch, v, w, h, s);
    return memset_2d(d, pitch, v, 1, w, h, s, mode::post);
}
VCUDA_API cuMemsetD2D16Async(CUdeviceptr d, size_t pitch, unsigned short v, size_t w, size_t h,
                             CUstream s) noexcept {
    VCUDA_TRACE_HOOK(cuMemsetD2D16Async, d, pitch, v, w, h, s);
    return memset_2d(d, pitch, v, 2, w, h, s, mode::post);
}
VCUDA_API cuMemsetD2D32Async(CUdeviceptr d, size_t pitch, unsigned int v, size_t w, size_t h,
                             CUstream s) noexcept {
    VCUDA_TRACE_HOOK(cuMemsetD2D32Async, d, pitch, v, w, h, s);
    return memset_2d(d, pitch, v, 4, w, h, s, mode::post);
}
