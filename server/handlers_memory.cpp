// Hand-written ops for device memory, copies and sets. Every device range is checked against the session's
// own allocations before the driver sees it.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common/log.hpp"
#include "server/call_context.hpp"
#include "server/handlers_array.hpp"
#include "server/handlers_ipc.hpp"
#include "server/handlers_memory.hpp"
#include "server_ops.hpp"

namespace vcuda::server {

namespace {

CUresult current_memory(call_context& cx, device_memory*& mem) {
    int d = cx.device_index();
    if (d < 0 || static_cast<size_t>(d) >= cx.sess.device_count())
        return cx.fail(CUDA_ERROR_INVALID_CONTEXT, "no current context");
    mem = &cx.sess.memory(d);
    return CUDA_SUCCESS;
}

// Frees `p`, an allocation (cuMemAlloc) of the current device's memory, and withdraws its IPC handle; the
// caller has made sure that nothing in flight still uses it. The allocator's answer when `p` is none.
CUresult free_device_allocation(call_context& cx, device_memory& mem, CUdeviceptr p) {
    std::lock_guard lock(cx.sess.mu);
    cx.sess.settle_stream_frees(false);
    if (cx.sess.pools.freed_pending(p)) return CUDA_ERROR_INVALID_VALUE;  // freed already, in stream order
    CUresult rc = mem.release(p);
    if (rc != CUDA_SUCCESS) return rc;
    cx.sess.pools.erase(p);  // a default pool's allocation (server/handlers_pool.cpp)
    withdraw_memory_export(cx.sess, p);
    return CUDA_SUCCESS;
}

}  // namespace

void withdraw_memory_export(session& s, CUdeviceptr p) {
    if (auto it = s.ipc_state.memory_exports.find(p); it != s.ipc_state.memory_exports.end()) {
        if (s.ipc()) s.ipc()->withdraw(it->second, s.id());
        s.ipc_state.memory_exports.erase(it);
    }
}

CUresult handle_mem_alloc(call_context& cx, const mem_alloc_args& a) {
    device_memory* mem;
    if (CUresult rc = current_memory(cx, mem); rc != CUDA_SUCCESS) return rc;
    CUdeviceptr p = 0;
    CUresult rc;
    {
        std::lock_guard lock(cx.sess.mu);
        rc = mem->allocate(a.bytes, p);
    }
    if (rc == CUDA_ERROR_OUT_OF_MEMORY && mem->quota())
        return cx.fail(
            rc, "allocation of " + std::to_string(a.bytes) + " bytes exceeds the session's memory quota");
    if (rc != CUDA_SUCCESS) return rc;
    cx.out(p);
    return CUDA_SUCCESS;
}

CUresult handle_mem_alloc_pitch(call_context& cx, const mem_alloc_pitch_args& a) {
    const uint64_t width = a.width, height = a.height, elem = a.elem;
    if (!width || !height || (elem != 4 && elem != 8 && elem != 16) || width > (1ull << 40) ||
        height > (1ull << 40))
        return CUDA_ERROR_INVALID_VALUE;
    // The pitch the real driver would choose for this row width, asked of it with a one-row allocation.
    size_t pitch = (width + 511) / 512 * 512;
    CUdeviceptr probe = 0;
    size_t real_pitch = 0;
    if (cx.drv().cuMemAllocPitch_v2 &&
        cx.drv().cuMemAllocPitch_v2(&probe, &real_pitch, width, 1, elem) == CUDA_SUCCESS) {
        cx.drv().cuMemFree_v2(probe);
        pitch = real_pitch;
    }
    uint64_t total;
    if (!mul_add(pitch, height, 0, total)) return CUDA_ERROR_INVALID_VALUE;
    device_memory* mem;
    if (CUresult rc = current_memory(cx, mem); rc != CUDA_SUCCESS) return rc;
    CUdeviceptr p = 0;
    std::lock_guard lock(cx.sess.mu);
    if (CUresult rc = mem->allocate(total, p); rc != CUDA_SUCCESS) return rc;
    cx.out(p);
    cx.out(static_cast<uint64_t>(pitch));
    return CUDA_SUCCESS;
}

CUresult handle_mem_free(call_context& cx, const mem_free_args& a) {
    device_memory* mem;
    if (CUresult rc = current_memory(cx, mem); rc != CUDA_SUCCESS) return rc;
    cx.drv().cuCtxSynchronize();  // as cuMemFree: nothing in flight may still use it
    CUresult rc = free_device_allocation(cx, *mem, a.address);
    if (rc == CUDA_SUCCESS) return CUDA_SUCCESS;
    std::lock_guard lock(cx.sess.mu);
    // cuMemFree also takes a stream-ordered allocation (server/handlers_pool.cpp) and a graph allocation (its
    // address stays the session's as long as its graph: server/handlers_graph.hpp).
    const CUdeviceptr p = a.address;
    if (!cx.sess.pools.find(p) && cx.sess.graph_memory.find(p)) return cx.drv().cuMemFree_v2(p);
    if (auto s = cx.sess.pools.find(p); s && s->windowed) {  // of another device than the current one
        if (CUresult r = cx.sess.memory(s->device).release(p); r != CUDA_SUCCESS) return r;
        cx.sess.pools.erase(p);
        return CUDA_SUCCESS;
    }
    if (auto s = cx.sess.pools.find(p)) {
        if (CUresult r = cx.drv().cuMemFree_v2(p); r != CUDA_SUCCESS) return r;
        if (!s->imported) cx.sess.memory(s->device).credit(cx.sess.pools.keep(s->pool, s->size, s->device));
        cx.sess.pools.erase(p);
        withdraw_pointer_export(cx.sess, p);
        return CUDA_SUCCESS;
    }
    return cx.fail(rc, "not the start of an allocation of this session");
}

CUresult handle_mem_get_info(call_context& cx, const mem_get_info_args&) {
    device_memory* mem;
    if (CUresult rc = current_memory(cx, mem); rc != CUDA_SUCCESS) return rc;
    size_t real_free = 0, real_total = 0;
    if (CUresult rc = cx.drv().cuMemGetInfo_v2(&real_free, &real_total); rc != CUDA_SUCCESS) return rc;
    std::lock_guard lock(cx.sess.mu);
    uint64_t quota = mem->quota(), used = mem->mapped();
    uint64_t free = quota > used ? quota - used : 0;
    cx.out(static_cast<uint64_t>(std::min<uint64_t>(free, real_free)));
    cx.out(quota);
    return CUDA_SUCCESS;
}

// args {dst, stream}; payload = the bytes (in a staging buffer when they fit one).
CUresult handle_copy_htod(call_context& cx) {
    if (!cx.expect_args(2)) return cx.bad_arguments();
    CUdeviceptr dst = cx.arg(0);
    auto data = cx.payload();
    if (data.empty()) return CUDA_SUCCESS;
    if (CUresult rc = cx.device_range_now(dst, data.size()); rc != CUDA_SUCCESS) return rc;
    CUstream s;
    if (CUresult rc = cx.handle(1, handle_kind::stream, s); rc != CUDA_SUCCESS) return rc;
    CUresult rc = cx.drv().cuMemcpyHtoDAsync_v2(dst, data.data(), data.size(), s);
    if (cx.staged())
        cx.lane.staging->give_back(cx.staged(), s);
    else if (rc == CUDA_SUCCESS)
        rc = cx.drv().cuStreamSynchronize(s);  // the payload buffer dies with this call
    return rc;
}

// args {src, size, stream}; the reply's payload streams through two staging buffers: the GPU fills one while
// the other goes out on the socket.
CUresult handle_copy_dtoh(call_context& cx) {
    if (!cx.expect_args(3)) return cx.bad_arguments();
    CUdeviceptr src = cx.arg(0);
    uint64_t n = cx.arg(1);
    if (n == 0) return CUDA_SUCCESS;
    if (n > cx.lane.stream->limits().max_payload)
        return cx.fail(CUDA_ERROR_INVALID_VALUE, "copy larger than one frame");
    if (CUresult rc = cx.device_range_now(src, n); rc != CUDA_SUCCESS) return rc;
    CUstream s;
    if (CUresult rc = cx.handle(2, handle_kind::stream, s); rc != CUDA_SUCCESS) return rc;
    auto& drv = cx.drv();
    auto* pool = cx.lane.staging;
    const size_t chunk = staging_pool::buffer_size;
    staging_pool::buffer* cur = pool->take();
    if (!cur) {  // no pinned memory: one pageable copy
        cx.reply_payload.resize(n);
        CUresult rc = drv.cuMemcpyDtoHAsync_v2(cx.reply_payload.data(), src, n, s);
        if (rc == CUDA_SUCCESS) rc = drv.cuStreamSynchronize(s);
        if (rc != CUDA_SUCCESS) cx.reply_payload.clear();
        return rc;
    }
    size_t first = std::min<uint64_t>(chunk, n);
    CUresult rc = drv.cuMemcpyDtoHAsync_v2(cur->data, src, first, s);
    if (rc == CUDA_SUCCESS) rc = drv.cuStreamSynchronize(s);
    if (rc != CUDA_SUCCESS) {
        pool->give_back(cur, s);
        return rc;
    }
    cx.replied = true;
    if (auto w = send_reply(cx, CUDA_SUCCESS, n); !w) {
        pool->give_back(cur, s);
        return CUDA_SUCCESS;  // the connection is gone; the lane loop notices
    }
    uint64_t off = 0;
    size_t len = first;
    while (true) {
        staging_pool::buffer* next = nullptr;
        size_t next_len = 0;
        if (off + len < n) {
            next = pool->take();
            next_len = std::min<uint64_t>(chunk, n - off - len);
            if (!next || drv.cuMemcpyDtoHAsync_v2(next->data, src + off + len, next_len, s) != CUDA_SUCCESS) {
                // Mid-stream failure: the reply already promised n bytes, so the connection must end.
                VCUDA_LOG_ERROR("session {}: device-to-host copy failed mid-stream; closing the lane",
                                cx.sess.id());
                pool->give_back(cur, s);
                if (next) pool->give_back(next, s);
                cx.lane.stream->shutdown();
                return CUDA_SUCCESS;
            }
        }
        iovec iov{cur->data, len};
        auto w = cx.lane.stream->raw().write_all({&iov, 1});
        pool->give_back(cur, s);
        if (!w || !next) {
            if (next) pool->give_back(next, s);
            return CUDA_SUCCESS;
        }
        drv.cuStreamSynchronize(s);
        off += len;
        cur = next;
        len = next_len;
    }
}

// ---------------------------------------------------------------- deferred copies
// (server/deferred_copies.hpp)

namespace {
// The checks and the start of a deferred copy, args {src, size, stream, ticket}.
CUresult start_deferred_copy(call_context& cx) {
    CUdeviceptr src = cx.arg(0);
    const uint64_t n = cx.arg(1), ticket = cx.arg(3);
    if (n == 0 || n > deferred_copy::max_copy || ticket == 0)
        return cx.fail(CUDA_ERROR_INVALID_VALUE,
                       "a deferred copy of no bytes, of too many, or without a ticket");
    if (CUresult rc = cx.device_range_now(src, n); rc != CUDA_SUCCESS) return rc;
    CUstream s;
    if (CUresult rc = cx.handle(2, handle_kind::stream, s); rc != CUDA_SUCCESS) return rc;
    if (capture_status(cx.drv(), s) != CU_STREAM_CAPTURE_STATUS_NONE)  // a graph would keep the store's pages
        return cx.fail(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "a deferred copy cannot be captured");
    CUresult rc = cx.sess.deferred.start(cx.drv(), ticket, src, n, s);
    if (rc == CUDA_ERROR_INVALID_VALUE)
        return cx.fail(rc, "a deferred copy's ticket is in use, or the session's deferred copies hold " +
                               std::to_string(deferred_copy::max_bytes >> 20) + " MiB already");
    return rc;
}
}  // namespace

// args {src, size, stream, ticket}: queued by the client; the copy is left under way.
CUresult handle_copy_dtoh_deferred(call_context& cx) {
    if (!cx.expect_args(4)) return cx.bad_arguments();
    CUresult rc = start_deferred_copy(cx);
    // A refused copy is answered as failed at the next collect (a ticket in use keeps its copy).
    if (rc != CUDA_SUCCESS) cx.sess.deferred.refused(cx.arg(3), rc);
    return rc;
}

// Every finished copy (deferred_copies::collect).
CUresult handle_deferred_collect(call_context& cx, const deferred_collect_args&) {
    cx.sess.deferred.collect(cx.reply_payload);
    return CUDA_SUCCESS;
}

CUresult handle_deferred_wait(call_context& cx, const deferred_wait_args& a) {
    // Polled, not waited on in the driver: no lock is held across a wait, and a client that leaves ends it.
    auto pause = std::chrono::microseconds(20);
    while (cx.sess.deferred.under_way(a.ticket)) {
        if (cx.lane.stream->raw().peer_gone()) return CUDA_SUCCESS;  // nobody wants the answer
        std::this_thread::sleep_for(pause);
        pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(1));
    }
    return CUDA_SUCCESS;
}

