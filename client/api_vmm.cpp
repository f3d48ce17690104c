// The virtual memory management API (cuMemAddressReserve, cuMemCreate, cuMemMap, ...), forwarded to the
// server of the device the properties name (server/handlers_vmm.cpp). Reservations are also made here,
// PROT_NONE, so that nothing of this process lands in the device's address range; mapped ranges join the
// mirror's device allocations, so copies and pointer queries know them.
#include <sys/mman.h>

#include <cstring>
#include <map>
#include <mutex>

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

struct created {
    CUmemAllocationProp prop{};  // as the application gave it (client device ordinals)
    size_t size = 0;
    unsigned refs = 1;  // cuMemCreate's (or the import's), and one per cuMemRetainAllocationHandle
};

std::mutex vmm_mu;
std::map<uint64_t, created>& allocations() {  // mem_handle id -> what it was created with
    static auto* m = new std::map<uint64_t, created>();
    return *m;
}
std::map<CUdeviceptr, size_t>& local_reservations() {  // reservations also held in this address space
    static auto* m = new std::map<CUdeviceptr, size_t>();
    return *m;
}

// The property as the server must see it.
CUresult server_prop(const CUmemAllocationProp* in, CUmemAllocationProp& out, bool host_ok = false) {
    if (!in) return CUDA_ERROR_INVALID_VALUE;
    out = *in;
    out.win32HandleMetaData = nullptr;
    return server_location(out.location, host_ok);
}

std::span<const std::byte> bytes_of(const void* p, size_t n) { return {static_cast<const std::byte*>(p), n}; }

}  // namespace

VCUDA_API cuMemGetAllocationGranularity(size_t* granularity, const CUmemAllocationProp* prop,
                                        CUmemAllocationGranularity_flags option) noexcept {
    VCUDA_TRACE_HOOK(cuMemGetAllocationGranularity, granularity, prop, option);
    VCUDA_REQUIRE_INIT();
    if (!granularity) return CUDA_ERROR_INVALID_VALUE;
    CUmemAllocationProp p;
    if (CUresult rc = server_prop(prop, p, /*host_ok=*/true); rc != CUDA_SUCCESS) return rc;
    vmm_granularity_call c("cuMemGetAllocationGranularity", static_cast<unsigned>(option),
                           bytes_of(&p, sizeof p));
    if (CUresult rc = c.send_cached(); rc != CUDA_SUCCESS) return rc;
    *granularity = c.granularity();
    return CUDA_SUCCESS;
}

VCUDA_API cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr addr,
                              unsigned long long flags) noexcept {
    VCUDA_TRACE_HOOK(cuMemAddressReserve, ptr, size, alignment, addr, flags);
    VCUDA_REQUIRE_INIT();
    if (!ptr || size == 0) return CUDA_ERROR_INVALID_VALUE;
    vmm_reserve_call c("cuMemAddressReserve", size, alignment, addr, flags);
    if (CUresult rc = c.send_sync(); rc != CUDA_SUCCESS) return rc;
    CUdeviceptr va = c.address();
    if (!va) return CUDA_ERROR_UNKNOWN;
    void* want = reinterpret_cast<void*>(va);
    void* got =
        mmap(want, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
    std::lock_guard lock(vmm_mu);
    if (got == want)
        local_reservations()[va] = size;
    else if (got != MAP_FAILED)
        munmap(got, size);  // a kernel without MAP_FIXED_NOREPLACE put it elsewhere
    *ptr = va;
    return CUDA_SUCCESS;
}

VCUDA_API cuMemAddressFree(CUdeviceptr ptr, size_t size) noexcept {
    VCUDA_TRACE_HOOK(cuMemAddressFree, ptr, size);
    VCUDA_REQUIRE_INIT();
    if (CUresult rc = vmm_address_free_call("cuMemAddressFree", ptr, size).send_sync(); rc != CUDA_SUCCESS)
        return rc;
    std::lock_guard lock(vmm_mu);
    if (auto it = local_reservations().find(ptr); it != local_reservations().end()) {
        munmap(reinterpret_cast<void*>(ptr), it->second);
        local_reservations().erase(it);
    }
    return CUDA_SUCCESS;
}

VCUDA_API cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size, const CUmemAllocationProp* prop,
                      unsigned long long flags) noexcept {
    VCUDA_TRACE_HOOK(cuMemCreate, handle, size, prop, flags);
    VCUDA_REQUIRE_INIT();
    if (!handle || size == 0 || !prop) return CUDA_ERROR_INVALID_VALUE;
    // Host-located physical memory would be reachable by the CPU only in the server's process. Callers probe
    // for it and fall back (NCCL uses /dev/shm), so this is a refusal, not a failure.
    if (host_location(prop->location))
        return static_cast<CUresult>(
            unsupported("cuMemCreate of host-located memory (not shared with this process)"));
    CUmemAllocationProp p;
    if (CUresult rc = server_prop(prop, p); rc != CUDA_SUCCESS) return rc;
    vmm_create_call c("cuMemCreate", size, flags, bytes_of(&p, sizeof p));
    if (CUresult rc = c.send_sync(); rc != CUDA_SUCCESS) return rc;
    uint64_t id = reinterpret_cast<uint64_t>(c.allocation());
    {
        std::lock_guard lock(vmm_mu);
        allocations()[id] = {*prop, size};
    }
    *handle = id;
    return CUDA_SUCCESS;
}

