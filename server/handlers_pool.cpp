// Stream-ordered allocation and memory pools (cuMemAllocAsync, cuMemFreeAsync, cuMemPoolCreate, ...). Every
// stream-ordered allocation is this session's memory (copies and kernels may use it; charged to the quota
// when made, credited when freed); pools are session handles, the devices' default pools owned by the session
// (never destroyed by it). What a pool keeps reserved after frees, up to its release threshold, stays
// charged. Only device-located pools are served. On a capturing stream the driver makes a memory alloc node
// instead: its allocation is held as its graph's (server/handlers_graph.hpp).
#include <cstring>
#include <span>
#include <vector>

#include "server/call_context.hpp"
#include "server/handlers_graph.hpp"
#include "server/handlers_ipc.hpp"
#include "server/handlers_memory.hpp"

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
// or current pool: asking twice gives the same handle).
void out_pool(call_context& cx, CUmemoryPool raw) {
    uint64_t found;
    {
        std::lock_guard lock(cx.sess.mu);
        found = cx.sess.handles.find_raw(handle_kind::mem_pool, raw);
    }
    if (found)
        cx.out(found);
    else
        cx.out_handle(handle_kind::mem_pool, raw, 0, /*owned=*/true);
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

// cuMemFreeAsync of an allocation made by cuMemAlloc, which the driver takes (cuSPARSE 13 frees its SpSV
// buffers so): the session's allocations are its own mappings, freed once the stream's work before is done.
CUresult free_in_stream_order(call_context& cx, CUdeviceptr p, CUstream stream) {
    size_t device;
    device_memory* mem;
    if (CUresult rc = current_device_memory(cx, device, mem); rc != CUDA_SUCCESS) return rc;
    {
        std::lock_guard lock(cx.sess.mu);
        if (!mem->contains(p, 1))
            return cx.fail(CUDA_ERROR_INVALID_VALUE, "not an allocation of this session");
    }
    if (CUresult rc = cx.drv().cuStreamSynchronize(stream); rc != CUDA_SUCCESS) return rc;
    if (CUresult rc = free_device_allocation(cx, *mem, p); rc != CUDA_SUCCESS)
        return cx.fail(rc, "not the start of an allocation of this session");
    return CUDA_SUCCESS;
}

}  // namespace

