// The virtual memory management API as applications use it (PyTorch's expandable segments, NCCL, JAX):
// address reservations, physical allocations (charged to the session's quota), mappings and access. Every
// address and handle is checked against what this session reserved, created and mapped. Device locations
// arrive as the session's device indices and are turned into the real devices here.
#include <cstdint>
#include <cstring>
#include <vector>

#include "server/call_context.hpp"

namespace vcuda::server {

namespace {

// A CUmemAllocationProp from blob `i`, its location turned into the real device.
CUresult allocation_prop(call_context& cx, size_t i, CUmemAllocationProp& prop, size_t& device,
                         bool host_ok = false) {
    auto b = cx.blob(i);
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

// args {flags}; blob {prop}. Out {granularity}.
CUresult handle_vmm_granularity(call_context& cx) {
    if (!cx.expect_args(1) || cx.blob_count() != 1) return cx.bad_arguments();
    CUmemAllocationProp prop;
    size_t device;
    if (CUresult rc = allocation_prop(cx, 0, prop, device, /*host_ok=*/true); rc != CUDA_SUCCESS) return rc;
    size_t g = 0;
    CUresult rc = cx.drv().cuMemGetAllocationGranularity(
        &g, &prop, static_cast<CUmemAllocationGranularity_flags>(cx.arg(0)));
    if (rc == CUDA_SUCCESS) cx.out(static_cast<uint64_t>(g));
    return rc;
}

// args {size, alignment, address hint, flags}. Out {start}. In the server's address window when it has room,
// as the session's own memory is, so that the reservation can move with the session; the hint is ignored,
// as the driver ignores it (server/device_memory.hpp). A session's reservations take at most half of the
// window (128 GiB: XLA reserves 75% of an H200's 141 GB by default; PyTorch reserves 1.125 times the GPU's
// memory per segment kind and stream, which no window holds), so that the other sessions' memory still finds
// room there; past that they are the driver's, and the session cannot move.
CUresult handle_vmm_reserve(call_context& cx) {
    if (!cx.expect_args(4)) return cx.bad_arguments();
    const uint64_t size = cx.arg(0), align = cx.arg(1);
    CUdeviceptr va = 0;
    uint64_t in_window;
    {
        std::lock_guard lock(cx.sess.mu);
        in_window = cx.sess.vmm.windowed_bytes();
    }
    const bool plain = cx.arg(3) == 0 && size > 0 && size % device_memory::granularity == 0 &&
                       (align & (align - 1)) == 0 && align <= window_runs::span &&
                       size <= window_runs::span / 2 - std::min(in_window, window_runs::span / 2);
    if (address_window* w = cx.sess.window(); w && plain) va = w->take(cx.drv(), size, align);
    const bool windowed = va != 0;
    if (!windowed)
        if (CUresult rc = cx.drv().cuMemAddressReserve(&va, size, align, cx.arg(2), cx.arg(3));
            rc != CUDA_SUCCESS)
            return rc;
    std::lock_guard lock(cx.sess.mu);
    cx.sess.vmm.add_reservation(va, size, windowed);
    cx.out(static_cast<uint64_t>(va));
    return CUDA_SUCCESS;
}

// args {start, size}: a whole reservation, nothing mapped in it any more.
CUresult handle_vmm_address_free(call_context& cx) {
    if (!cx.expect_args(2)) return cx.bad_arguments();
    CUdeviceptr va = cx.arg(0);
    std::lock_guard lock(cx.sess.mu);
    auto r = cx.sess.vmm.reservation(va);
    if (!r || r->size != cx.arg(1))
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

// args {size, flags}; blob {prop}. Out {mem_handle}.
CUresult handle_vmm_create(call_context& cx) {
    if (!cx.expect_args(2) || cx.blob_count() != 1) return cx.bad_arguments();
    CUmemAllocationProp prop;
    size_t device;
    if (CUresult rc = allocation_prop(cx, 0, prop, device); rc != CUDA_SUCCESS) return rc;
    size_t size = cx.arg(0);
    {
        std::lock_guard lock(cx.sess.mu);
        if (!cx.sess.memory(device).charge(size))
            return cx.fail(CUDA_ERROR_OUT_OF_MEMORY, "cuMemCreate of " + std::to_string(size) +
                                                         " bytes exceeds the session's memory quota");
    }
    CUmemGenericAllocationHandle h = 0;
    bool exportable = false;
    CUresult rc = create_physical(cx.drv(), h, size, prop, cx.arg(1), /*try_export=*/true, exportable);
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

// args {mem_handle}. As with the driver, the memory goes once no mapping uses it: the quota is credited then.
CUresult handle_vmm_release(call_context& cx) {
    if (!cx.expect_args(1)) return cx.bad_arguments();
    void* raw = nullptr;
    if (CUresult rc = cx.lookup(cx.arg(0), handle_kind::mem_handle, raw); rc != CUDA_SUCCESS) return rc;
    {
        std::lock_guard lock(cx.sess.mu);
        if (cx.sess.vmm.drop_reference(cx.arg(0))) return CUDA_SUCCESS;  // retained: the handle lives on
    }
    CUresult rc = cx.drv().cuMemRelease(reinterpret_cast<CUmemGenericAllocationHandle>(raw));
    if (rc != CUDA_SUCCESS) return rc;
    std::lock_guard lock(cx.sess.mu);
    if (auto freed = cx.sess.vmm.release(cx.arg(0))) vmm_freed(cx.sess, *freed);
    cx.sess.handles.erase(cx.arg(0));
    // Its shareable handles open no more (sessions that imported it keep what they imported).
    if (auto it = cx.sess.ipc_state.allocation_exports.find(cx.arg(0));
        it != cx.sess.ipc_state.allocation_exports.end()) {
        if (cx.sess.ipc())
            for (const auto& t : it->second) cx.sess.ipc()->withdraw(t, cx.sess.id());
        cx.sess.ipc_state.allocation_exports.erase(it);
    }
    return CUDA_SUCCESS;
}

// args {address}. Out {mem_handle}: the session's handle of the physical allocation mapped at the address,
// with one more reference (cuMemRelease drops it; NCCL retains before each free). Kept by the session, not
// the driver, whose handle is released at the last reference. Memory the application did not map through the
// VMM API (cuMemAlloc's) answers CUDA_ERROR_INVALID_VALUE, as the driver does; callers fall back to legacy
// IPC.
CUresult handle_vmm_retain(call_context& cx) {
    if (!cx.expect_args(1)) return cx.bad_arguments();
    std::lock_guard lock(cx.sess.mu);
    bool released = false;
    const uint64_t id = cx.sess.vmm.retain_at(cx.arg(0), released);
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

// args {start, size, offset, mem_handle, flags}.
CUresult handle_vmm_map(call_context& cx) {
    if (!cx.expect_args(5)) return cx.bad_arguments();
    CUdeviceptr va = cx.arg(0);
    size_t size = cx.arg(1);
    void* raw = nullptr;
    if (CUresult rc = cx.lookup(cx.arg(3), handle_kind::mem_handle, raw); rc != CUDA_SUCCESS) return rc;
    std::lock_guard lock(cx.sess.mu);
    if (!cx.sess.vmm.reserved(va, size))
        return cx.fail(CUDA_ERROR_INVALID_VALUE, "range is not inside a reservation of this session");
    CUresult rc = cx.drv().cuMemMap(va, size, cx.arg(2), reinterpret_cast<CUmemGenericAllocationHandle>(raw),
                                    cx.arg(4));
    if (rc != CUDA_SUCCESS) return rc;
    cx.sess.vmm.add_mapping(va, size, cx.arg(3), cx.arg(2));
    return CUDA_SUCCESS;
}

// args {start, size}: whole earlier mappings, back to back (the driver unmaps several in one call; the CUDA
// sample memMapIPCDrv does).
CUresult handle_vmm_unmap(call_context& cx) {
    if (!cx.expect_args(2)) return cx.bad_arguments();
    const CUdeviceptr va = cx.arg(0);
    const uint64_t size = cx.arg(1);
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

// args {start, size, count}; blob {CUmemAccessDesc[count]} with session device indices.
CUresult handle_vmm_set_access(call_context& cx) {
    if (!cx.expect_args(3) || cx.blob_count() != 1) return cx.bad_arguments();
    uint64_t count = cx.arg(2);
    auto b = cx.blob(0);
    if (count == 0 || count > 64 || b.size() != count * sizeof(CUmemAccessDesc)) return cx.bad_arguments();
    std::vector<CUmemAccessDesc> desc(count);
    std::memcpy(desc.data(), b.data(), b.size());
    for (auto& d : desc) {
        size_t device;
        if (CUresult rc = cx.device_location(d.location, device); rc != CUDA_SUCCESS) return rc;
    }
    CUdeviceptr va = cx.arg(0);
    size_t size = cx.arg(1);
    {
        std::lock_guard lock(cx.sess.mu);
        if (!cx.sess.vmm.reserved(va, size))
            return cx.fail(CUDA_ERROR_INVALID_VALUE, "range is not inside a reservation of this session");
    }
    return cx.drv().cuMemSetAccess(va, size, desc.data(), count);
}

// args {address}; blob {CUmemLocation with a session device index}. Out {flags}: the access that location has
// to the session's mapping at the address.
CUresult handle_vmm_get_access(call_context& cx) {
    if (!cx.expect_args(1) || cx.blob_count() != 1 || cx.blob(0).size() != sizeof(CUmemLocation))
        return cx.bad_arguments();
    CUmemLocation where;
    std::memcpy(&where, cx.blob(0).data(), sizeof where);
    size_t device;
    if (CUresult rc = cx.device_location(where, device); rc != CUDA_SUCCESS) return rc;
    const CUdeviceptr va = cx.arg(0);
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
