// Stream-ordered allocation and memory pools, forwarded to the current device's server
// (server/handlers_pool.cpp). An allocation's address is needed at once, so cuMemAllocAsync waits for the
// server; frees are queued (checked here against the mirror first, so a bad pointer still fails at the call).
// Stream-ordered allocations join the mirror's device allocations: copies and pointer queries know them.
#include <cstring>

#include "client/copy_paths.hpp"
#include "client/entry_point.hpp"
#include "client/ipc_handles.hpp"
#include "client/plain_call.hpp"
#include "client/remote_call.hpp"
#include "client/state.hpp"
#include "client/trace.hpp"
#include "client_ops.hpp"

using namespace vcuda;
using namespace vcuda::client;

namespace {

CUresult alloc_async(CUdeviceptr* dptr, size_t size, CUmemoryPool pool, CUstream stream) {
    VCUDA_REQUIRE_INIT();
    if (!dptr || size == 0) return CUDA_ERROR_INVALID_VALUE;
    int d = current_device();
    if (d < 0) return CUDA_ERROR_INVALID_CONTEXT;
    pool_alloc_call c(pool ? "cuMemAllocFromPoolAsync" : "cuMemAllocAsync", size, stream, pool);
    if (CUresult rc = c.send_sync(); rc != CUDA_SUCCESS) return rc;
    auto p = c.address();
    if (!p) return CUDA_ERROR_UNKNOWN;
    // Made in a capture, it is a memory alloc node's: its address is the graph's (client/api_graph.cpp).
    const bool graph = capture_under_way() && stream_captures(stream);
    if (!state::get().add_allocation(p, size, d, false, false, graph) && !graph) {
        (void)pool_free_call("cuMemFreeAsync", p, stream).send_async();
        return refuse_overlapping(p, size, d, pool ? "cuMemAllocFromPoolAsync" : "cuMemAllocAsync");
    }
    *dptr = p;
    return CUDA_SUCCESS;
}

// The attributes of 64 bits (cuuint64_t): the release threshold and the four memory figures.
bool wide_attribute(CUmemPool_attribute a) { return a >= CU_MEMPOOL_ATTR_RELEASE_THRESHOLD; }
bool known_attribute(CUmemPool_attribute a) {
    return a >= CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES && a <= CU_MEMPOOL_ATTR_USED_MEM_HIGH;
}

CUresult device_pool(CUmemoryPool* pool, CUdevice dev, uint64_t which, const char* name) {
    VCUDA_REQUIRE_INIT();
    if (!pool) return CUDA_ERROR_INVALID_VALUE;
    device_pool_call c(name, dev,
                       which);  // to the session serving `dev`, which may not be the current context's
    if (CUresult rc = c.send_sync(); rc != CUDA_SUCCESS) return rc;
    *pool = c.pool();
    return CUDA_SUCCESS;
}

}  // namespace

VCUDA_API cuMemAllocAsync(CUdeviceptr* dptr, size_t bytesize, CUstream hStream) noexcept {
    VCUDA_TRACE_HOOK(cuMemAllocAsync, dptr, bytesize, hStream);
    return alloc_async(dptr, bytesize, nullptr, hStream);
}

VCUDA_API cuMemAllocFromPoolAsync(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool,
                                  CUstream hStream) noexcept {
    VCUDA_TRACE_HOOK(cuMemAllocFromPoolAsync, dptr, bytesize, pool, hStream);
    if (!pool) return CUDA_ERROR_INVALID_VALUE;
    return alloc_async(dptr, bytesize, pool, hStream);
}

VCUDA_API cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) noexcept {
    VCUDA_TRACE_HOOK(cuMemFreeAsync, dptr, hStream);
    VCUDA_REQUIRE_INIT();
    // NULL: nothing to free, as with the driver (cuSPARSE frees its csrilu02 info's unused buffers so, and
    // reported CUSPARSE_STATUS_INVALID_VALUE when this failed).
    if (dptr == 0) return check_stream(hStream);
    device_allocation a;
    if (!state::get().find_allocation(dptr, 1, a) || a.base != dptr) return CUDA_ERROR_INVALID_VALUE;
    if (CUresult rc = pool_free_call("cuMemFreeAsync", dptr, hStream).send_async(); rc != CUDA_SUCCESS)
        return rc;
    state::get().remove_allocation(dptr, a);
    return CUDA_SUCCESS;
}