// args {size, stream, pool (0: the device's current pool)} -> outs {address}
CUresult handle_pool_alloc(call_context& cx) {
    if (!cx.expect_args(3)) return cx.bad_arguments();
    size_t size = cx.arg(0);
    if (size == 0) return CUDA_ERROR_INVALID_VALUE;
    CUstream stream;
    if (CUresult rc = cx.handle(1, handle_kind::stream, stream); rc != CUDA_SUCCESS) return rc;
    CUmemoryPool pool = nullptr;
    if (cx.arg(2))
        if (CUresult rc = cx.handle(2, handle_kind::mem_pool, pool); rc != CUDA_SUCCESS) return rc;
    size_t device;
    device_memory* mem;
    if (CUresult rc = current_device_memory(cx, device, mem); rc != CUDA_SUCCESS) return rc;
    auto& d = cx.drv();
    if (capture_status(d, stream) == CU_STREAM_CAPTURE_STATUS_ACTIVE)
        return captured_alloc(cx, stream, pool, size, device);
    // The pool the allocation comes from (the device's current one when none is named): what it keeps
    // reserved is reused first.
    CUmemoryPool from = pool;
    if (CUdevice dev; !from && cx.sess.real_device(device, dev) == CUDA_SUCCESS && d.cuDeviceGetMemPool)
        d.cuDeviceGetMemPool(&from, dev);
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

// args {address, stream}. A graph allocation (server/handlers_graph.hpp) is freed as the driver frees it; the
// session holds its address as long as its graph.
CUresult handle_pool_free(call_context& cx) {
    if (!cx.expect_args(2)) return cx.bad_arguments();
    CUstream stream;
    if (CUresult rc = cx.handle(1, handle_kind::stream, stream); rc != CUDA_SUCCESS) return rc;
    auto p = static_cast<CUdeviceptr>(cx.arg(0));
    pool_allocations::allocation a;
    bool stream_ordered = false;
    {
        std::lock_guard lock(cx.sess.mu);
        auto found = cx.sess.pools.find(p);
        if (!found && cx.sess.graph_memory.find(p)) return cx.drv().cuMemFreeAsync(p, stream);
        if (found) {
            a = *found;
            stream_ordered = true;
        }
    }
    if (!stream_ordered) return free_in_stream_order(cx, p, stream);
    if (CUresult rc = cx.drv().cuMemFreeAsync(p, stream); rc != CUDA_SUCCESS) return rc;
    std::lock_guard lock(cx.sess.mu);
    cx.sess.pools.erase(p);
    if (!a.imported) cx.sess.memory(a.device).credit(cx.sess.pools.keep(a.pool, a.size, a.device));
    withdraw_pointer_export(cx.sess, p);
    return CUDA_SUCCESS;
}

// blob {CUmemPoolProps} (location: the session's device index) -> outs {pool}
CUresult handle_pool_create(call_context& cx) {
    if (!cx.expect_args(0) || cx.blob_count() != 1 || cx.blob(0).size() != sizeof(CUmemPoolProps))
        return cx.bad_arguments();
    CUmemPoolProps props;
    std::memcpy(&props, cx.blob(0).data(), sizeof props);
    props.win32SecurityAttributes = nullptr;
    size_t device;
    if (CUresult rc = cx.device_location(props.location, device); rc != CUDA_SUCCESS) return rc;
    CUmemoryPool pool = nullptr;
    if (CUresult rc = cx.drv().cuMemPoolCreate(&pool, &props); rc != CUDA_SUCCESS) return rc;
    cx.out_handle(handle_kind::mem_pool, pool, 0, /*owned=*/false);
    return CUDA_SUCCESS;
}

// args {pool}: a pool the application created (a device's default pool is not its to destroy).
CUresult handle_pool_destroy(call_context& cx) {
    if (!cx.expect_args(1)) return cx.bad_arguments();
    void* raw = nullptr;
    handle_entry e;
    if (CUresult rc = cx.lookup(cx.arg(0), handle_kind::mem_pool, raw, &e); rc != CUDA_SUCCESS) return rc;
    if (e.owned)
        return cx.fail(CUDA_ERROR_INVALID_VALUE, "a device's default or current pool cannot be destroyed");
    if (CUresult rc = cx.drv().cuMemPoolDestroy(static_cast<CUmemoryPool>(raw)); rc != CUDA_SUCCESS)
        return rc;
    {
        std::lock_guard lock(cx.sess.mu);
        size_t device = 0;
        uint64_t kept = cx.sess.pools.forget_pool(static_cast<CUmemoryPool>(raw), device);
        if (kept && device < cx.sess.device_count()) cx.sess.memory(device).credit(kept);
    }
    cx.forget_handle(0);
    return CUDA_SUCCESS;
}

// args {device[, peer device]} (session indices); blob the operations -> blob their capabilities (unsigned
// each): of the device's link to this host, or to the peer.
CUresult handle_device_atomic_caps(call_context& cx) {
    if (cx.arg_count() < 1 || cx.arg_count() > 2 || cx.blob_count() != 1) return cx.bad_arguments();
    auto b = cx.blob(0);
    if (b.empty() || b.size() % sizeof(CUatomicOperation) != 0 || b.size() > 1024 * sizeof(CUatomicOperation))
        return cx.fail(CUDA_ERROR_INVALID_VALUE, "bad count of atomic operations");
    const auto count = static_cast<unsigned>(b.size() / sizeof(CUatomicOperation));
    std::vector<CUatomicOperation> ops(count);
    std::memcpy(ops.data(), b.data(), b.size());
    std::vector<unsigned> caps(count);
    CUdevice dev;
    if (CUresult rc = cx.device(0, dev); rc != CUDA_SUCCESS) return rc;
    auto& d = cx.drv();
    CUresult rc;
    if (cx.arg_count() == 1) {
        if (!d.cuDeviceGetHostAtomicCapabilities) return cx.unsupported("cuDeviceGetHostAtomicCapabilities");
        rc = d.cuDeviceGetHostAtomicCapabilities(caps.data(), ops.data(), count, dev);
    } else {
        CUdevice peer;
        if (rc = cx.device(1, peer); rc != CUDA_SUCCESS) return rc;
        if (!d.cuDeviceGetP2PAtomicCapabilities) return cx.unsupported("cuDeviceGetP2PAtomicCapabilities");
        rc = d.cuDeviceGetP2PAtomicCapabilities(caps.data(), ops.data(), count, dev, peer);
    }
    if (rc != CUDA_SUCCESS) return rc;
    cx.out_blob(std::as_bytes(std::span(caps)));
    return CUDA_SUCCESS;
}

// args {device (session index), which: 0 default, 1 current} -> outs {pool}
CUresult handle_device_pool(call_context& cx) {
    if (!cx.expect_args(2)) return cx.bad_arguments();
    CUdevice dev;
    if (CUresult rc = cx.device(0, dev); rc != CUDA_SUCCESS) return rc;
    CUmemoryPool pool = nullptr;
    auto& d = cx.drv();
    CUresult rc = cx.arg(1) == 0 ? d.cuDeviceGetDefaultMemPool(&pool, dev) : d.cuDeviceGetMemPool(&pool, dev);
    if (rc != CUDA_SUCCESS) return rc;
    out_pool(cx, pool);
    return CUDA_SUCCESS;
}

namespace {
// The attributes of 64 bits (cuuint64_t): the release threshold and the four memory figures; the others are
// int.
bool wide_attribute(CUmemPool_attribute a) { return a >= CU_MEMPOOL_ATTR_RELEASE_THRESHOLD; }
}  // namespace

// args {pool, attribute, value}; attributes of 32 bits travel in the low half.
CUresult handle_pool_set_attribute(call_context& cx) {
    if (!cx.expect_args(3)) return cx.bad_arguments();
    CUmemoryPool pool;
    if (CUresult rc = cx.handle(0, handle_kind::mem_pool, pool); rc != CUDA_SUCCESS) return rc;
    auto attr = static_cast<CUmemPool_attribute>(cx.arg(1));
    uint64_t wide = cx.arg(2);
    int narrow = static_cast<int>(wide);
    const bool is_wide = wide_attribute(attr);
    CUresult rc = cx.drv().cuMemPoolSetAttribute(
        pool, attr, is_wide ? static_cast<void*>(&wide) : static_cast<void*>(&narrow));
    if (rc != CUDA_SUCCESS || attr != CU_MEMPOOL_ATTR_RELEASE_THRESHOLD) return rc;
    // What the pool may keep reserved from now on (charged while it keeps it: handle_pool_free).
    std::lock_guard lock(cx.sess.mu);
    size_t device = 0;
    uint64_t over = cx.sess.pools.set_threshold(pool, wide, device);
    if (over && device < cx.sess.device_count()) cx.sess.memory(device).credit(over);
    return CUDA_SUCCESS;
}

// args {pool, attribute} -> outs {value}
CUresult handle_pool_get_attribute(call_context& cx) {
    if (!cx.expect_args(2)) return cx.bad_arguments();
    CUmemoryPool pool;
    if (CUresult rc = cx.handle(0, handle_kind::mem_pool, pool); rc != CUDA_SUCCESS) return rc;
    auto attr = static_cast<CUmemPool_attribute>(cx.arg(1));
    uint64_t wide = 0;
    int narrow = 0;
    const bool is_wide = wide_attribute(attr);
    if (CUresult rc = cx.drv().cuMemPoolGetAttribute(
            pool, attr, is_wide ? static_cast<void*>(&wide) : static_cast<void*>(&narrow));
        rc != CUDA_SUCCESS)
        return rc;
    cx.out(is_wide ? wide : static_cast<uint64_t>(static_cast<uint32_t>(narrow)));
    return CUDA_SUCCESS;
}

// args {pool, count}; blob {CUmemAccessDesc[count]} with the session's device indices.
CUresult handle_pool_set_access(call_context& cx) {
    if (!cx.expect_args(2) || cx.blob_count() != 1) return cx.bad_arguments();
    CUmemoryPool pool;
    if (CUresult rc = cx.handle(0, handle_kind::mem_pool, pool); rc != CUDA_SUCCESS) return rc;
    uint64_t count = cx.arg(1);
    auto b = cx.blob(0);
    if (count == 0 || count > 64 || b.size() != count * sizeof(CUmemAccessDesc)) return cx.bad_arguments();
    std::vector<CUmemAccessDesc> desc(count);
    std::memcpy(desc.data(), b.data(), b.size());
    for (auto& x : desc) {
        size_t device;
        if (CUresult rc = cx.device_location(x.location, device); rc != CUDA_SUCCESS) return rc;
    }
    return cx.drv().cuMemPoolSetAccess(pool, desc.data(), count);
}

// args {pool, device (session index)} -> outs {CUmemAccess_flags}
CUresult handle_pool_get_access(call_context& cx) {
    if (!cx.expect_args(2)) return cx.bad_arguments();
    CUmemoryPool pool;
    if (CUresult rc = cx.handle(0, handle_kind::mem_pool, pool); rc != CUDA_SUCCESS) return rc;
    CUdevice dev;
    if (CUresult rc = cx.device(1, dev); rc != CUDA_SUCCESS) return rc;
    CUmemLocation loc{};
    loc.type = CU_MEM_LOCATION_TYPE_DEVICE;
    loc.id = dev;
    CUmemAccess_flags flags{};
    if (CUresult rc = cx.drv().cuMemPoolGetAccess(&flags, pool, &loc); rc != CUDA_SUCCESS) return rc;
    cx.out(static_cast<uint64_t>(flags));
    return CUDA_SUCCESS;
}

}  // namespace vcuda::server