// ---------------------------------------------------------------- striped copies (server/bulk.hpp)

namespace {

// The arguments every striped copy has: {device address, size, stream, transfer id, chunk size, bulk set}.
struct striped_args {
    CUdeviceptr device = 0;
    uint64_t n = 0, transfer = 0, chunk = 0;
    uint32_t set = 0;
};

bool read_striped(call_context& cx, striped_args& a) {
    if (!cx.expect_args(6)) return false;
    a = {cx.arg(0), cx.arg(1), cx.arg(3), cx.arg(4), static_cast<uint32_t>(cx.arg(5))};
    return a.n > 0 && a.transfer != 0 && a.set == cx.arg(5) && a.set != 0 && a.chunk >= bulk_hub::min_chunk &&
           a.chunk <= bulk_hub::buffer_size;
}

// The copy's stream; one that captures is refused: a graph would keep the staging buffer's address.
CUresult striped_stream(call_context& cx, CUstream& s) {
    if (CUresult rc = cx.handle(2, handle_kind::stream, s); rc != CUDA_SUCCESS) return rc;
    if (capture_status(cx.drv(), s) != CU_STREAM_CAPTURE_STATUS_NONE)
        return cx.fail(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "a striped copy cannot be captured");
    return CUDA_SUCCESS;
}

}  // namespace

