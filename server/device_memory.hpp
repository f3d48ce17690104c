// A session's memory on one GPU, backed by the virtual memory management API at addresses the server picks,
// so the address space can be rebuilt elsewhere. Small allocations are packed into 2 MiB mappings, as the
// real allocator does; large ones get mappings of their own. The quota is checked before any mapping is made.
// locks: none inside; the session's mutex guards it.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "driver_table.hpp"
#include "server/window_runs.hpp"

namespace vcuda::server {

// Where a server places its sessions' memory (--address-window N), so that a session moved here from another
// server finds its device addresses free. The driver ignores address hints (measured on the H200: every hint
// gave the driver's next address), but places one large reservation at the same address in every process
// (16 TiB at 0x10004000000 on the H200, with or without ASLR). So every server reserves that same range, and
// maps its own sessions' memory only in its window of it (one of `count`); a session moved here keeps
// addresses in its old server's window, which this server never hands out. Ranges of a session that moved
// away are not handed out again (another of its sessions moving to the same server would collide).
// locks: its own mutex.
class address_window {
  public:
    explicit address_window(uint32_t index) : index_(index) {}
    uint32_t index() const { return index_.load(); }
    // Another window (the manager's, for a server that chose its own: --address-window auto), only while
    // nothing of this one was handed out: true when it is this one now.
    bool reassign(uint32_t index);
    // --isolation process, in the parent: its workers hand out this window's runs from now on.
    void note_used() {
        std::lock_guard lock(mu_);
        used_ = true;
    }
    // --isolation process: the window's free runs are the parent's, shared by all its workers, so that no
    // two of its sessions have the same addresses (they may all move to one other server): a worker asks the
    // parent for a range (base: where this process's driver put the common range), gives it back, claims one.
    struct shared_runs {
        std::function<uint64_t(uint64_t base, uint64_t size, uint64_t align)> take;  // 0: none free
        std::function<void(uint64_t at, uint64_t size)> give_back;
        std::function<bool(uint64_t base, uint64_t at, uint64_t size)> claim;
    };  // (a worker whose session moved away keeps its ranges: its parent keeps them when it ends)
    void share_runs(shared_runs r) { shared_ = std::move(r); }
    // A free range of `size` bytes (a multiple of the granularity), aligned to `align` (a power of two, 0:
    // the granularity), of this server's window, for the caller to map; 0 when the window is full or the
    // driver refused the range (the caller reserves elsewhere).
    CUdeviceptr take(const driver_table& d, size_t size, size_t align = 0);
    void give_back(CUdeviceptr va, size_t size);
    // A range of a session that moved away: never handed out again, but claimable by it if it comes back.
    void keep(CUdeviceptr va, size_t size);
    // A moved session's range: true when it lies in the common range and is free here (taken for it then).
    bool claim(const driver_table& d, CUdeviceptr va, size_t size);

    static constexpr uint32_t count = window_runs::count;

  private:
    void reserve_once(const driver_table& d);  // mu_ held
    std::mutex mu_;
    std::atomic<uint32_t> index_;
    bool tried_ = false;
    bool used_ = false;  // a range was taken or claimed (or workers use it): the index stays
    window_runs runs_;
    shared_runs shared_;
};

class device_memory {
  public:
    device_memory(const driver_table& drv, CUdevice dev, uint64_t quota, address_window* window = nullptr)
        : drv_(&drv), dev_(dev), quota_(quota), window_(window) {}

    // GPUs that can reach this one's memory (peers): its mappings are made accessible to them too.
    void set_peers(std::vector<CUdevice> peers) { peers_ = std::move(peers); }
    // Another GPU from now on (session::relocate): only while the memory is saved and released (suspended),
    // so that the rebuild maps it there.
    void set_device(CUdevice dev) { dev_ = dev; }

