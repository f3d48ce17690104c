// A session's memory on one GPU, backed by the virtual memory management API at addresses the server picks,
// so the address space can be rebuilt elsewhere. Small allocations are packed into 2 MiB mappings, as the
// real allocator does; large ones get mappings of their own. The quota is checked before any mapping is made.
// locks: none inside; the session's mutex guards it.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "driver_table.hpp"

namespace vcuda::server {

// Where a server places its sessions' memory (--address-window N): a range of device addresses of its own,
// each address handed out once, so that a session moved here from another server with another window finds
// its addresses free (server/session_transfer.cpp). Reservations ask the driver for the next address as a
// hint; a driver that places one elsewhere is followed (that memory may not move). Without a window the
// driver picks every address.
class address_window {
  public:
    address_window() = default;
    explicit address_window(uint32_t index) : next_(base(index)), end_(base(index) + span) {}
    // A hint for a reservation of `size` bytes, or 0 (the driver picks) once the window is used up.
    CUdeviceptr take(size_t size) {
        if (end_ == 0) return 0;
        CUdeviceptr at = next_.fetch_add(size);
        return at + size <= end_ ? at : 0;
    }
    // Windows of 2 TiB from 16 TiB on: inside the 47-bit range the driver's unified addresses use.
    static constexpr CUdeviceptr first = CUdeviceptr{16} << 40;
    static constexpr CUdeviceptr span = CUdeviceptr{2} << 40;
    static constexpr uint32_t count = 48;
    static constexpr CUdeviceptr base(uint32_t index) { return first + CUdeviceptr{index} * span; }

  private:
    std::atomic<CUdeviceptr> next_{0};
    CUdeviceptr end_ = 0;
};

class device_memory {
  public:
    device_memory(const driver_table& drv, CUdevice dev, uint64_t quota, address_window* window = nullptr)
        : drv_(&drv), dev_(dev), quota_(quota), window_(window) {}

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

    // A session moved to another server (server/session_transfer.cpp): the bookkeeping, as it is, and on the
    // target adopt(), which reserves exactly the same addresses (an address taken there fails the move) and
    // charges the quota; restore() then maps memory there and copies the contents back.
    struct moved_mapping {
        CUdeviceptr va = 0;
        size_t size = 0;
        bool shared = false;
        size_t live = 0;
        std::map<size_t, size_t> free_runs;
    };
    using allocation_map = std::map<CUdeviceptr, std::pair<size_t, CUdeviceptr>>;  // start -> (size, mapping)
    std::vector<moved_mapping> mappings_to_move() const;
    const allocation_map& allocations() const { return allocations_; }
    CUresult adopt(const std::vector<moved_mapping>& mappings, allocation_map allocations,
                   uint64_t heap_charge, std::string& why);

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
    address_window* window_;
    allocation_map allocations_;  // start -> (size, its mapping)
};

}  // namespace vcuda::server