VCUDA_API cuMemPoolCreate(CUmemoryPool* pool, const CUmemPoolProps* poolProps) noexcept {
    VCUDA_TRACE_HOOK(cuMemPoolCreate, pool, poolProps);
    VCUDA_REQUIRE_INIT();
    if (!pool || !poolProps) return CUDA_ERROR_INVALID_VALUE;
    CUmemPoolProps p = *poolProps;
    p.win32SecurityAttributes = nullptr;
    if (p.location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return static_cast<CUresult>(
            unsupported("cuMemPoolCreate of a host-located pool (not shared with this process)"));
    if (CUresult rc = server_location(p.location); rc != CUDA_SUCCESS) return rc;
    pool_create_call c("cuMemPoolCreate", {reinterpret_cast<const std::byte*>(&p), sizeof p});
    if (CUresult rc = c.send_sync(); rc != CUDA_SUCCESS) return rc;
    *pool = c.pool();
    return CUDA_SUCCESS;
}

VCUDA_API cuMemPoolDestroy(CUmemoryPool pool) noexcept {
    VCUDA_TRACE_HOOK(cuMemPoolDestroy, pool);
    pool_destroy_call c("cuMemPoolDestroy", pool);
    if (CUresult rc = c.send_sync(); rc != CUDA_SUCCESS) return rc;
    c.forget_destroyed();
    return CUDA_SUCCESS;
}

VCUDA_API cuDeviceGetDefaultMemPool(CUmemoryPool* pool, CUdevice dev) noexcept {
    VCUDA_TRACE_HOOK(cuDeviceGetDefaultMemPool, pool, dev);
    return device_pool(pool, dev, 0, "cuDeviceGetDefaultMemPool");
}

VCUDA_API cuDeviceGetMemPool(CUmemoryPool* pool, CUdevice dev) noexcept {
    VCUDA_TRACE_HOOK(cuDeviceGetMemPool, pool, dev);
    return device_pool(pool, dev, 1, "cuDeviceGetMemPool");
}

// CUDA 13's pools by location and allocation type: a device's pinned pools are the device's (above);
// host-located and managed pools are not served (the server's host memory is not this process's).
CUresult location_pool(CUmemoryPool* pool, const CUmemLocation* location, CUmemAllocationType type,
                       uint64_t which, const char* name) {
    if (!pool || !location) return CUDA_ERROR_INVALID_VALUE;
    if (location->type != CU_MEM_LOCATION_TYPE_DEVICE || type != CU_MEM_ALLOCATION_TYPE_PINNED) {
        std::string what = std::string(name) + " (a host-located or managed pool)";
        return static_cast<CUresult>(unsupported(what.c_str()));
    }
    return device_pool(pool, location->id, which, name);
}

VCUDA_API cuMemGetDefaultMemPool(CUmemoryPool* pool_out, CUmemLocation* location,
                                 CUmemAllocationType type) noexcept {
    VCUDA_TRACE_HOOK(cuMemGetDefaultMemPool, pool_out, location, type);
    return location_pool(pool_out, location, type, 0, "cuMemGetDefaultMemPool");
}

VCUDA_API cuMemGetMemPool(CUmemoryPool* pool, CUmemLocation* location, CUmemAllocationType type) noexcept {
    VCUDA_TRACE_HOOK(cuMemGetMemPool, pool, location, type);
    return location_pool(pool, location, type, 1, "cuMemGetMemPool");
}

VCUDA_API cuMemSetMemPool(CUmemLocation* location, CUmemAllocationType type, CUmemoryPool pool) noexcept {
    VCUDA_TRACE_HOOK(cuMemSetMemPool, location, type, pool);
    if (!location) return CUDA_ERROR_INVALID_VALUE;
    if (location->type != CU_MEM_LOCATION_TYPE_DEVICE || type != CU_MEM_ALLOCATION_TYPE_PINNED)
        return static_cast<CUresult>(unsupported("cuMemSetMemPool (a host-located or managed pool)"));
    return cuDeviceSetMemPool(location->id, pool);
}

VCUDA_API cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void* value) noexcept {
    VCUDA_TRACE_HOOK(cuMemPoolSetAttribute, pool, attr, value);
    VCUDA_REQUIRE_INIT();
    if (!value || !known_attribute(attr)) return CUDA_ERROR_INVALID_VALUE;
    uint64_t v = 0;
    if (wide_attribute(attr))
        std::memcpy(&v, value, sizeof(uint64_t));
    else
        v = static_cast<uint32_t>(*static_cast<const int*>(value));
    return pool_set_attribute_call("cuMemPoolSetAttribute", pool, static_cast<unsigned>(attr), v).send_sync();
}