    CUresult allocate(size_t size, CUdeviceptr& out);
    // Only the exact start of a live allocation. `spare`: a mapping of its own stays mapped (and charged) for
    // the next allocation of its size, as a pool keeps what is freed (default pools' allocations: a
    // cudaMallocAsync/cudaFreeAsync loop then maps nothing); at most spare_limit bytes, dropped first when an
    // allocation finds no room, and by drop_spares().
    CUresult release(CUdeviceptr p, bool spare = false);
    void drop_spares();
    // The live allocation at p (freed in stream order, not given back yet) made an allocation of `size`
    // bytes where it holds them as it is: the same 2 MiB granules of a mapping of its own, or the same run of
    // a shared one. False (nothing changed) otherwise.
    bool take_again(CUdeviceptr p, size_t size);
    static constexpr uint64_t spare_limit = uint64_t{1} << 30;
    // True when [p, p+n) lies inside one live allocation (overflow-safe).
    bool contains(CUdeviceptr p, size_t n) const;
    // Unmaps everything (session end, context reset). The caller has synchronized the GPU.
    void release_all();

    uint64_t mapped() const {  // bytes of GPU memory charged to the session
        return mapped_ - std::min<uint64_t>(pending_credit_.load(), mapped_);
    }
    uint64_t resident() const { return resident_ ? mapped_ : 0; }  // of them, on the GPU now (not suspended)

    // Suspend and resume (server/session_image.cpp): save() copies every mapping out (the caller synchronized
    // the GPU and made the context current); drop_physical() gives the memory back to the driver but keeps
    // the address reservations and the allocations' bookkeeping; restore() maps new memory at the same
    // addresses and copies the saved contents back. The quota charge stays throughout.
    struct unmap_bytes {
        size_t size = 0;
        void operator()(std::byte* p) const;
    };
    struct close_descriptor {
        void operator()(int* fd) const;
    };
    struct saved_mapping {
        using bytes_type = std::unique_ptr<std::byte, unmap_bytes>;
        CUdeviceptr va = 0;
        size_t size = 0;
        bytes_type bytes{nullptr, unmap_bytes{0}};  // mapped: back to the system when freed
        // Or, moving to a server on the same GPU, the physical memory itself: a descriptor the driver
        // exported (the memory lives while it is open), imported and mapped at the same address there.
        std::unique_ptr<int, close_descriptor> descriptor;
        int fd() const { return descriptor ? *descriptor : -1; }
    };
    // How save() keeps each mapping's contents. copy: copied out into host memory. descriptor: the physical
    // memory exported (mappings made without an exportable handle are copied still). none: only where it is
    // and its size; the contents stay on the GPU, read while a pre-copied move sends them
    // (server/precopy.hpp).
    enum class save_mode { copy, descriptor, none };
    CUresult save(std::vector<saved_mapping>& out, save_mode mode = save_mode::copy) const;
    // Whether a mapping of `size` bytes is at `va` (`mu` of the session held).
    bool has_mapping(CUdeviceptr va, size_t size) const {
        auto it = mappings_.find(va);
        return it != mappings_.end() && it->second.size == size && it->second.handle;
    }
    static std::unique_ptr<int, close_descriptor> own_descriptor(int fd);
    void drop_physical();
    CUresult restore(const std::vector<saved_mapping>& saved);
    // IPC (server/handlers_ipc.cpp). The allocation holding p, with its mapping's physical memory exported as
    // a descriptor: CUDA_ERROR_INVALID_VALUE when p is in no allocation, CUDA_ERROR_NOT_SUPPORTED when the
    // driver did not make that mapping exportable.
    struct exported {
        CUdeviceptr base = 0;  // the allocation
        size_t bytes = 0;
        CUdeviceptr mapping = 0;  // the mapping holding it
        size_t mapping_size = 0;
        int fd = -1;  // the caller's to close
    };
    CUresult export_allocation(CUdeviceptr p, exported& out) const;
    // Another session's physical memory `h` (imported) mapped at new addresses, accessible as this GPU's own
    // memory is; not charged to the quota (its exporter's is). `h` is released on failure.
    CUresult map_foreign(CUmemGenericAllocationHandle h, size_t size, CUdeviceptr& va);
    void unmap_foreign(CUdeviceptr va, size_t size, CUmemGenericAllocationHandle h);

