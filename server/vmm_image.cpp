// The application's own use of the VMM API (PyTorch's expandable segments, JAX's allocator) in a suspend
// (server/session_image.cpp). Saved: each physical allocation's properties and contents, read through a
// mapping of the server's own (the application's mappings may not cover it, or may not be readable), and
// each mapping's access per GPU of the session. Given back: mappings unmapped, allocations released; the
// address reservations stay, as the session's own memory's do. Rebuilt: each allocation made again with its
// properties, its contents copied back, its handle id standing for the new one, mapped again at the same
// addresses and offsets with the same access. An allocation the application released while mapped is made
// again and released again once mapped, so that it still goes with its last unmap.
// Memory imported from another session (IPC) is not rebuilt: the suspend is refused (session_image.cpp).
// A move (server/session_transfer.cpp) sends the same: the bookkeeping and the allocations' contents; the
// target claims the reservations at the same addresses (they are in the address window, which every server
// reserves at one address) and rebuilds as after a suspend.
#include <algorithm>
#include <cstring>
#include <map>
#include <vector>

#include "common/wire.hpp"
#include "server/session.hpp"
#include "server/session_image.hpp"

namespace vcuda::server {

namespace {

// Copies all of physical allocation `h` (on real device `dev`) to or from `host`, through a mapping made for
// it. The caller has a context current.
CUresult copy_physical(const driver_table& d, CUmemGenericAllocationHandle h, size_t size, CUdevice dev,
                       std::byte* host, bool to_device) {
    CUdeviceptr va = 0;
    CUresult rc = d.cuMemAddressReserve(&va, size, 0, 0, 0);
    if (rc != CUDA_SUCCESS) return rc;
    rc = d.cuMemMap(va, size, 0, h, 0);
    if (rc == CUDA_SUCCESS) {
        CUmemAccessDesc a{};
        a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        a.location.id = dev;
        a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        rc = d.cuMemSetAccess(va, size, &a, 1);
        if (rc == CUDA_SUCCESS)
            rc = copy_registered(d, host, size, [&] {
                return to_device ? d.cuMemcpyHtoD_v2(va, host, size) : d.cuMemcpyDtoH_v2(host, va, size);
            });
        d.cuMemUnmap(va, size);
    }
    d.cuMemAddressFree(va, size);
    return rc;
}

}  // namespace

CUresult session::save_vmm(session_image& img, std::string& why, device_memory::save_mode memory) {
    auto& d = api();
    for (auto& [id, a] : vmm.allocations_) {
        if (a.device >= devices_.size() || !devices_[a.device].ctx) {
            why = "a physical allocation of the VMM API is on a GPU without a context";
            return CUDA_ERROR_NOT_SUPPORTED;
        }
        d.cuCtxSetCurrent(devices_[a.device].ctx);
        // A released allocation has no handle of the session's any more: one of its mappings gives one.
        CUmemGenericAllocationHandle h = 0;
        bool retained = false;
        if (const handle_entry* e = a.released ? nullptr : handles.find(id, handle_kind::mem_handle)) {
            h = reinterpret_cast<CUmemGenericAllocationHandle>(e->raw);
        } else {
            for (auto& [va, m] : vmm.mapped_)
                if (m.handle == id &&
                    d.cuMemRetainAllocationHandle(&h, reinterpret_cast<void*>(va)) == CUDA_SUCCESS) {
                    retained = true;
                    break;
                }
        }
        if (!h) {
            why = "the driver gave no handle of a physical allocation of the VMM API";
            return CUDA_ERROR_NOT_SUPPORTED;
        }
        session_image::vmm_allocation_state st;
        st.id = id;
        st.size = a.size;
        st.device = a.device;
        st.prop = a.prop;
        st.released = a.released;
        st.refs = a.refs;
        CUresult rc = CUDA_ERROR_NOT_SUPPORTED;
        if (memory == device_memory::save_mode::descriptor && a.exportable) {
            int fd = -1;
            rc = d.cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
            if (rc == CUDA_SUCCESS) {
                st.descriptor = device_memory::own_descriptor(fd);
                st.by_descriptor = true;
                img.handed_over += a.size;
            }
        }
        if (rc != CUDA_SUCCESS) {  // copied out
            st.bytes = host_pages(a.size);
            rc = st.bytes ? copy_physical(d, h, a.size, devices_[a.device].device, st.bytes.get(), false)
                          : CUDA_ERROR_OUT_OF_MEMORY;
        }
        if (retained) d.cuMemRelease(h);
        if (rc != CUDA_SUCCESS) {
            why = "a physical allocation of the VMM API could not be copied out (" + error_text(rc) + ")";
            return rc;
        }
        img.bytes += a.size;
        img.vmm_allocations.push_back(std::move(st));
    }
    for (auto& [va, m] : vmm.mapped_) {
        session_image::vmm_access_state st{va, {}};
        for (auto& s : devices_) {
            CUmemLocation where{CU_MEM_LOCATION_TYPE_DEVICE, s.device};
            unsigned long long flags = 0;
            if (s.allowed && d.cuMemGetAccess(&flags, &where, va) == CUDA_SUCCESS &&
                flags != CU_MEM_ACCESS_FLAGS_PROT_NONE)
                st.access.push_back({where, static_cast<CUmemAccess_flags>(flags)});
        }
        img.vmm_access.push_back(std::move(st));
    }
    return CUDA_SUCCESS;
}

void session::release_vmm_physical() {
    if (vmm.physical_released_ || vmm.allocations_.empty()) return;
    auto& d = api();
    for (auto& s : devices_)
        if (s.ctx) {
            d.cuCtxSetCurrent(s.ctx);
            break;
        }
    for (auto& [va, m] : vmm.mapped_) d.cuMemUnmap(va, m.size);
    for (auto& [id, a] : vmm.allocations_) {
        handle_entry* e = a.released ? nullptr : handles.find(id, handle_kind::mem_handle);
        if (e && e->raw) d.cuMemRelease(reinterpret_cast<CUmemGenericAllocationHandle>(e->raw));
        if (e) handles.rebind(id, nullptr);
    }
    vmm.physical_released_ = true;
}

CUresult session::rebuild_vmm(const session_image& img, std::string& what) {
    if (!vmm.physical_released_) return CUDA_SUCCESS;
    auto& d = api();
    std::map<uint64_t, CUmemGenericAllocationHandle> made;  // mem_handle id -> the new allocation
    std::vector<CUdeviceptr> mapped;
    // A failure leaves nothing of the rebuild behind: the session stays suspended, as it was.
    auto undo = [&](CUresult rc, const char* failed) {
        for (CUdeviceptr va : mapped) d.cuMemUnmap(va, vmm.mapped_[va].size);
        for (auto& [id, h] : made) {
            d.cuMemRelease(h);
            if (handles.find(id, handle_kind::mem_handle)) handles.rebind(id, nullptr);
        }
        what = failed;
        return rc;
    };
    for (auto& st : img.vmm_allocations) {
        if (st.device >= devices_.size() || !devices_[st.device].ctx)
            return undo(CUDA_ERROR_INVALID_CONTEXT, "a physical allocation of the VMM API has no context");
        d.cuCtxSetCurrent(devices_[st.device].ctx);
        CUmemGenericAllocationHandle h = 0;
        bool exportable = false;
        CUresult rc;
        if (st.by_descriptor) {  // handed over by the server it moved from, on the same GPU
            rc = st.fd() < 0 ? CUDA_ERROR_INVALID_HANDLE
                             : d.cuMemImportFromShareableHandle(
                                   &h, reinterpret_cast<void*>(static_cast<intptr_t>(st.fd())),
                                   CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
            exportable = true;
            if (rc == CUDA_SUCCESS) made[st.id] = h;
        } else {
            rc = create_physical(d, h, st.size, st.prop, 0, /*try_export=*/true, exportable);
            if (rc == CUDA_SUCCESS) {
                made[st.id] = h;
                rc = copy_physical(d, h, st.size, devices_[st.device].device, st.bytes.get(), true);
            }
        }
        if (rc != CUDA_SUCCESS)
            return undo(rc, "a physical allocation of the VMM API could not be made again");
        if (auto a = vmm.allocations_.find(st.id); a != vmm.allocations_.end())
            a->second.exportable = exportable;
    }
    for (auto& [va, m] : vmm.mapped_) {
        auto h = made.find(m.handle);
        CUresult rc =
            h == made.end() ? CUDA_ERROR_INVALID_HANDLE : d.cuMemMap(va, m.size, m.offset, h->second, 0);
        if (rc != CUDA_SUCCESS)
            return undo(rc, "a mapping of the VMM API could not be made again at its address");
        mapped.push_back(va);
    }
    for (auto& st : img.vmm_access) {
        auto m = vmm.mapped_.find(st.va);
        if (m == vmm.mapped_.end() || st.access.empty()) continue;
        if (CUresult rc = d.cuMemSetAccess(st.va, m->second.size, st.access.data(), st.access.size());
            rc != CUDA_SUCCESS)
            return undo(rc, "the access of a mapping of the VMM API could not be set again");
    }
    // The session's handles stand for the new allocations; those the application had released go with
    // their last unmap, as before the suspend.
    for (auto& st : img.vmm_allocations) {
        if (st.released)
            d.cuMemRelease(made[st.id]);
        else
            handles.rebind(st.id, reinterpret_cast<void*>(made[st.id]));
    }
    vmm.physical_released_ = false;
    return CUDA_SUCCESS;
}

CUresult session::take_moved_vmm(const wire::SessionState& st, session_image& img, std::string& why) {
    auto bad = [&](const std::string& what) {
        why = "the moved session's state is malformed: " + what;
        return CUDA_ERROR_INVALID_VALUE;
    };
    const auto* reservations = st.vmm_reservations();
    const auto* allocations = st.vmm_allocations();
    const auto* mappings = st.vmm_mappings();
    const auto* access = st.vmm_access();
    auto none = [](const auto* v) { return !v || v->size() == 0; };
    if (none(reservations) && none(allocations) && none(mappings) && none(access)) return CUDA_SUCCESS;
    if (reservations) {
        if (reservations->size() % 2) return bad("its VMM reservations");
        for (flatbuffers::uoffset_t k = 0; k < reservations->size(); k += 2) {
            const CUdeviceptr va = reservations->Get(k);
            const size_t size = reservations->Get(k + 1);
            if (!window() || !window()->claim(api(), va, size)) {
                why = "its VMM reservation of " + std::to_string(size >> 20) + " MiB at " +
                      std::to_string(va) + " is not free in this server's address space";
                return CUDA_ERROR_ALREADY_MAPPED;
            }
            vmm.add_reservation(va, size, true);
        }
    }
    if (allocations)
        for (const auto* a : *allocations) {
            const size_t device = a->device();
            CUmemAllocationProp prop;
            if (device >= devices_.size() || !allowed(device) || !vector_as(a->prop(), prop) ||
                a->size() == 0)
                return bad("a VMM allocation");
            if (!a->released() && !handles.find(a->id(), handle_kind::mem_handle))
                return bad("a VMM allocation without its handle");
            if (prop.location.type == CU_MEM_LOCATION_TYPE_DEVICE) prop.location.id = devices_[device].device;
            if (!devices_[device].memory->charge(a->size())) {
                why = "its VMM allocations exceed its memory quota here";
                return CUDA_ERROR_OUT_OF_MEMORY;
            }
            vmm.add_allocation(a->id(), a->size(), device, false, prop);
            vmm.allocations_[a->id()].released = a->released();
            vmm.allocations_[a->id()].refs = std::max(1u, a->refs());
            session_image::vmm_allocation_state s;
            s.id = a->id();
            s.size = a->size();
            s.device = device;
            s.prop = prop;
            s.released = a->released();
            if (a->by_descriptor()) {  // the physical memory itself, which must be this GPU's
                if (CUresult rc = check_handed_over_gpu(st, device, "VMM allocation", why);
                    rc != CUDA_SUCCESS)
                    return rc;
                s.by_descriptor = true;
                img.vmm_allocations.push_back(std::move(s));
                continue;
            }
            s.bytes = host_pages(a->size());
            if (!s.bytes) {
                why = "no host memory for its " + std::to_string(a->size() >> 20) + " MiB VMM allocation";
                return CUDA_ERROR_OUT_OF_MEMORY;
            }
            img.vmm_allocations.push_back(std::move(s));
        }
    if (mappings) {
        if (mappings->size() % 4) return bad("its VMM mappings");
        for (flatbuffers::uoffset_t k = 0; k < mappings->size(); k += 4) {
            const CUdeviceptr va = mappings->Get(k);
            const size_t size = mappings->Get(k + 1), offset = mappings->Get(k + 3);
            const uint64_t id = mappings->Get(k + 2);
            auto a = vmm.allocation_of(id);
            if (!vmm.reserved(va, size) || !a || offset > a->size || size > a->size - offset)
                return bad("a VMM mapping");
            vmm.add_mapping(va, size, id, offset);
        }
    }
    if (access)
        for (const auto* x : *access) {
            session_image::vmm_access_state s{x->va(), {}};
            if (!vmm.mapping_at(x->va()) || !x->access() || x->access()->size() % sizeof(CUmemAccessDesc))
                return bad("a VMM mapping's access");
            s.access.resize(x->access()->size() / sizeof(CUmemAccessDesc));
            std::memcpy(s.access.data(), x->access()->data(), x->access()->size());
            for (auto& d : s.access) {
                if (d.location.id < 0 || static_cast<size_t>(d.location.id) >= devices_.size())
                    return bad("a VMM mapping's access");
                d.location.id = devices_[static_cast<size_t>(d.location.id)].device;
            }
            img.vmm_access.push_back(std::move(s));
        }
    vmm.physical_released_ = true;
    return CUDA_SUCCESS;
}

}  // namespace vcuda::server
