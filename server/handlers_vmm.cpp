// The virtual memory management API as applications use it (PyTorch's expandable segments, NCCL, JAX):
// address reservations, physical allocations (charged to the session's quota), mappings and access. Every
// address and handle is checked against what this session reserved, created and mapped. Device locations
// arrive as the session's device indices and are turned into the real devices here.
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "server/call_context.hpp"
#include "server_ops.hpp"

namespace vcuda::server {

namespace {

// A CUmemAllocationProp from its bytes, its location turned into the real device.
CUresult allocation_prop(call_context& cx, std::span<const std::byte> b, CUmemAllocationProp& prop,
                         size_t& device, bool host_ok = false) {
    if (b.size() != sizeof prop) return cx.bad_arguments();
    std::memcpy(&prop, b.data(), sizeof prop);
    prop.win32HandleMetaData = nullptr;
    return cx.device_location(prop.location, device, host_ok);
}

// The allocation's memory went back to the driver: credit the quota.
void vmm_freed(session& s, const vmm_tables::allocation& a) {
    if (!a.foreign) s.memory(a.device).credit(a.size);
}

}  // namespace

CUresult handle_vmm_granularity(call_context& cx, const vmm_granularity_args& a) {
    CUmemAllocationProp prop;
    size_t device;
    if (CUresult rc = allocation_prop(cx, a.prop, prop, device, /*host_ok=*/true); rc != CUDA_SUCCESS)
        return rc;
    size_t g = 0;
    CUresult rc = cx.drv().cuMemGetAllocationGranularity(
        &g, &prop, static_cast<CUmemAllocationGranularity_flags>(a.option));
    if (rc == CUDA_SUCCESS) cx.out(static_cast<uint64_t>(g));
    return rc;
}

// In the server's address window when it has room, as the session's own memory is, so that the reservation
// can move with the session; the hint is ignored, as the driver ignores it (server/device_memory.hpp). A
// session's reservations take at most half of the window (128 GiB: XLA reserves 75% of an H200's 141 GB by
// default; PyTorch reserves 1.125 times the GPU's memory per segment kind and stream, which no window holds),
// so that the other sessions' memory still finds room there; past that they are the driver's, and the session
// cannot move.
CUresult handle_vmm_reserve(call_context& cx, const vmm_reserve_args& a) {
    const uint64_t size = a.size, align = a.alignment;
    CUdeviceptr va = 0;
    uint64_t in_window;
    {
        std::lock_guard lock(cx.sess.mu);
        in_window = cx.sess.vmm.windowed_bytes();
    }
    const bool plain = a.flags == 0 && size > 0 && size % device_memory::granularity == 0 &&
                       (align & (align - 1)) == 0 && align <= window_runs::span &&
                       size <= window_runs::span / 2 - std::min(in_window, window_runs::span / 2);
    if (address_window* w = cx.sess.window(); w && plain) va = w->take(cx.drv(), size, align);
    const bool windowed = va != 0;
    if (!windowed)
        if (CUresult rc = cx.drv().cuMemAddressReserve(&va, size, align, a.hint, a.flags); rc != CUDA_SUCCESS)
            return rc;
    std::lock_guard lock(cx.sess.mu);
    cx.sess.vmm.add_reservation(va, size, windowed);
    cx.out(static_cast<uint64_t>(va));
    return CUDA_SUCCESS;
}

CUresult handle_vmm_address_free(call_context& cx, const vmm_address_free_args& a) {
    CUdeviceptr va = a.address;
    std::lock_guard lock(cx.sess.mu);
    auto r = cx.sess.vmm.reservation(va);
    if (!r || r->size != a.size)
        return cx.fail(CUDA_ERROR_INVALID_VALUE, "not a reservation of this session");
    if (cx.sess.vmm.has_mapping_in(va, r->size))
        return cx.fail(CUDA_ERROR_INVALID_VALUE, "the reservation still has mappings");
    if (r->windowed) {
        cx.sess.window()->give_back(va, r->size);
    } else if (CUresult rc = cx.drv().cuMemAddressFree(va, r->size); rc != CUDA_SUCCESS) {
        return rc;
    }
    cx.sess.vmm.erase_reservation(va);
    return CUDA_SUCCESS;
}

CUresult handle_vmm_create(call_context& cx, const vmm_create_args& a) {
    CUmemAllocationProp prop;
    size_t device;
    if (CUresult rc = allocation_prop(cx, a.prop, prop, device); rc != CUDA_SUCCESS) return rc;
    size_t size = a.size;
    {
        std::lock_guard lock(cx.sess.mu);
        if (!cx.sess.memory(device).charge(size))
            return cx.fail(CUDA_ERROR_OUT_OF_MEMORY, "cuMemCreate of " + std::to_string(size) +
                                                         " bytes exceeds the session's memory quota");
    }
    CUmemGenericAllocationHandle h = 0;
    bool exportable = false;
    CUresult rc = create_physical(cx.drv(), h, size, prop, a.flags, /*try_export=*/true, exportable);
    std::lock_guard lock(cx.sess.mu);
    if (rc != CUDA_SUCCESS) {
        cx.sess.memory(device).credit(size);
        return rc;
    }
    handle_entry e;
    e.kind = handle_kind::mem_handle;
    e.raw = reinterpret_cast<void*>(h);
    e.device = static_cast<int>(device);
    uint64_t id = cx.sess.handles.insert(std::move(e));
    cx.sess.vmm.add_allocation(id, size, device, false, prop, exportable);
    cx.out(id);
    return CUDA_SUCCESS;
}

// As with the driver, the memory goes once no mapping uses it: the quota is credited then.
CUresult handle_vmm_release(call_context& cx, const vmm_release_args& a) {
    const uint64_t id = a.allocation_id;
    {
        std::lock_guard lock(cx.sess.mu);
        if (cx.sess.vmm.drop_reference(id)) return CUDA_SUCCESS;  // retained: the handle lives on
    }
    CUresult rc = cx.drv().cuMemRelease(reinterpret_cast<CUmemGenericAllocationHandle>(a.allocation));
    if (rc != CUDA_SUCCESS) return rc;
    std::lock_guard lock(cx.sess.mu);
    if (auto freed = cx.sess.vmm.release(id)) vmm_freed(cx.sess, *freed);
    cx.sess.handles.erase(id);
    // Its shareable handles open no more (sessions that imported it keep what they imported).
    if (auto it = cx.sess.ipc_state.allocation_exports.find(id);
        it != cx.sess.ipc_state.allocation_exports.end()) {
        if (cx.sess.ipc())
            for (const auto& t : it->second) cx.sess.ipc()->withdraw(t, cx.sess.id());
        cx.sess.ipc_state.allocation_exports.erase(it);
    }
    return CUDA_SUCCESS;
}

// The session's handle of the physical allocation mapped at the address, with one more reference
// (cuMemRelease drops it; NCCL retains before each free). Kept by the session, not the driver, whose handle
// is released at the last reference. Memory the application did not map through the VMM API (cuMemAlloc's)
// answers CUDA_ERROR_INVALID_VALUE, as the driver does; callers fall back to legacy IPC.
CUresult handle_vmm_retain(call_context& cx, const vmm_retain_args& a) {
    std::lock_guard lock(cx.sess.mu);
    bool released = false;
    const uint64_t id = cx.sess.vmm.retain_at(a.address, released);
    if (released)
        return cx.fail(CUDA_ERROR_NOT_SUPPORTED,
                       "cuMemRetainAllocationHandle of memory whose handle the application released already "
                       "(vcuda gives a handle back only while the application holds one)");
    if (!id)
        return cx.fail(CUDA_ERROR_INVALID_VALUE,
                       "no mapping of the VMM API of this session holds the address");
    cx.out(id);
    return CUDA_SUCCESS;
}

CUresult handle_vmm_map(call_context& cx, const vmm_map_args& a) {
    std::lock_guard lock(cx.sess.mu);
    if (!cx.sess.vmm.reserved(a.address, a.size))
        return cx.fail(CUDA_ERROR_INVALID_VALUE, "range is not inside a reservation of this session");
    CUresult rc = cx.drv().cuMemMap(a.address, a.size, a.offset,
                                    reinterpret_cast<CUmemGenericAllocationHandle>(a.allocation), a.flags);
    if (rc != CUDA_SUCCESS) return rc;
    cx.sess.vmm.add_mapping(a.address, a.size, a.allocation_id, a.offset);
    return CUDA_SUCCESS;
}

// Several mappings in one call, as the driver unmaps them (the CUDA sample memMapIPCDrv does so).
CUresult handle_vmm_unmap(call_context& cx, const vmm_unmap_args& a) {
    const CUdeviceptr va = a.address;
    const uint64_t size = a.size;
    std::lock_guard lock(cx.sess.mu);
    std::vector<CUdeviceptr> starts;
    for (uint64_t done = 0; done < size;) {
        auto m = cx.sess.vmm.mapping_at(va + done);
        if (!m || m->size > size - done)
            return cx.fail(CUDA_ERROR_INVALID_VALUE, "not whole mappings of this session");
        starts.push_back(va + done);
        done += m->size;
    }
    if (starts.empty()) return cx.fail(CUDA_ERROR_INVALID_VALUE, "not whole mappings of this session");
    CUresult rc = cx.drv().cuMemUnmap(va, size);
    if (rc != CUDA_SUCCESS) return rc;
    for (CUdeviceptr p : starts)
        if (auto freed = cx.sess.vmm.erase_mapping(p)) vmm_freed(cx.sess, *freed);
    return CUDA_SUCCESS;
}

CUresult handle_vmm_set_access(call_context& cx, const vmm_set_access_args& a) {
    const uint64_t count = a.count;
    auto b = a.access;
    if (count == 0 || count > 64 || b.size() != count * sizeof(CUmemAccessDesc)) return cx.bad_arguments();
    std::vector<CUmemAccessDesc> desc(count);
    std::memcpy(desc.data(), b.data(), b.size());
    for (auto& d : desc) {
        size_t device;
        if (CUresult rc = cx.device_location(d.location, device); rc != CUDA_SUCCESS) return rc;
    }
    CUdeviceptr va = a.address;
    size_t size = a.size;
    {
        std::lock_guard lock(cx.sess.mu);
        if (!cx.sess.vmm.reserved(va, size))
            return cx.fail(CUDA_ERROR_INVALID_VALUE, "range is not inside a reservation of this session");
    }
    return cx.drv().cuMemSetAccess(va, size, desc.data(), count);
}

CUresult handle_vmm_get_access(call_context& cx, const vmm_get_access_args& a) {
    if (a.location.size() != sizeof(CUmemLocation)) return cx.bad_arguments();
    CUmemLocation where;
    std::memcpy(&where, a.location.data(), sizeof where);
    size_t device;
    if (CUresult rc = cx.device_location(where, device); rc != CUDA_SUCCESS) return rc;
    const CUdeviceptr va = a.address;
    {
        std::lock_guard lock(cx.sess.mu);
        if (!cx.sess.vmm.reserved(va, 1))
            return cx.fail(CUDA_ERROR_INVALID_VALUE, "address is not inside a reservation of this session");
    }
    unsigned long long flags = 0;
    CUresult rc = cx.drv().cuMemGetAccess(&flags, &where, va);
    if (rc == CUDA_SUCCESS) cx.out(static_cast<uint64_t>(flags));
    return rc;
}

}  // namespace vcuda::server