    // Physical memory the session creates itself (cuMemCreate) counts against the same quota.
    bool charge(size_t size) {
        settle();
        if (quota_ && (size > quota_ || mapped_ > quota_ - size)) return false;
        mapped_ += size;
        return true;
    }
    void credit(size_t size) { mapped_ -= std::min<uint64_t>(size, mapped_); }
    // A credit from a thread that cannot take the session's mutex (a user object's destructor on a driver
    // thread): counted off at the next charge or allocation.
    void credit_later(size_t size) { pending_credit_.fetch_add(size); }
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
    // The session moved away: its addresses are never handed out here again (kept now, for it alone, should
    // it come back; its later release leaves them so).
    void keep_addresses();

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
        bool windowed = false;               // in the address window (no reservation of its own)
        bool exportable = false;             // its physical memory can be exported as a descriptor
    };

    CUresult map_new(size_t size, bool shared, CUdeviceptr& va);
    CUresult map_making_room(size_t size, bool shared,
                             CUdeviceptr& va);  // map_new, spares dropped if need be
    void drop_spare(std::multimap<size_t, CUdeviceptr>::iterator spare);  // unmapped, the quota credited
    // Gives a mapping's addresses back: to the window, or the reservation to the driver.
    void free_addresses(CUdeviceptr va, const mapping& m);
    CUresult map_at(CUdeviceptr va, size_t size, CUmemGenericAllocationHandle& h, bool& exportable);
    // Maps `h` (made here or imported) at va, readable and writable from the device and its peers; releases
    // it on failure.
    CUresult map_handle(CUdeviceptr va, size_t size, CUmemGenericAllocationHandle h);
    void unmap(CUdeviceptr va, mapping& m);

    const driver_table* drv_;
    CUdevice dev_;
    std::vector<CUdevice> peers_;
    // Applies the credits given later (credit_later).
    void settle() { credit(pending_credit_.exchange(0)); }
    uint64_t quota_;
    std::atomic<uint64_t> pending_credit_{0};
    uint64_t mapped_ = 0;
    uint64_t heap_charge_ = 0;
    bool resident_ = true;
    std::map<CUdeviceptr, mapping> mappings_;
    address_window* window_;
    bool keep_addresses_ = false;
    bool export_allowed_ = true;           // until the driver refuses an exportable mapping (map_at)
    std::map<CUdeviceptr, bool> foreign_;  // map_foreign's mappings: start -> in the address window
    allocation_map allocations_;           // start -> (size, its mapping)
    std::multimap<size_t, CUdeviceptr>
        spares_;  // mappings of their own kept by release(p, true): size -> start
    uint64_t spare_bytes_ = 0;
};

// cuMemCreate of `prop`. With `try_export`, a device allocation for which `prop` asks no handle type is asked
// for a POSIX file descriptor handle too, so that a move to a server on the same GPU can hand the memory over
// (made without it where the driver refuses that handle type). `exportable`: it can be exported so.
CUresult create_physical(const driver_table& d, CUmemGenericAllocationHandle& h, size_t size,
                         CUmemAllocationProp prop, unsigned long long flags, bool try_export,
                         bool& exportable);

// Copies between GPU memory and `size` bytes of host pages at `host` with `copy`, the pages registered for
// the copy when the driver allows it (a DMA at the bus's speed rather than the driver's pageable path,
// several times slower).
CUresult copy_registered(const driver_table& d, void* host, size_t size,
                         const std::function<CUresult()>& copy);
// `size` bytes of new host pages, populated (null when the system has none), for copy_registered.
device_memory::saved_mapping::bytes_type host_pages(size_t size);

}  // namespace vcuda::server