// The bytes come as chunks on the session's bulk connections, possibly before this call. A copy refused here
// still takes its chunks (and drops them).
CUresult handle_copy_htod_striped(call_context& cx) {
    striped_args a;
    if (!read_striped(cx, a)) {
        // Its chunks cannot be told apart: the set they come on is closed.
        if (cx.arg_count() == 6)
            cx.sess.bulk().abandon(static_cast<uint32_t>(cx.arg(5)), "a malformed striped copy");
        return cx.bad_arguments();
    }
    CUstream s = nullptr;
    CUresult rc = cx.device_range_now(a.device, a.n);
    if (rc == CUDA_SUCCESS) rc = striped_stream(cx, s);
    return cx.sess.bulk().to_device(a.set, a.transfer, a.device, a.n, a.chunk, s, rc, cx.detail);
}

// The reply comes once every chunk is written on the bulk connections.
CUresult handle_copy_dtoh_striped(call_context& cx) {
    striped_args a;
    if (!read_striped(cx, a)) return cx.bad_arguments();
    if (CUresult rc = cx.device_range_now(a.device, a.n); rc != CUDA_SUCCESS) return rc;
    CUstream s = nullptr;
    if (CUresult rc = striped_stream(cx, s); rc != CUDA_SUCCESS) return rc;
    return cx.sess.bulk().to_host(a.set, a.transfer, a.device, a.n, a.chunk, s, cx.detail);
}