VCUDA_API cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void* value) noexcept {
    VCUDA_TRACE_HOOK(cuMemPoolGetAttribute, pool, attr, value);
    VCUDA_REQUIRE_INIT();
    if (!value || !known_attribute(attr)) return CUDA_ERROR_INVALID_VALUE;
    pool_get_attribute_call c("cuMemPoolGetAttribute", pool, static_cast<unsigned>(attr));
    if (CUresult rc = c.send_sync(); rc != CUDA_SUCCESS) return rc;
    uint64_t v = c.value();
    if (wide_attribute(attr))
        std::memcpy(value, &v, sizeof v);
    else
        *static_cast<int*>(value) = static_cast<int>(v);
    return CUDA_SUCCESS;
}

VCUDA_API cuMemPoolSetAccess(CUmemoryPool pool, const CUmemAccessDesc* map, size_t count) noexcept {
    VCUDA_TRACE_HOOK(cuMemPoolSetAccess, pool, map, count);
    VCUDA_REQUIRE_INIT();
    if (!map || count == 0 || count > 64) return CUDA_ERROR_INVALID_VALUE;
    std::vector<CUmemAccessDesc> desc(map, map + count);
    for (auto& d : desc)
        if (CUresult rc = server_location(d.location); rc != CUDA_SUCCESS) return rc;
    return pool_set_access_call(
               "cuMemPoolSetAccess", pool, count,
               {reinterpret_cast<const std::byte*>(desc.data()), desc.size() * sizeof(CUmemAccessDesc)})
        .send_sync();
}

VCUDA_API cuMemPoolGetAccess(CUmemAccess_flags* flags, CUmemoryPool memPool,
                             CUmemLocation* location) noexcept {
    VCUDA_TRACE_HOOK(cuMemPoolGetAccess, flags, memPool, location);
    VCUDA_REQUIRE_INIT();
    if (!flags || !location) return CUDA_ERROR_INVALID_VALUE;
    CUmemLocation loc = *location;
    if (CUresult rc = server_location(loc); rc != CUDA_SUCCESS) return rc;  // a device of this server
    pool_get_access_call c("cuMemPoolGetAccess", memPool, location->id);
    if (CUresult rc = c.send_sync(); rc != CUDA_SUCCESS) return rc;
    *flags = static_cast<CUmemAccess_flags>(c.flags());
    return CUDA_SUCCESS;
}

// ---------------------------------------------------------------- pools shared between processes
// (server/handlers_ipc.cpp) A pool's shareable handle is a POSIX file descriptor naming the server's export
// (client/ipc_handles.hpp), which another process of the same tenant on the same server imports; the
// allocations then travel as the driver's own export data.

