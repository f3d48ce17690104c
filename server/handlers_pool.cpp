// Stream-ordered allocation and memory pools (cuMemAllocAsync, cuMemFreeAsync, cuMemPoolCreate, ...). Every
// stream-ordered allocation is this session's memory (copies and kernels may use it; charged to the quota
// when made, credited when freed); pools are session handles, the devices' default pools owned by the session
// (never destroyed by it). Only device-located pools are served. On a capturing stream the driver makes a
// memory alloc node instead: its allocation is held as its graph's (server/handlers_graph.hpp).
//
// A device's default pool is served from the session's own device memory (device_memory, in the address
// window), not the driver's pool: the driver picks its pools' addresses, which another server process could
// not give again, so only such memory is suspended and moved with the session. A free waits for its stream:
// an event recorded behind the stream's work says when the memory may go back (session::settle_stream_frees,
// at the application's next synchronize, a pool allocation, a trim or cuMemFree, and waited for when a pool
// allocation finds no room; not at the free, which the driver's pools keep too); an allocation on the same
// stream takes it at once where it fits as it is, as the driver's pools reuse it. The pool's figures count it
// (pool_allocations::window_figures). So is a pool the application made like a default pool (device memory,
// not shareable, no size limit): its driver pool answers its attributes and holds nothing. Any other pool the
// application made stays the driver's; what it keeps reserved after frees, up to its release threshold, stays
// charged.
#include <cstring>
#include <span>
#include <vector>

#include "server/call_context.hpp"
#include "server/handlers_graph.hpp"
#include "server/handlers_ipc.hpp"
#include "server/handlers_memory.hpp"
#include "server_ops.hpp"