CUresult handle_bulk_chunk(call_context& cx) {
    return cx.fail(CUDA_ERROR_INVALID_VALUE, "bulk_chunk is sent on a bulk connection, not on a lane");
}

// args {dst, src, size, stream}
CUresult handle_copy_dtod(call_context& cx) {
    if (!cx.expect_args(4)) return cx.bad_arguments();
    CUdeviceptr dst = cx.arg(0), src = cx.arg(1);
    uint64_t n = cx.arg(2);
    if (n == 0) return CUDA_SUCCESS;
    if (CUresult rc = cx.device_range_now(dst, n); rc != CUDA_SUCCESS) return rc;
    if (CUresult rc = cx.device_range_now(src, n); rc != CUDA_SUCCESS) return rc;
    CUstream s;
    if (CUresult rc = cx.handle(3, handle_kind::stream, s); rc != CUDA_SUCCESS) return rc;
    return cx.drv().cuMemcpyDtoDAsync_v2(dst, src, n, s);
}

// args {src kind, src ptr, x, y, z, pitch, height, dst kind, dst ptr, x, y, z, pitch, height, width, h,
// depth, stream}; kind 0 host, 1 device, 2 array (ptr: its handle); host sides travel packed (pitch = width,
// height = h).
CUresult handle_copy_3d(call_context& cx) {
    if (!cx.expect_args(18)) return cx.bad_arguments();
    uint64_t w = cx.arg(14), h = cx.arg(15), depth = cx.arg(16);
    uint64_t packed;
    if (!w || !h || !depth || !mul_add(w, h, 0, packed) || !mul_add(packed, depth, 0, packed) ||
        packed > (1ull << 32))
        return cx.fail(CUDA_ERROR_INVALID_VALUE, "bad copy extent");
    CUDA_MEMCPY3D c{};
    std::vector<std::byte> host;
    auto side = [&](size_t base, bool src) -> CUresult {
        uint64_t kind = cx.arg(base), ptr = cx.arg(base + 1), x = cx.arg(base + 2), y = cx.arg(base + 3),
                 z = cx.arg(base + 4), pitch = cx.arg(base + 5), height = cx.arg(base + 6);
        if (kind == 1) {
            if (CUresult rc = cx.device_box(ptr, x, y, z, pitch, height, w, h, depth); rc != CUDA_SUCCESS)
                return rc;
            (src ? c.srcMemoryType : c.dstMemoryType) = CU_MEMORYTYPE_DEVICE;
            if (src) {
                c.srcDevice = ptr;
                c.srcXInBytes = x;
                c.srcY = y;
                c.srcZ = z;
                c.srcPitch = pitch;
                c.srcHeight = height;
            } else {
                c.dstDevice = ptr;
                c.dstXInBytes = x;
                c.dstY = y;
                c.dstZ = z;
                c.dstPitch = pitch;
                c.dstHeight = height;
            }
            return CUDA_SUCCESS;
        }
        if (kind == 2) {  // a CUDA array of this session (server/handlers_array.cpp); pitch and height unused
            CUarray a = nullptr;
            if (CUresult rc = array_box(cx, ptr, x, y, z, w, h, depth, a); rc != CUDA_SUCCESS) return rc;
            if (src) {
                c.srcMemoryType = CU_MEMORYTYPE_ARRAY;
                c.srcArray = a;
                c.srcXInBytes = x;
                c.srcY = y;
                c.srcZ = z;
            } else {
                c.dstMemoryType = CU_MEMORYTYPE_ARRAY;
                c.dstArray = a;
                c.dstXInBytes = x;
                c.dstY = y;
                c.dstZ = z;
            }
            return CUDA_SUCCESS;
        }
        if (kind != 0) return CUDA_ERROR_INVALID_VALUE;
        if (src) {
            if (cx.payload().size() != packed) return CUDA_ERROR_INVALID_VALUE;
            c.srcMemoryType = CU_MEMORYTYPE_HOST;
            c.srcHost = cx.payload().data();
            c.srcPitch = w;
            c.srcHeight = h;
        } else {
            host.resize(packed);
            c.dstMemoryType = CU_MEMORYTYPE_HOST;
            c.dstHost = host.data();
            c.dstPitch = w;
            c.dstHeight = h;
        }
        return CUDA_SUCCESS;
    };
    if (CUresult rc = side(0, true); rc != CUDA_SUCCESS) return cx.fail(rc, "bad source of 2D/3D copy");
    if (CUresult rc = side(7, false); rc != CUDA_SUCCESS) return cx.fail(rc, "bad destination of 2D/3D copy");
    if (c.srcMemoryType == CU_MEMORYTYPE_HOST && c.dstMemoryType == CU_MEMORYTYPE_HOST)
        return cx.bad_arguments();
    CUstream s;
    if (CUresult rc = cx.handle(17, handle_kind::stream, s); rc != CUDA_SUCCESS) return rc;
    c.WidthInBytes = w;
    c.Height = h;
    c.Depth = depth;
    CUresult rc = cx.drv().cuMemcpy3DAsync_v2(&c, s);
    // Host buffers here live only for this call: wait unless the copy was device to device.
    if (rc == CUDA_SUCCESS &&
        (c.srcMemoryType == CU_MEMORYTYPE_HOST || c.dstMemoryType == CU_MEMORYTYPE_HOST))
        rc = cx.drv().cuStreamSynchronize(s);
    if (rc == CUDA_SUCCESS && !host.empty()) cx.reply_payload = std::move(host);
    return rc;
}

