// A session's memory on one GPU, backed by the virtual memory management API at addresses the server picks,
// so the address space can be rebuilt elsewhere. Small allocations are packed into 2 MiB mappings, as the
// real allocator does; large ones get mappings of their own. The quota is checked before any mapping is made.
// locks: none inside; the session's mutex guards it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "driver_table.hpp"

namespace vcuda::server {

class device_memory {
  public:
    device_memory(const driver_table& drv, CUdevice dev, uint64_t quota)
        : drv_(&drv), dev_(dev), quota_(quota) {}

    CUresult allocate(size_t size, CUdeviceptr& out);
    CUresult release(CUdeviceptr p);  // only the exact start of a live allocation
    // True when [p, p+n) lies inside one live allocation (overflow-safe).
    bool contains(CUdeviceptr p, size_t n) const;
    // Unmaps everything (session end, context reset). The caller has synchronized the GPU.
    void release_all();

    uint64_t mapped() const { return mapped_; }  // bytes of GPU memory charged to the session
    uint64_t resident() const { return resident_ ? mapped_ : 0; }  // of them, on the GPU now (not suspended)

    // Suspend and resume (server/session_image.cpp): save() copies every mapping out (the caller synchronized
    // the GPU and made the context current); drop_physical() gives the memory back to the driver but keeps
    // the address reservations and the allocations' bookkeeping; restore() maps new memory at the same
    // addresses and copies the saved contents back. The quota charge stays throughout.
    struct unmap_bytes {
        size_t size = 0;
        void operator()(std::byte* p) const;
    };
    struct saved_mapping {
        CUdeviceptr va = 0;
        size_t size = 0;
        std::unique_ptr<std::byte, unmap_bytes> bytes;  // mapped: back to the system when freed
    };
    CUresult save(std::vector<saved_mapping>& out) const;
    void drop_physical();
    CUresult restore(const std::vector<saved_mapping>& saved);
    // Physical memory the session creates itself (cuMemCreate) counts against the same quota.
    bool charge(size_t size) {
        if (quota_ && (size > quota_ || mapped_ > quota_ - size)) return false;
        mapped_ += size;
        return true;
    }
    void credit(size_t size) { mapped_ -= std::min<uint64_t>(size, mapped_); }
    // The device-side malloc heap the context's limit makes the driver hold (cuCtxSetLimit), charged at its
    // set size (server/quota_checks.cpp); credited back when the context's memory is released.
    uint64_t heap_charge() const { return heap_charge_; }
    void set_heap_charge(uint64_t bytes) { heap_charge_ = bytes; }
    uint64_t quota() const { return quota_; }
    size_t allocation_count() const { return allocations_.size(); }

    static constexpr size_t granularity = 2u << 20;
    static constexpr size_t small_limit = 1u << 20;  // allocations up to this share 2 MiB mappings
    static constexpr size_t small_align = 512;

  private:
    struct mapping {
        size_t size = 0;
        CUmemGenericAllocationHandle handle = 0;
        bool shared = false;                 // holds small allocations
        std::map<size_t, size_t> free_runs;  // offset -> length, for shared mappings
        size_t live = 0;                     // allocations inside
    };

    CUresult map_new(size_t size, bool shared, CUdeviceptr& va);
    CUresult map_at(CUdeviceptr va, size_t size, CUmemGenericAllocationHandle& h);
    void unmap(CUdeviceptr va, mapping& m);

    const driver_table* drv_;
    CUdevice dev_;
    uint64_t quota_;
    uint64_t mapped_ = 0;
    uint64_t heap_charge_ = 0;
    bool resident_ = true;
    std::map<CUdeviceptr, mapping> mappings_;
    std::map<CUdeviceptr, std::pair<size_t, CUdeviceptr>> allocations_;  // start -> (size, its mapping)
};

}  // namespace vcuda::server