namespace vcuda::server {

namespace {

// The current device's index and memory account.
CUresult current_device_memory(call_context& cx, size_t& device, device_memory*& mem) {
    int d = cx.device_index();
    if (d < 0 || static_cast<size_t>(d) >= cx.sess.device_count())
        return cx.fail(CUDA_ERROR_INVALID_CONTEXT, "no current context");
    device = static_cast<size_t>(d);
    mem = &cx.sess.memory(device);
    return CUDA_SUCCESS;
}

// The handle the session already gave for the driver's pool `raw`, else a new owned one (a device's default
// or current pool: asking twice gives the same handle), of session device `device`.
void out_pool(call_context& cx, CUmemoryPool raw, size_t device) {
    uint64_t found;
    {
        std::lock_guard lock(cx.sess.mu);
        found = cx.sess.handles.find_raw(handle_kind::mem_pool, raw);
    }
    if (found) {
        cx.out(found);
        return;
    }
    cx.out_handle(handle_kind::mem_pool, raw, 0, /*owned=*/true);
    std::lock_guard lock(cx.sess.mu);
    if (handle_entry* e = cx.sess.handles.find(cx.outs.back(), handle_kind::mem_pool))
        e->device = static_cast<int>(device);  // a suspend makes it again on its own device
}

// cuMemAllocAsync on a capturing stream: a memory alloc node of the capture's graph, charged in full (the
// graph's memory is not its pool's to keep) and held as the graph's.
CUresult captured_alloc(call_context& cx, CUstream stream, CUmemoryPool pool, size_t size, size_t device) {
    auto& d = cx.drv();
    CUstreamCaptureStatus status{};
    CUgraph g = nullptr;
    if (!d.cuStreamGetCaptureInfo_v3) return cx.unsupported("cuStreamGetCaptureInfo_v3");
    if (CUresult rc = d.cuStreamGetCaptureInfo_v3(stream, &status, nullptr, &g, nullptr, nullptr, nullptr);
        rc != CUDA_SUCCESS)
        return rc;
    {
        std::lock_guard lock(cx.sess.mu);
        if (!cx.sess.memory(device).charge(size))
            return cx.fail(CUDA_ERROR_OUT_OF_MEMORY, "allocation of " + std::to_string(size) +
                                                         " bytes exceeds the session's memory quota");
    }
    CUdeviceptr p = 0;
    CUresult rc =
        pool ? d.cuMemAllocFromPoolAsync(&p, size, pool, stream) : d.cuMemAllocAsync(&p, size, stream);
    if (rc != CUDA_SUCCESS) {
        std::lock_guard lock(cx.sess.mu);
        cx.sess.memory(device).credit(size);
        return rc;
    }
    if (CUresult r = hold_graph_allocation(cx, g, p, size, device); r != CUDA_SUCCESS) return r;
    cx.out(static_cast<uint64_t>(p));
    return CUDA_SUCCESS;
}

// Whether allocations from `pool` (nullptr: the device's current pool) are served from the session's own
// memory: those of the device's default pool.
bool from_default_pool(call_context& cx, size_t device, CUmemoryPool& pool) {
    auto& d = cx.drv();
    CUdevice dev;
    CUmemoryPool def = nullptr;
    if (cx.sess.real_device(device, dev) != CUDA_SUCCESS || !d.cuDeviceGetDefaultMemPool ||
        d.cuDeviceGetDefaultMemPool(&def, dev) != CUDA_SUCCESS)
        return false;
    if (!pool && (!d.cuDeviceGetMemPool || d.cuDeviceGetMemPool(&pool, dev) != CUDA_SUCCESS)) return false;
    return pool == def;
}

// The session's device index whose default pool `pool` is, or -1.
int default_pool_device(call_context& cx, CUmemoryPool pool) {
    for (size_t i = 0; i < cx.sess.device_count(); ++i)
        if (CUmemoryPool p = pool; p && from_default_pool(cx, i, p)) return static_cast<int>(i);
    return -1;
}

// A pool whose allocations the session serves from its own memory: a device's default pool (made 0), or one
// the application made that the session serves (made: its handle); device -1 for any other.
struct served_pool {
    int device = -1;
    uint64_t made = 0;
};
// The application's pool `pool` when the session serves it (no driver call: an allocation's path).
served_pool served_made(call_context& cx, CUmemoryPool pool) {
    served_pool s;
    if (!pool) return s;
    std::lock_guard lock(cx.sess.mu);
    uint64_t id = cx.sess.handles.find_raw(handle_kind::mem_pool, pool);
    const handle_entry* e = id ? cx.sess.handles.find(id, handle_kind::mem_pool) : nullptr;
    if (e && !e->owned && (e->made_with[0] & pool_allocations::served_by_session)) {
        s.device = e->device;
        s.made = id;
    }
    return s;
}
// Any pool the session serves: a device's default one, or the application's.
served_pool served(call_context& cx, CUmemoryPool pool) {
    if (int device = default_pool_device(cx, pool); device >= 0) return {device, 0};
    return served_made(cx, pool);
}

// An allocation of a pool the session serves (`made`: the application's pool, 0 the default pool): the
// session's device memory, where the frees that waited for their streams gave room back first (all of them,
// waited for, when there is no room otherwise).
CUresult windowed_alloc(call_context& cx, device_memory& mem, size_t size, size_t device, CUmemoryPool pool,
                        CUstream stream, uint64_t made) {
    CUdeviceptr p = 0;
    std::lock_guard lock(cx.sess.mu);
    // Memory freed on this stream is this allocation's at once, as the driver's pools reuse it: the stream
    // runs its work in order, so nothing before the free touches it after.
    auto& pending = cx.sess.pools.pending();
    for (auto f = pending.begin(); f != pending.end(); ++f)
        if (f->stream == stream && f->size && f->device == device && f->made_pool == made &&
            mem.take_again(f->p, size)) {
            p = f->p;
            cx.drv().cuEventDestroy_v2(f->done);
            cx.sess.pools.gave_back(*f);
            pending.erase(f);
            cx.sess.pools.add(p, size, device, pool, /*imported=*/false, /*windowed=*/true, made);
            cx.out(static_cast<uint64_t>(p));
            return CUDA_SUCCESS;
        }
    cx.sess.settle_stream_frees(false);
    CUresult rc = mem.allocate(size, p);
    if (rc == CUDA_ERROR_OUT_OF_MEMORY && !cx.sess.pools.pending().empty()) {
        cx.sess.settle_stream_frees(true);
        rc = mem.allocate(size, p);
    }
    if (rc == CUDA_ERROR_OUT_OF_MEMORY && mem.quota())
        return cx.fail(rc,
                       "allocation of " + std::to_string(size) + " bytes exceeds the session's memory quota");
    if (rc != CUDA_SUCCESS) return rc;
    cx.sess.pools.add(p, size, device, pool, /*imported=*/false, /*windowed=*/true, made);
    cx.out(static_cast<uint64_t>(p));
    return CUDA_SUCCESS;
}

// A free of the session's own memory in stream order (`counted`: bytes of its pool's figures, `made` that
// pool as in windowed_alloc): its IPC handle opens no more at once, and the memory goes back once the
// stream's work before the free is done. Without an event to say when, the stream is waited for. A capture
// frees only its graph's allocations: the driver refuses this one.
CUresult free_when_done(call_context& cx, device_memory& mem, CUdeviceptr p, CUstream stream, size_t device,
                        size_t counted, uint64_t made = 0) {
    auto& d = cx.drv();
    if (capture_status(d, stream) == CU_STREAM_CAPTURE_STATUS_ACTIVE) return d.cuMemFreeAsync(p, stream);
    {
        std::lock_guard lock(cx.sess.mu);
        withdraw_memory_export(cx.sess, p);
    }
    CUevent done = nullptr;
    if (d.cuEventCreate(&done, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS &&
        d.cuEventRecord(done, stream) == CUDA_SUCCESS) {
        std::lock_guard lock(cx.sess.mu);
        cx.sess.pools.erase(p, /*waiting=*/true);
        cx.sess.pools.pending().push_back({done, p, counted, device, stream, made});
        cx.sess.pools.maybe_pending.store(true, std::memory_order_relaxed);
        return CUDA_SUCCESS;
    }
    if (done) d.cuEventDestroy_v2(done);
    if (CUresult rc = d.cuStreamSynchronize(stream); rc != CUDA_SUCCESS) return rc;
    std::lock_guard lock(cx.sess.mu);
    cx.sess.pools.erase(p);
    return mem.release(p);
}

// cuMemFreeAsync of an allocation made by cuMemAlloc, which the driver takes (cuSPARSE 13 frees its SpSV
// buffers so): the session's allocations are its own mappings, freed once the stream's work before is done.
CUresult free_in_stream_order(call_context& cx, CUdeviceptr p, CUstream stream) {
    size_t device;
    device_memory* mem;
    if (CUresult rc = current_device_memory(cx, device, mem); rc != CUDA_SUCCESS) return rc;
    {
        std::lock_guard lock(cx.sess.mu);
        if (!mem->allocations().count(p) || cx.sess.pools.freed_pending(p))
            return cx.fail(CUDA_ERROR_INVALID_VALUE, "not the start of an allocation of this session");
    }
    return free_when_done(cx, *mem, p, stream, device, 0);
}

}  // namespace

CUresult handle_pool_alloc(call_context& cx, const pool_alloc_args& a) {
    const size_t size = a.size;
    if (size == 0) return CUDA_ERROR_INVALID_VALUE;
    CUstream stream = a.stream;
    CUmemoryPool pool = a.pool;
    size_t device;
    device_memory* mem;
    if (CUresult rc = current_device_memory(cx, device, mem); rc != CUDA_SUCCESS) return rc;
    auto& d = cx.drv();
    if (capture_status(d, stream) == CU_STREAM_CAPTURE_STATUS_ACTIVE)
        return captured_alloc(cx, stream, pool, size, device);
    if (CUmemoryPool def = pool; from_default_pool(cx, device, def))
        return windowed_alloc(cx, *mem, size, device, def, stream, 0);
    // The pool the allocation comes from (the device's current one when none is named): what it keeps
    // reserved is reused first.
    CUmemoryPool from = pool;
    if (CUdevice dev; !from && cx.sess.real_device(device, dev) == CUDA_SUCCESS && d.cuDeviceGetMemPool)
        d.cuDeviceGetMemPool(&from, dev);
    if (served_pool s = served_made(cx, from); s.made)  // on the pool's device, as the driver places it
        return windowed_alloc(cx, cx.sess.memory(static_cast<size_t>(s.device)), size,
                              static_cast<size_t>(s.device), from, stream, s.made);
    uint64_t charged;
    {
        std::lock_guard lock(cx.sess.mu);
        charged = cx.sess.pools.take_kept(from, size);
        if (!mem->charge(charged)) {
            cx.sess.pools.give_back_kept(from, size - charged);
            return cx.fail(CUDA_ERROR_OUT_OF_MEMORY, "allocation of " + std::to_string(size) +
                                                         " bytes exceeds the session's memory quota");
        }
    }
    CUdeviceptr p = 0;
    CUresult rc =
        pool ? d.cuMemAllocFromPoolAsync(&p, size, pool, stream) : d.cuMemAllocAsync(&p, size, stream);
    std::lock_guard lock(cx.sess.mu);
    if (rc != CUDA_SUCCESS) {
        mem->credit(charged);
        cx.sess.pools.give_back_kept(from, size - charged);
        return rc;
    }
    cx.sess.pools.add(p, size, device, from);
    cx.out(static_cast<uint64_t>(p));
    return CUDA_SUCCESS;
}

// A graph allocation (server/handlers_graph.hpp) is freed as the driver frees it; the session holds its
// address as long as its graph.
CUresult handle_pool_free(call_context& cx, const pool_free_args& a) {
    CUstream stream = a.stream;
    const CUdeviceptr p = a.address;
    pool_allocations::allocation found;
    bool stream_ordered = false;
    {
        std::lock_guard lock(cx.sess.mu);
        auto f = cx.sess.pools.find(p);
        if (!f && cx.sess.graph_memory.find(p)) return cx.drv().cuMemFreeAsync(p, stream);
        if (f) {
            found = *f;
            stream_ordered = true;
        }
    }
    if (!stream_ordered) return free_in_stream_order(cx, p, stream);
    if (found.windowed)
        return free_when_done(cx, cx.sess.memory(found.device), p, stream, found.device, found.size,
                              found.made_pool);
    if (CUresult rc = cx.drv().cuMemFreeAsync(p, stream); rc != CUDA_SUCCESS) return rc;
    std::lock_guard lock(cx.sess.mu);
    cx.sess.pools.erase(p);
    if (!found.imported)
        cx.sess.memory(found.device).credit(cx.sess.pools.keep(found.pool, found.size, found.device));
    withdraw_pointer_export(cx.sess, p);
    return CUDA_SUCCESS;
}

CUresult handle_pool_create(call_context& cx, const pool_create_args& a) {
    if (a.props.size() != sizeof(CUmemPoolProps)) return cx.bad_arguments();
    CUmemPoolProps props;
    std::memcpy(&props, a.props.data(), sizeof props);
    props.win32SecurityAttributes = nullptr;
    size_t device;
    if (CUresult rc = cx.device_location(props.location, device); rc != CUDA_SUCCESS) return rc;
    CUmemoryPool pool = nullptr;
    if (CUresult rc = cx.drv().cuMemPoolCreate(&pool, &props); rc != CUDA_SUCCESS) return rc;
    cx.out_handle(handle_kind::mem_pool, pool, 0, /*owned=*/false);
    // Served from the session's memory, so that it suspends and moves, when nothing in it needs the driver's
    // own pool: device memory, no shareable handle type (IPC of the pool), no size limit, no special usage.
    const bool serve =
        props.allocType == CU_MEM_ALLOCATION_TYPE_PINNED && props.handleTypes == CU_MEM_HANDLE_TYPE_NONE &&
        props.location.type == CU_MEM_LOCATION_TYPE_DEVICE && props.maxSize == 0 && props.usage == 0;
    std::lock_guard lock(cx.sess.mu);
    if (handle_entry* e = cx.sess.handles.find(cx.outs.back(), handle_kind::mem_pool)) {
        e->device = static_cast<int>(device);
        e->made_with[0] = serve ? pool_allocations::served_by_session : 0;
    }
    return CUDA_SUCCESS;
}

// A device's default pool is not the application's to destroy.
CUresult handle_pool_destroy(call_context& cx, const pool_destroy_args& a) {
    void* raw = nullptr;
    handle_entry e;
    if (CUresult rc = cx.lookup(a.pool_id, handle_kind::mem_pool, raw, &e); rc != CUDA_SUCCESS) return rc;
    if (e.owned)
        return cx.fail(CUDA_ERROR_INVALID_VALUE, "a device's default or current pool cannot be destroyed");
    if (CUresult rc = cx.drv().cuMemPoolDestroy(a.pool); rc != CUDA_SUCCESS) return rc;
    std::lock_guard lock(cx.sess.mu);
    size_t device = 0;
    uint64_t kept = cx.sess.pools.forget_pool(a.pool, device);
    if (kept && device < cx.sess.device_count()) cx.sess.memory(device).credit(kept);
    cx.sess.pools.forget_made_pool(a.pool_id);
    return CUDA_SUCCESS;
}

CUresult handle_device_atomic_caps(call_context& cx, const device_atomic_caps_args& a) {
    auto b = a.operations;
    if (b.empty() || b.size() % sizeof(CUatomicOperation) != 0 || b.size() > 1024 * sizeof(CUatomicOperation))
        return cx.fail(CUDA_ERROR_INVALID_VALUE, "bad count of atomic operations");
    const auto count = static_cast<unsigned>(b.size() / sizeof(CUatomicOperation));
    std::vector<CUatomicOperation> ops(count);
    std::memcpy(ops.data(), b.data(), b.size());
    std::vector<unsigned> caps(count);
    auto& d = cx.drv();
    CUresult rc;
    if (!a.has_peer) {
        if (!d.cuDeviceGetHostAtomicCapabilities) return cx.unsupported("cuDeviceGetHostAtomicCapabilities");
        rc = d.cuDeviceGetHostAtomicCapabilities(caps.data(), ops.data(), count, a.dev);
    } else {
        if (!d.cuDeviceGetP2PAtomicCapabilities) return cx.unsupported("cuDeviceGetP2PAtomicCapabilities");
        rc = d.cuDeviceGetP2PAtomicCapabilities(caps.data(), ops.data(), count, a.dev, a.peer);
    }
    if (rc != CUDA_SUCCESS) return rc;
    cx.out_blob(std::as_bytes(std::span(caps)));
    return CUDA_SUCCESS;
}

CUresult handle_device_pool(call_context& cx, const device_pool_args& a) {
    CUmemoryPool pool = nullptr;
    auto& d = cx.drv();
    CUresult rc =
        a.which == 0 ? d.cuDeviceGetDefaultMemPool(&pool, a.dev) : d.cuDeviceGetMemPool(&pool, a.dev);
    if (rc != CUDA_SUCCESS) return rc;
    out_pool(cx, pool, a.dev_index);
    return CUDA_SUCCESS;
}

namespace {
// The attributes of 64 bits (cuuint64_t): the release threshold and the four memory figures; the others are
// int.
bool wide_attribute(CUmemPool_attribute a) { return a >= CU_MEMPOOL_ATTR_RELEASE_THRESHOLD; }
}  // namespace

CUresult handle_pool_set_attribute(call_context& cx, const pool_set_attribute_args& a) {
    CUmemoryPool pool = a.pool;
    auto attr = static_cast<CUmemPool_attribute>(a.attribute);
    uint64_t wide = a.value;
    int narrow = static_cast<int>(wide);
    const bool is_wide = wide_attribute(attr);
    CUresult rc = cx.drv().cuMemPoolSetAttribute(
        pool, attr, is_wide ? static_cast<void*>(&wide) : static_cast<void*>(&narrow));
    if (rc == CUDA_SUCCESS &&
        (attr == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH || attr == CU_MEMPOOL_ATTR_USED_MEM_HIGH))
        if (served_pool s = served(cx, pool); s.device >= 0) {  // high marks back to the current figures
            std::lock_guard lock(cx.sess.mu);
            auto& f = cx.sess.pools.figures(static_cast<size_t>(s.device), s.made);
            (attr == CU_MEMPOOL_ATTR_USED_MEM_HIGH ? f.used_high : f.reserved_high) =
                attr == CU_MEMPOOL_ATTR_USED_MEM_HIGH ? f.used : f.reserved;
        }
    if (rc != CUDA_SUCCESS || attr != CU_MEMPOOL_ATTR_RELEASE_THRESHOLD) return rc;
    // What the pool may keep reserved from now on (charged while it keeps it: handle_pool_free).
    std::lock_guard lock(cx.sess.mu);
    size_t device = 0;
    uint64_t over = cx.sess.pools.set_threshold(pool, wide, device);
    if (over && device < cx.sess.device_count()) cx.sess.memory(device).credit(over);
    return CUDA_SUCCESS;
}

CUresult handle_pool_get_attribute(call_context& cx, const pool_get_attribute_args& a) {
    CUmemoryPool pool = a.pool;
    auto attr = static_cast<CUmemPool_attribute>(a.attribute);
    uint64_t wide = 0;
    int narrow = 0;
    const bool is_wide = wide_attribute(attr);
    if (CUresult rc = cx.drv().cuMemPoolGetAttribute(
            pool, attr, is_wide ? static_cast<void*>(&wide) : static_cast<void*>(&narrow));
        rc != CUDA_SUCCESS)
        return rc;
    // A served pool's figures: the driver's (captured allocations) and the session's memory it serves.
    if (served_pool s = served(cx, pool); s.device >= 0 && is_wide) {
        std::lock_guard lock(cx.sess.mu);
        const auto& f = cx.sess.pools.figures(static_cast<size_t>(s.device), s.made);
        switch (attr) {
            case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
                wide += f.reserved;
                break;
            case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
                wide += f.reserved_high;
                break;
            case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
                wide += f.used;
                break;
            case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
                wide += f.used_high;
                break;
            default:
                break;
        }
    }
    cx.out(is_wide ? wide : static_cast<uint64_t>(static_cast<uint32_t>(narrow)));
    return CUDA_SUCCESS;
}

CUresult handle_pool_set_access(call_context& cx, const pool_set_access_args& a) {
    const uint64_t count = a.count;
    auto b = a.access;
    if (count == 0 || count > 64 || b.size() != count * sizeof(CUmemAccessDesc)) return cx.bad_arguments();
    std::vector<CUmemAccessDesc> desc(count);
    std::memcpy(desc.data(), b.data(), b.size());
    for (auto& x : desc) {
        size_t device;
        if (CUresult rc = cx.device_location(x.location, device); rc != CUDA_SUCCESS) return rc;
    }
    return cx.drv().cuMemPoolSetAccess(a.pool, desc.data(), count);
}

CUresult handle_pool_get_access(call_context& cx, const pool_get_access_args& a) {
    CUmemLocation loc{};
    loc.type = CU_MEM_LOCATION_TYPE_DEVICE;
    loc.id = a.dev;
    CUmemAccess_flags flags{};
    if (CUresult rc = cx.drv().cuMemPoolGetAccess(&flags, a.pool, &loc); rc != CUDA_SUCCESS) return rc;
    cx.out(static_cast<uint64_t>(flags));
    return CUDA_SUCCESS;
}

// cuMemPoolTrimTo {pool, bytes to keep}: a served pool gives back the frees that are done, and holds no more
// than it must for its allocations, or the bytes to keep.
CUresult handle_pool_trim(call_context& cx) {
    if (!cx.expect_args(2)) return cx.bad_arguments();
    CUmemoryPool pool;
    if (CUresult rc = cx.handle(0, handle_kind::mem_pool, pool); rc != CUDA_SUCCESS) return rc;
    if (CUresult rc = cx.drv().cuMemPoolTrimTo(pool, cx.arg(1)); rc != CUDA_SUCCESS) return rc;
    if (served_pool s = served(cx, pool); s.device >= 0) {
        std::lock_guard lock(cx.sess.mu);
        cx.sess.settle_stream_frees(false);
        cx.sess.memory(static_cast<size_t>(s.device)).drop_spares();
        cx.sess.pools.figures(static_cast<size_t>(s.device), s.made).trimmed(cx.arg(1));
    }
    return CUDA_SUCCESS;
}

}  // namespace vcuda::server