// args {dst, value, element size, width (elements), height, pitch (bytes), stream}
CUresult handle_memset(call_context& cx) {
    if (!cx.expect_args(7)) return cx.bad_arguments();
    CUdeviceptr dst = cx.arg(0);
    uint64_t value = cx.arg(1), elem = cx.arg(2), width = cx.arg(3), height = cx.arg(4), pitch = cx.arg(5);
    CUstream s;
    if (CUresult rc = cx.handle(6, handle_kind::stream, s); rc != CUDA_SUCCESS) return rc;
    auto& d = cx.drv();
    auto captured = [&] { return capture_status(d, s) == CU_STREAM_CAPTURE_STATUS_ACTIVE; };
    if (CUresult rc = cx.memset_range(dst, elem, width, height, pitch, captured); rc != CUDA_SUCCESS)
        return rc;
    if (height == 1) {
        switch (elem) {
            case 1:
                return d.cuMemsetD8Async(dst, static_cast<unsigned char>(value), width, s);
            case 2:
                return d.cuMemsetD16Async(dst, static_cast<unsigned short>(value), width, s);
            default:
                return d.cuMemsetD32Async(dst, static_cast<unsigned>(value), width, s);
        }
    }
    switch (elem) {
        case 1:
            return d.cuMemsetD2D8Async(dst, pitch, static_cast<unsigned char>(value), width, height, s);
        case 2:
            return d.cuMemsetD2D16Async(dst, pitch, static_cast<unsigned short>(value), width, height, s);
        default:
            return d.cuMemsetD2D32Async(dst, pitch, static_cast<unsigned>(value), width, height, s);
    }
}