VCUDA_API cuMemRelease(CUmemGenericAllocationHandle handle) noexcept {
    VCUDA_TRACE_HOOK(cuMemRelease, handle);
    VCUDA_REQUIRE_INIT();
    vmm_release_call c("cuMemRelease", reinterpret_cast<void*>(handle));
    if (CUresult rc = c.send_sync(); rc != CUDA_SUCCESS) return rc;
    std::lock_guard lock(vmm_mu);
    if (auto it = allocations().find(handle); it != allocations().end() && it->second.refs > 1) {
        --it->second.refs;  // retained: the handle stays valid (the server counts alike)
        return CUDA_SUCCESS;
    }
    c.forget(reinterpret_cast<void*>(handle), handle_kind::mem_handle);
    allocations().erase(handle);
    return CUDA_SUCCESS;
}

// The handle of the physical allocation mapped at `addr`, one more reference to it. The session's server
// answers from its tables (server/handlers_vmm.cpp); memory not mapped through the VMM API is refused with
// CUDA_ERROR_INVALID_VALUE, as by the driver.
VCUDA_API cuMemRetainAllocationHandle(CUmemGenericAllocationHandle* handle, void* addr) noexcept {
    VCUDA_TRACE_HOOK(cuMemRetainAllocationHandle, handle, addr);
    VCUDA_REQUIRE_INIT();
    if (!handle || !addr) return CUDA_ERROR_INVALID_VALUE;
    vmm_retain_call c("cuMemRetainAllocationHandle", reinterpret_cast<CUdeviceptr>(addr));
    if (CUresult rc = c.send_sync(); rc != CUDA_SUCCESS) return rc;
    const uint64_t id = c.allocation();
    std::lock_guard lock(vmm_mu);
    auto it = allocations().find(id);
    if (it == allocations().end()) return CUDA_ERROR_UNKNOWN;  // the server's tables and ours disagree
    ++it->second.refs;
    *handle = id;
    return CUDA_SUCCESS;
}

VCUDA_API cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                   unsigned long long flags) noexcept {
    VCUDA_TRACE_HOOK(cuMemMap, ptr, size, offset, handle, flags);
    VCUDA_REQUIRE_INIT();
    int device = 0;
    {
        std::lock_guard lock(vmm_mu);
        auto it = allocations().find(handle);
        if (it == allocations().end()) return CUDA_ERROR_INVALID_HANDLE;
        device = it->second.prop.location.id;
    }
    vmm_map_call c("cuMemMap", ptr, size, offset, reinterpret_cast<void*>(handle), flags);
    if (CUresult rc = c.send_sync(); rc != CUDA_SUCCESS) return rc;
    state::get().add_allocation(ptr, size, device);
    return CUDA_SUCCESS;
}

VCUDA_API cuMemUnmap(CUdeviceptr ptr, size_t size) noexcept {
    VCUDA_TRACE_HOOK(cuMemUnmap, ptr, size);
    VCUDA_REQUIRE_INIT();
    if (CUresult rc = vmm_unmap_call("cuMemUnmap", ptr, size).send_sync(); rc != CUDA_SUCCESS) return rc;
    // Every mapping in the range (cuMemMap added each as an allocation of its own).
    device_allocation a;
    for (CUdeviceptr p = ptr; p < ptr + size && state::get().remove_allocation(p, a);) p += a.size;
    return CUDA_SUCCESS;
}

VCUDA_API cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count) noexcept {
    VCUDA_TRACE_HOOK(cuMemSetAccess, ptr, size, desc, count);
    VCUDA_REQUIRE_INIT();
    if (!desc || count == 0 || count > 64) return CUDA_ERROR_INVALID_VALUE;
    std::vector<CUmemAccessDesc> d(desc, desc + count);
    for (auto& x : d)
        if (CUresult rc = server_location(x.location); rc != CUDA_SUCCESS) return rc;
    return vmm_set_access_call("cuMemSetAccess", ptr, size, count,
                               bytes_of(d.data(), d.size() * sizeof(CUmemAccessDesc)))
        .send_sync();
}