VCUDA_API cuMemPoolExportToShareableHandle(void* handle_out, CUmemoryPool pool,
                                           CUmemAllocationHandleType handleType,
                                           unsigned long long flags) noexcept {
    VCUDA_TRACE_HOOK(cuMemPoolExportToShareableHandle, handle_out, pool, handleType, flags);
    VCUDA_REQUIRE_INIT();
    if (!handle_out || !pool || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return static_cast<CUresult>(unsupported(
            "cuMemPoolExportToShareableHandle to a handle type other than a POSIX file descriptor"));
    const auto id = reinterpret_cast<uint64_t>(pool);
    if (!valid_handle(id, handle_kind::mem_pool))
        return CUDA_ERROR_INVALID_HANDLE;  // not one of this process's
    ipc_export_call c("cuMemPoolExportToShareableHandle", what_pool, id);
    return export_descriptor(c, "cuMemPoolExportToShareableHandle", handle_out);
}

VCUDA_API cuMemPoolImportFromShareableHandle(CUmemoryPool* pool_out, void* handle,
                                             CUmemAllocationHandleType handleType,
                                             unsigned long long flags) noexcept {
    VCUDA_TRACE_HOOK(cuMemPoolImportFromShareableHandle, pool_out, handle, handleType, flags);
    VCUDA_REQUIRE_INIT();
    if (!pool_out || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return static_cast<CUresult>(unsupported(
            "cuMemPoolImportFromShareableHandle from a handle type other than a POSIX file descriptor"));
    ipc_bytes bytes;
    if (!handle_in_descriptor(handle, "cuMemPoolImportFromShareableHandle", bytes))
        return CUDA_ERROR_INVALID_VALUE;
    if (current_device() < 0) return CUDA_ERROR_INVALID_CONTEXT;
    ipc_open_call c("cuMemPoolImportFromShareableHandle", what_pool, 0, bytes);
    if (CUresult rc = c.send_sync(); rc != CUDA_SUCCESS)
        return refused_by_server("cuMemPoolImportFromShareableHandle", rc, c);
    *pool_out = c.out_handle<CUmemoryPool>(0, handle_kind::mem_pool);
    return CUDA_SUCCESS;
}

VCUDA_API cuMemPoolExportPointer(CUmemPoolPtrExportData* shareData_out, CUdeviceptr ptr) noexcept {
    VCUDA_TRACE_HOOK(cuMemPoolExportPointer, shareData_out, ptr);
    VCUDA_REQUIRE_INIT();
    if (!shareData_out) return CUDA_ERROR_INVALID_VALUE;
    device_allocation a;
    if (!state::get().find_allocation(ptr, 1, a) || a.base != ptr) return CUDA_ERROR_INVALID_VALUE;
    context_scope scope(state::get().primary_context(a.device));  // the allocation's server
    pool_export_pointer_call c("cuMemPoolExportPointer", ptr);
    if (CUresult rc = c.send_sync(); rc != CUDA_SUCCESS) return rc;
    if (c.export_data().size() != sizeof *shareData_out) return CUDA_ERROR_UNKNOWN;
    std::memcpy(shareData_out, c.export_data().data(), sizeof *shareData_out);
    return CUDA_SUCCESS;
}

VCUDA_API cuMemPoolImportPointer(CUdeviceptr* ptr_out, CUmemoryPool pool,
                                 CUmemPoolPtrExportData* shareData) noexcept {
    VCUDA_TRACE_HOOK(cuMemPoolImportPointer, ptr_out, pool, shareData);
    VCUDA_REQUIRE_INIT();
    if (!ptr_out || !pool || !shareData) return CUDA_ERROR_INVALID_VALUE;
    pool_import_pointer_call c("cuMemPoolImportPointer", pool,
                               {reinterpret_cast<const std::byte*>(shareData), sizeof *shareData});
    if (CUresult rc = c.send_sync(); rc != CUDA_SUCCESS) return rc;
    auto& st = state::get();
    const auto p = c.address(), bytes = c.bytes();
    const int device = st.client_device(static_cast<int>(c.device_index()));  // the memory's GPU
    if (device < 0 || !p) return CUDA_ERROR_UNKNOWN;
    st.add_allocation(p, bytes, device, false, false, false);
    *ptr_out = p;
    return CUDA_SUCCESS;
}