namespace {
// A stream memory operation's word: the session's device memory or its shared pinned host memory.
CUresult memop_target(call_context& cx, CUdeviceptr addr, size_t width) {
    return cx.sess.owns_host(addr, width) ? CUDA_SUCCESS : cx.device_range(addr, width);
}
}  // namespace

CUresult handle_stream_memop(call_context& cx, const stream_memop_args& a) {
    CUstream stream = a.stream;
    const bool legacy = a.kind & 4;  // the entry points without _v2
    const unsigned kind = a.kind & ~4u;
    CUdeviceptr addr = a.address;
    const uint64_t value = a.value;
    const unsigned flags = a.flags;
    if (kind > 3) return cx.bad_arguments();
    const size_t width = kind < 2 ? 4 : 8;
    if (CUresult rc = memop_target(cx, addr, width); rc != CUDA_SUCCESS) return rc;
    auto& d = cx.drv();
    if (legacy && d.cuStreamWriteValue32 && d.cuStreamWaitValue32 && d.cuStreamWriteValue64 &&
        d.cuStreamWaitValue64) {
        switch (kind) {
            case 0:
                return d.cuStreamWriteValue32(stream, addr, static_cast<cuuint32_t>(value), flags);
            case 1:
                return d.cuStreamWaitValue32(stream, addr, static_cast<cuuint32_t>(value), flags);
            case 2:
                return d.cuStreamWriteValue64(stream, addr, value, flags);
            default:
                return d.cuStreamWaitValue64(stream, addr, value, flags);
        }
    }
    switch (kind) {
        case 0:
            return d.cuStreamWriteValue32_v2(stream, addr, static_cast<cuuint32_t>(value), flags);
        case 1:
            return d.cuStreamWaitValue32_v2(stream, addr, static_cast<cuuint32_t>(value), flags);
        case 2:
            return d.cuStreamWriteValue64_v2(stream, addr, value, flags);
        default:
            return d.cuStreamWaitValue64_v2(stream, addr, value, flags);
    }
}