VCUDA_API cuMemGetAccess(unsigned long long* flags, const CUmemLocation* location, CUdeviceptr ptr) noexcept {
    VCUDA_TRACE_HOOK(cuMemGetAccess, flags, location, ptr);
    VCUDA_REQUIRE_INIT();
    if (!flags || !location) return CUDA_ERROR_INVALID_VALUE;
    CUmemLocation where = *location;
    if (CUresult rc = server_location(where); rc != CUDA_SUCCESS) return rc;
    vmm_get_access_call c("cuMemGetAccess", ptr, bytes_of(&where, sizeof where));
    if (CUresult rc = c.send_sync(); rc != CUDA_SUCCESS) return rc;
    *flags = c.flags();
    return CUDA_SUCCESS;
}

VCUDA_API cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp* prop,
                                                 CUmemGenericAllocationHandle handle) noexcept {
    VCUDA_TRACE_HOOK(cuMemGetAllocationPropertiesFromHandle, prop, handle);
    VCUDA_REQUIRE_INIT();
    if (!prop) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard lock(vmm_mu);
    auto it = allocations().find(handle);
    if (it == allocations().end()) return CUDA_ERROR_INVALID_HANDLE;
    *prop = it->second.prop;
    return CUDA_SUCCESS;
}

// ---------------------------------------------------------------- shareable handles
// (server/handlers_ipc.cpp) A POSIX file descriptor is all that is served: a memfd naming the server's export
// (client/ipc_handles.hpp), which another process of the same tenant on the same server imports. It opens
// while the exporting process holds the allocation (with the driver: while any descriptor of it is open).

VCUDA_API cuMemExportToShareableHandle(void* shareableHandle, CUmemGenericAllocationHandle handle,
                                       CUmemAllocationHandleType handleType,
                                       unsigned long long flags) noexcept {
    VCUDA_TRACE_HOOK(cuMemExportToShareableHandle, shareableHandle, handle, handleType, flags);
    VCUDA_REQUIRE_INIT();
    if (!shareableHandle || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return static_cast<CUresult>(
            unsupported("cuMemExportToShareableHandle to a handle type other than a POSIX file descriptor"));
    int device = 0;
    {
        std::lock_guard lock(vmm_mu);
        auto it = allocations().find(handle);
        if (it == allocations().end()) return CUDA_ERROR_INVALID_VALUE;
        device = it->second.prop.location.id;
    }
    auto& st = state::get();
    if (device < 0 || device >= st.device_count()) return CUDA_ERROR_INVALID_VALUE;
    context_scope scope(st.primary_context(device));  // the allocation's server
    ipc_export_call c("cuMemExportToShareableHandle", what_allocation, handle);
    return export_descriptor(c, "cuMemExportToShareableHandle", shareableHandle);
}

VCUDA_API cuMemImportFromShareableHandle(CUmemGenericAllocationHandle* handle, void* osHandle,
                                         CUmemAllocationHandleType shHandleType) noexcept {
    VCUDA_TRACE_HOOK(cuMemImportFromShareableHandle, handle, osHandle, shHandleType);
    VCUDA_REQUIRE_INIT();
    if (!handle) return CUDA_ERROR_INVALID_VALUE;
    if (shHandleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return static_cast<CUresult>(unsupported(
            "cuMemImportFromShareableHandle from a handle type other than a POSIX file descriptor"));
    ipc_bytes bytes;
    if (!handle_in_descriptor(osHandle, "cuMemImportFromShareableHandle", bytes))
        return CUDA_ERROR_INVALID_VALUE;
    if (current_device() < 0) return CUDA_ERROR_INVALID_CONTEXT;
    ipc_open_call c("cuMemImportFromShareableHandle", what_allocation, 0, bytes);
    if (CUresult rc = c.send_sync(); rc != CUDA_SUCCESS)
        return refused_by_server("cuMemImportFromShareableHandle", rc, c);
    auto& st = state::get();
    const int device = st.client_device(static_cast<int>(c.out<uint64_t>(2)));  // the memory's GPU
    uint64_t id = reinterpret_cast<uint64_t>(c.out_handle<void*>(0, handle_kind::mem_handle));
    if (device < 0) return CUDA_ERROR_UNKNOWN;
    created made;
    made.prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    made.prop.location = {CU_MEM_LOCATION_TYPE_DEVICE, device};
    made.prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    made.size = c.out<uint64_t>(1);
    {
        std::lock_guard lock(vmm_mu);
        allocations()[id] = made;
    }
    *handle = id;
    return CUDA_SUCCESS;
}