// Every operation is checked first (its kind, its address in the session's memory, aligned), so that a
// refused batch leaves nothing enqueued; then the driver takes the batch as it is.
CUresult handle_stream_batch_memop(call_context& cx, const stream_batch_memop_args& a) {
    CUstream stream = a.stream;
    const uint64_t count = a.count;
    auto bytes = a.ops;
    if (count > 256 || bytes.size() != count * sizeof(CUstreamBatchMemOpParams)) return cx.bad_arguments();
    std::vector<CUstreamBatchMemOpParams> ops(count);
    if (count) std::memcpy(ops.data(), bytes.data(), bytes.size());
    for (auto& o : ops) {
        size_t width = 0;
        CUdeviceptr addr = 0;
        switch (o.operation) {
            case CU_STREAM_MEM_OP_WAIT_VALUE_32:
            case CU_STREAM_MEM_OP_WAIT_VALUE_64:
                width = o.operation == CU_STREAM_MEM_OP_WAIT_VALUE_32 ? 4 : 8;
                addr = o.waitValue.address;
                o.waitValue.alias = 0;  // the driver's own
                break;
            case CU_STREAM_MEM_OP_WRITE_VALUE_32:
            case CU_STREAM_MEM_OP_WRITE_VALUE_64:
                width = o.operation == CU_STREAM_MEM_OP_WRITE_VALUE_32 ? 4 : 8;
                addr = o.writeValue.address;
                o.writeValue.alias = 0;
                break;
            case CU_STREAM_MEM_OP_FLUSH_REMOTE_WRITES:
            case CU_STREAM_MEM_OP_BARRIER:
                continue;
            default:
                return cx.fail(CUDA_ERROR_INVALID_VALUE, "unknown batch memory operation " +
                                                             std::to_string(static_cast<int>(o.operation)));
        }
        if (addr % width)
            return cx.fail(CUDA_ERROR_INVALID_VALUE, "a batch operation's address is misaligned");
        if (CUresult rc = memop_target(cx, addr, width); rc != CUDA_SUCCESS) return rc;
    }
    auto& d = cx.drv();
    const unsigned flags = a.flags;
    if (a.legacy && d.cuStreamBatchMemOp)
        return d.cuStreamBatchMemOp(stream, static_cast<unsigned>(count), ops.data(), flags);
    if (!d.cuStreamBatchMemOp_v2) return cx.unsupported("cuStreamBatchMemOp_v2");
    return d.cuStreamBatchMemOp_v2(stream, static_cast<unsigned>(count), ops.data(), flags);
}

}  // namespace vcuda::server
