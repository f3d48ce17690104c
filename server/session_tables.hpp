// The tables a session keeps of what its handlers made, each behind the few operations those handlers use:
// module globals and the image cache (server/handlers_module.cpp), stream-ordered allocations
// (handlers_pool.cpp, and cuMemFree in handlers_memory.cpp), pinned host regions shared with a client on this
// host (handlers_host.cpp), the virtual memory management API's reservations, mappings and physical
// allocations (handlers_vmm.cpp), link states' options (handlers_link.cpp), IPC (handlers_ipc.cpp), graph
// allocations and the staging buffers of graph copies with the client's memory (handlers_graph.cpp,
// handlers_hostfn.cpp). The session (a friend) reads them whole for owns_range and releases what they hold at
// a device reset and at its end (server/session.cpp). locks: none inside, every call made with the session's
// `mu` held; except graph_allocations and host_copy_buffers, which have their own mutex, and
// host_regions::credit_later (atomic): they are used by the driver's thread of user object destructors.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/param_layout.hpp"
#include "driver_table.hpp"
#include "server/ipc.hpp"
#include "server/jit.hpp"

namespace vcuda::server {

class session;

// True when [p, p+n) lies inside [start, start+size), for p >= start (overflow-safe).
inline bool range_inside(uint64_t p, size_t n, uint64_t start, size_t size) {
    return p - start < size && n <= size - (p - start);
}

// Module globals (cuModuleGetGlobal, cuLibraryGetGlobal, and cuLibraryGetManaged's __managed__ variables):
// device ranges the session may copy to and from, each known with the module or library it came from and the
// session device whose context it was looked up in. One address may be known for several devices (a driver
// that gives a library's global one address in every context): it stays the session's until the last of them
// goes.
class module_globals {
  public:
    // A __managed__ variable stays one when it is looked up again as a plain global.
    void add(CUdeviceptr p, size_t size, uint64_t owner, size_t device, std::string name,
             bool managed = false) {
        global& g = globals_[{p, device}];
        g = {size, owner, std::move(name), managed || g.managed};
    }
    // True when [p, p+n) lies inside one global.
    bool holds(CUdeviceptr p, size_t n) const {
        auto it = globals_.upper_bound({p, SIZE_MAX});
        if (it == globals_.begin()) return false;
        --it;
        return range_inside(p, n, it->first.first, it->second.size);
    }
    // Forgets the globals of a module or library (unloaded), or those in the context of `device` (reset).
    void erase_owner(uint64_t owner) {
        std::erase_if(globals_, [&](const auto& g) { return g.second.owner == owner; });
        std::erase_if(relocated_, [&](const auto& r) { return r.second.owner == owner; });
    }
    // A global the driver placed elsewhere when its module was loaded again (a resume, a move): the
    // application keeps its old address, so launch parameters pointing into it are rewritten to the new
    // one (kernel_args::set; cuBLAS passes its constants' address so), and so are copies' device sides
    // (call_context::device_range_now; cudart caches symbol addresses). Changed only while no call runs.
    struct relocation {
        CUdeviceptr to = 0;
        size_t size = 0;
        uint64_t owner = 0;
    };
    void relocate(CUdeviceptr from, CUdeviceptr to, size_t size, uint64_t owner) {
        for (auto& [old, r] : relocated_)  // moved before: the application's address goes to the newest place
            if (r.to == from) r.to = to;
        if (!relocated_.count(from)) relocated_[from] = {to, size, owner};
    }
    // Where the application's address p is now, when it points into a relocated global; with `n`, when all of
    // [p, p+n) lies in it.
    std::optional<CUdeviceptr> relocated(uint64_t p, size_t n = 1) const {
        auto it = relocated_.upper_bound(p);
        if (it == relocated_.begin()) return std::nullopt;
        --it;
        if (!range_inside(p, n, it->first, it->second.size)) return std::nullopt;
        return it->second.to + (p - it->first);
    }
    bool any_relocated() const { return !relocated_.empty(); }
    // The 8-byte words of a kernel's parameter block (packed at `layout`) that point into a relocated global,
    // given the new address: a launch's, and a graph kernel node's made again. Words inside a parameter too,
    // at its 8-byte-aligned offsets: a struct passed by value carries pointers so (XLA's CUTLASS kernels take
    // their constants' addresses in their Params).
    void relocate_params(std::span<std::byte> block, const param_layout& layout) const {
        if (relocated_.empty()) return;
        for (auto [off, size] : layout.params) {
            if (off % 8 != 0) continue;
            for (size_t at = off; at + 8 <= size_t{off} + size && at + 8 <= block.size(); at += 8) {
                uint64_t v = 0;
                std::memcpy(&v, block.data() + at, 8);
                if (auto to = relocated(v)) std::memcpy(block.data() + at, &*to, 8);
            }
        }
    }
    const std::map<CUdeviceptr, relocation>& relocations() const { return relocated_; }
    void erase_device(size_t device) {
        std::erase_if(globals_, [&](const auto& g) { return g.first.second == device; });
    }
    void clear() {
        globals_.clear();
        relocated_.clear();
    }

  private:
    friend class session;
    std::map<CUdeviceptr, relocation> relocated_;  // the application's address -> where it is now
    struct global {
        size_t size = 0;
        uint64_t owner = 0;    // the module or library handle
        std::string name;      // its symbol, to find it again in a rebuilt module
        bool managed = false;  // found again with cuLibraryGetManaged
    };
    std::map<std::pair<CUdeviceptr, size_t>, global> globals_;  // (start, session device) -> global
};

// How each module and library the client loaded was made (its image and JIT options), so that a suspended
// session can load it again (server/session_image.cpp): module or library handle -> origin.
class module_origins {
  public:
    struct origin {
        bool library = false;
        uint64_t format = 0;  // as handle_module_load's argument: 0 raw, 1 wrapper v1, 2 wrapper v2
        std::shared_ptr<const std::vector<std::vector<uint64_t>>> parts;
        std::vector<std::byte> jit_options;  // the caller's JIT options blob, as sent
        // Device memory charged for it (server/image_memory.hpp): on `device`, a module's; on every device of
        // the session, a library's (the driver loads it into each context).
        uint64_t charge = 0;
        size_t device = 0;
    };
    void add(uint64_t handle, origin o) { origins_[handle] = std::move(o); }
    const origin* find(uint64_t handle) const {
        auto it = origins_.find(handle);
        return it == origins_.end() ? nullptr : &it->second;
    }
    void erase(uint64_t handle) { origins_.erase(handle); }
    template <class F>
    void for_each(F&& f) const {
        for (auto& [handle, o] : origins_) f(handle, o);
    }

  private:
    std::map<uint64_t, origin> origins_;
};

// Stream-ordered allocations (cuMemAllocAsync, cuMemAllocFromPoolAsync): start -> size and the device
// charged. Those from a device's default pool, or from a pool the application made that the session serves
// (server/handlers_pool.cpp, handle_pool_create), are the session's own memory (`windowed`: made by its
// device_memory in the address window, so that they are suspended and moved with it); the figures their pool
// reports count them, and their frees wait in `pending` for the stream's work before them.
class pool_allocations {
  public:
    // handle_entry::made_with[0] of a pool the application made whose allocations the session serves from
    // its own memory (server/handlers_pool.cpp, handle_pool_create).
    static constexpr uint64_t served_by_session = 1;
    struct allocation {
        size_t size = 0;
        size_t device = 0;
        CUmemoryPool pool = nullptr;  // the pool it came from (nullptr: not known)
        bool imported = false;        // another session's, by cuMemPoolImportPointer: charged there, not here
        bool windowed = false;        // the session's device memory, not the driver's pool
        uint64_t made_pool = 0;       // windowed: the application's pool (its handle), 0 the default pool
    };
    void add(CUdeviceptr p, size_t size, size_t device, CUmemoryPool pool, bool imported = false,
             bool windowed = false, uint64_t made_pool = 0) {
        allocations_[p] = {size, device, pool, imported, windowed, made_pool};
        if (window_figures* f = windowed ? figures_if(device, made_pool, true) : nullptr) f->allocated(size);
    }
    // What a device's default pool reports beside the driver's own figures (CU_MEMPOOL_ATTR_*_MEM_*): the
    // bytes of windowed allocations not yet freed (used), and what the pool holds for them: the most they
    // needed (with frees still waiting), in 2 MiB granules, since the pool was last trimmed (reserved).
    struct window_figures {
        uint64_t used = 0, used_high = 0, reserved = 0, reserved_high = 0;
        uint64_t waiting = 0;  // bytes freed in stream order, not yet given back
        void allocated(uint64_t size) {
            used += size;
            used_high = std::max(used_high, used);
            reserved = std::max(reserved, granules(used + waiting));
            reserved_high = std::max(reserved_high, reserved);
        }
        void trimmed(uint64_t keep) {
            reserved = std::max(granules(used + waiting), std::min(reserved, keep));
        }
        static uint64_t granules(uint64_t n) {
            return (n + (uint64_t{2} << 20) - 1) & ~((uint64_t{2} << 20) - 1);
        }
    };
    // A device's default pool's (made_pool 0), or those of the application's live pool with that handle.
    window_figures& figures(size_t device, uint64_t made_pool = 0) {
        return *figures_if(device, made_pool, true);
    }
    // The application destroyed its pool: its figures go, and allocations still held (valid, as the driver
    // keeps them) are counted nowhere.
    static constexpr uint64_t destroyed_pool = UINT64_MAX;
    void forget_made_pool(uint64_t made_pool) {
        if (!made_figures_.erase(made_pool)) return;
        for (auto& [p, a] : allocations_)
            if (a.made_pool == made_pool) a.made_pool = destroyed_pool;
        for (auto& f : pending_)
            if (f.made_pool == made_pool) f.made_pool = destroyed_pool;
    }
    // Device memory of the session freed in stream order: given back once `done` (an event recorded behind
    // the stream's work) has completed.
    struct pending_free {
        CUevent done = nullptr;
        CUdeviceptr p = 0;
        size_t size = 0;  // a pool's allocation (its figures' bytes); 0: cuMemAlloc's
        size_t device = 0;
        CUstream stream = nullptr;  // the free's: its work runs in order, so its events complete in order
        uint64_t made_pool = 0;     // as allocation::made_pool
    };
    std::vector<pending_free>& pending() { return pending_; }
    // Whether any free may be waiting, read without `mu` where a synchronize returns (server.cpp): a cheap
    // look before taking the lock on every synchronize. Set when one is added, cleared when none is left.
    std::atomic<bool> maybe_pending{false};
    bool freed_pending(CUdeviceptr p) const {
        return std::any_of(pending_.begin(), pending_.end(), [p](const pending_free& f) { return f.p == p; });
    }
    // The allocation starting at p, or nothing.
    std::optional<allocation> find(CUdeviceptr p) const {
        auto it = allocations_.find(p);
        if (it == allocations_.end()) return std::nullopt;
        return it->second;
    }
    // `waiting`: a windowed allocation freed in stream order, given back later (gave_back()).
    void erase(CUdeviceptr p, bool waiting = false) {
        auto it = allocations_.find(p);
        if (it == allocations_.end()) return;
        if (window_figures* f =
                it->second.windowed ? figures_if(it->second.device, it->second.made_pool) : nullptr) {
            f->used -= std::min(f->used, uint64_t{it->second.size});
            if (waiting) f->waiting += it->second.size;
        }
        allocations_.erase(it);
    }
    void gave_back(const pending_free& f) {
        if (window_figures* w = figures_if(f.device, f.made_pool))
            w->waiting -= std::min(w->waiting, uint64_t{f.size});
    }

    // Memory a pool keeps reserved after frees (up to its release threshold) is still held for the session:
    // a free into a pool credits the quota only past what the pool may keep, and an allocation from a pool
    // first reuses what it keeps. Each returns how many bytes to charge or credit.
    uint64_t take_kept(CUmemoryPool pool, uint64_t size) {  // allocation: the part to charge
        auto it = retention_.find(pool);
        if (it == retention_.end()) return size;
        uint64_t k = std::min(size, it->second.kept);
        it->second.kept -= k;
        return size - k;
    }
    void give_back_kept(CUmemoryPool pool, uint64_t bytes) {  // an allocation that took them failed
        if (auto it = retention_.find(pool); it != retention_.end()) it->second.kept += bytes;
    }
    uint64_t keep(CUmemoryPool pool, uint64_t size, size_t device) {  // free: the part to credit
        auto it = retention_.find(pool);
        if (it == retention_.end()) return size;
        auto& r = it->second;
        uint64_t room = r.threshold > r.kept ? r.threshold - r.kept : 0;
        uint64_t k = std::min(size, room);
        r.kept += k;
        r.device = device;
        return size - k;
    }
    // The pool's release threshold was set: what it kept past the new one goes (credited on `device`).
    uint64_t set_threshold(CUmemoryPool pool, uint64_t threshold, size_t& device) {
        auto& r = retention_[pool];
        r.threshold = threshold;
        device = r.device;
        uint64_t over = r.kept > threshold ? r.kept - threshold : 0;
        r.kept -= over;
        return over;
    }
    // A pool destroyed: all it kept goes.
    uint64_t forget_pool(CUmemoryPool pool, size_t& device) {
        auto it = retention_.find(pool);
        if (it == retention_.end()) return 0;
        uint64_t kept = it->second.kept;
        device = it->second.device;
        retention_.erase(it);
        return kept;
    }

  private:
    friend class session;
    struct retention {
        uint64_t threshold = 0;  // CU_MEMPOOL_ATTR_RELEASE_THRESHOLD as set (the driver's default is 0)
        uint64_t kept = 0;       // freed bytes the pool may still hold, charged to the quota
        size_t device = 0;
    };
    std::map<CUdeviceptr, allocation> allocations_;
    std::map<CUmemoryPool, retention> retention_;
    window_figures* figures_if(size_t device, uint64_t made_pool, bool make = false) {
        if (!made_pool) return &figures_[device];
        if (made_pool == destroyed_pool) return nullptr;
        auto it = made_figures_.find(made_pool);
        if (it == made_figures_.end() && make) it = made_figures_.emplace(made_pool, window_figures{}).first;
        return it == made_figures_.end() ? nullptr : &it->second;
    }
    std::map<size_t, window_figures> figures_;
    std::map<uint64_t, window_figures> made_figures_;  // by the application's pool handle
    std::vector<pending_free> pending_;
};

// The last copy marked against a host region (a client's staging slot, refilled once that copy is done).
struct copy_mark {
    explicit copy_mark(const driver_table& d) : drv(d) {}
    ~copy_mark();
    std::mutex mu;
    CUevent event = nullptr;  // recorded behind the copy; made in the context current then
    CUcontext ctx = nullptr;
    const driver_table& drv;
};

// Pinned host memory shared with a client on this host (client and server map the same pages): mapped and
// registered with the driver by handlers_host.cpp, released at session end. Counted against the session's
// host memory quota from before the pages exist.
class host_regions {
  public:
    // Registration flags: every context may use the pages, and kernels may address them.
    static constexpr unsigned register_flags = CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP;
    struct region {
        size_t size = 0;
        std::shared_ptr<copy_mark> last_copy;  // made at the first marked copy
        int fd = -1;        // the pages' memfd, kept so that a moved session can hand them to the next server
        bool file = false;  // pages of the application's own shared file, mapped here (no fd kept)
    };
    host_regions() = default;
    host_regions(const host_regions&) = delete;
    host_regions& operator=(const host_regions&) = delete;
    ~host_regions() {
        for (auto& [addr, r] : regions_)
            if (r.fd >= 0) ::close(r.fd);
    }
    // Counts `size` more bytes unless that passes `quota` (0: no quota); reserved before the pages are made,
    // so that concurrent lanes cannot both pass the check.
    bool reserve(uint64_t size, uint64_t quota) {
        bytes_ -= std::min(bytes_, credit_.exchange(0));
        if (quota && bytes_ + size > quota) return false;
        bytes_ += size;
        return true;
    }
    void unreserve(uint64_t size) { bytes_ -= size; }
    // Gives reserved bytes back without `mu` (a user object's destructor on a driver thread): counted off at
    // the next reserve.
    void credit_later(uint64_t size) { credit_.fetch_add(size); }
    // A region of reserved bytes, at the server's address `addr`, its pages in `fd` (owned from now on).
    void add(uintptr_t addr, size_t size, int fd) { regions_[addr] = {size, nullptr, fd}; }
    // A region of reserved bytes that maps pages of the client's own shared file (handle_host_register_file).
    void add_file(uintptr_t addr, size_t size) { regions_[addr] = {size, nullptr, -1, true}; }
    // Forgets the region at `addr` and its bytes; its size, or nothing when there is no region there.
    std::optional<size_t> remove(uintptr_t addr) {
        auto it = regions_.find(addr);
        if (it == regions_.end()) return std::nullopt;
        size_t size = it->second.size;
        if (it->second.fd >= 0) ::close(it->second.fd);
        regions_.erase(it);
        bytes_ -= size;
        return size;
    }
    // The region holding [p, p+n), or null.
    region* holding(uintptr_t p, size_t n) {
        auto it = regions_.upper_bound(p);
        if (it == regions_.begin()) return nullptr;
        --it;
        return range_inside(p, n, it->first, it->second.size) ? &it->second : nullptr;
    }

  private:
    friend class session;
    std::map<uintptr_t, region> regions_;  // server address -> region
    uint64_t bytes_ = 0;
    std::atomic<uint64_t> credit_{0};
};

// Graph allocations: the addresses memory alloc nodes (explicit, or captured from cuMemAllocAsync) hand out,
// with their size and the session device charged. They stay the session's while a graph or executable graph
// holding the node that made them lives: each node's hold is a CUDA user object of its graph, whose
// destructor (on a driver thread) drops it (server/handlers_graph.cpp). The driver may give one address to
// several nodes (memory freed earlier in a graph is used again): each holds it. locks: its own mutex.
class graph_allocations {
  public:
    struct allocation {
        size_t size = 0;
        size_t device = 0;
        unsigned holds = 0;
    };
    void add(CUdeviceptr p, size_t size, size_t device) {
        std::lock_guard lock(mu_);
        auto& a = allocations_[p];
        a.size = std::max(a.size, size);
        a.device = device;
        ++a.holds;
    }
    void drop(CUdeviceptr p) {
        std::lock_guard lock(mu_);
        auto it = allocations_.find(p);
        if (it != allocations_.end() && --it->second.holds == 0) allocations_.erase(it);
    }
    // The allocation starting at p, or nothing.
    std::optional<allocation> find(CUdeviceptr p) {
        std::lock_guard lock(mu_);
        auto it = allocations_.find(p);
        if (it == allocations_.end()) return std::nullopt;
        return it->second;
    }
    // True when [p, p+n) lies inside one.
    bool holds(CUdeviceptr p, size_t n) {
        std::lock_guard lock(mu_);
        auto it = allocations_.upper_bound(p);
        if (it == allocations_.begin()) return false;
        --it;
        return range_inside(p, n, it->first, it->second.size);
    }

  private:
    std::mutex mu_;
    std::map<CUdeviceptr, allocation> allocations_;
};

// The staging buffers of graph copies between the GPU and the client's memory, by the client's id of the copy
// (server/handlers_hostfn.cpp): a copy node moves the bytes between the GPU and the buffer, a host node has
// the client move them between the buffer and its memory. Buffers are pinned (registered with the driver):
// the driver reads a pageable source of a graph copy before the graph's nodes run, so the host node's bytes
// would not arrive. A buffer is retired when the CUDA user object that the graphs using it hold is destroyed
// (on a driver thread, which may not call the driver); a lane unregisters retired buffers later, and the
// session's end all of them. The memory is the server's own (never the driver's), so a buffer whose context
// went (and its registration with it) stays writable. locks: its own mutex.
class host_copy_buffers {
  public:
    // The client's side of a graph copy: its address, offsets, pitch and height, the extent, the direction.
    using shape = std::array<uint64_t, 10>;
    struct buffer {
        explicit buffer(size_t n);  // zeroed, page-aligned: never another's bytes; throws std::bad_alloc
        ~buffer();
        buffer(const buffer&) = delete;
        buffer& operator=(const buffer&) = delete;
        std::byte* bytes = nullptr;
        size_t size = 0;
        bool registered = false;  // pinned (in the context current then)
        shape of{};
        int users = 0;  // host copy ids that stage through it
    };
    // `id` stages through the buffer in use for copies of shape `of`, when there is one: returned. Copies of
    // the same client memory and shape share one, so that the driver sees the same copy in a graph captured
    // again (an executable graph's 2D/3D copy may not change its addresses in cuGraphExecUpdate). Null when
    // there is none, or when `id` is taken (`taken` then).
    std::shared_ptr<buffer> use(uint64_t id, const shape& of, bool& taken) {
        std::lock_guard lock(mu_);
        taken = buffers_.count(id) != 0;
        auto it = by_shape_.find(of);
        if (taken || it == by_shape_.end()) return nullptr;
        ++it->second->users;
        return buffers_.emplace(id, it->second).first->second;
    }
    // `id` stages through `b`, or through the buffer of b's shape that another id took meanwhile: the one
    // returned (then `b` is unused). Null when `id` is taken.
    std::shared_ptr<buffer> add(uint64_t id, std::shared_ptr<buffer> b) {
        std::lock_guard lock(mu_);
        if (buffers_.count(id)) return nullptr;
        auto [it, made] = by_shape_.emplace(b->of, b);
        ++it->second->users;
        return buffers_.emplace(id, it->second).first->second;
    }
    // Null when there is none (a reader keeps it alive while it reads).
    std::shared_ptr<buffer> find(uint64_t id) {
        std::lock_guard lock(mu_);
        auto it = buffers_.find(id);
        return it == buffers_.end() ? nullptr : it->second;
    }
    // `id` is out of use. Its buffer, when no other id uses it, is kept for take_retired (no driver call
    // here): true then.
    bool retire(uint64_t id) {
        std::lock_guard lock(mu_);
        auto it = buffers_.find(id);
        if (it == buffers_.end()) return false;
        auto b = std::move(it->second);
        buffers_.erase(it);
        if (--b->users > 0) return false;
        by_shape_.erase(b->of);
        retired_.push_back(std::move(b));
        return true;
    }
    // The retired buffers (and, with `all`, every buffer), for the caller to unregister and drop.
    std::vector<std::shared_ptr<buffer>> take_retired(bool all) {
        std::lock_guard lock(mu_);
        auto out = std::move(retired_);
        retired_.clear();
        if (all) {
            for (auto& [of, b] : by_shape_) out.push_back(std::move(b));
            buffers_.clear();
            by_shape_.clear();
        }
        return out;
    }

  private:
    std::mutex mu_;
    std::unordered_map<uint64_t, std::shared_ptr<buffer>> buffers_;
    std::map<shape, std::shared_ptr<buffer>> by_shape_;  // each buffer in use, once
    std::vector<std::shared_ptr<buffer>> retired_;
};

// The virtual memory management API as the application uses it: its address reservations, what is mapped in
// them, and the physical allocations (mem_handle ids), whose size is charged to a device's quota from
// cuMemCreate until the memory goes back to the driver.
class vmm_tables {
  public:
    struct allocation {
        size_t size = 0;
        size_t device = 0;      // charged to this device's quota
        int maps = 0;           // mappings that use it
        bool released = false;  // cuMemRelease'd while mapped: the driver frees it at the last unmap
        bool foreign = false;   // imported from another session's shareable handle: charged there, not here
        CUmemAllocationProp prop{};  // as asked (real device): a suspended session's is made again from it
        // The driver's allocation can be exported as a file descriptor (create_physical): a move to a server
        // on the same GPU hands it over.
        bool exportable = false;
        // The application's references to its handle: cuMemCreate's (or the import's), and one per
        // cuMemRetainAllocationHandle. The driver's handle is released at the last cuMemRelease only.
        unsigned refs = 1;
    };
    struct mapping {
        size_t size = 0;
        uint64_t handle = 0;  // the mem_handle id mapped here
        size_t offset = 0;    // into the allocation
    };

    // An address range the application reserved: in the server's address window (server/device_memory.hpp),
    // where a session moved to another server finds it free, or where the driver put it (the window was
    // full).
    struct reservation_entry {
        size_t size = 0;
        bool windowed = false;
    };
    void add_reservation(CUdeviceptr va, size_t size, bool windowed) { reserved_[va] = {size, windowed}; }
    // The reservation starting at va, or nothing.
    std::optional<reservation_entry> reservation(CUdeviceptr va) const {
        auto it = reserved_.find(va);
        if (it == reserved_.end()) return std::nullopt;
        return it->second;
    }
    void erase_reservation(CUdeviceptr va) { reserved_.erase(va); }
    uint64_t windowed_bytes() const {  // of the reservations, in the address window
        uint64_t n = 0;
        for (auto& [va, r] : reserved_) n += r.windowed ? r.size : 0;
        return n;
    }
    // True when [va, va+size) lies inside one reservation.
    bool reserved(CUdeviceptr va, size_t size) const {
        auto it = reserved_.upper_bound(va);
        if (it == reserved_.begin()) return false;
        --it;
        return range_inside(va, size, it->first, it->second.size);
    }
    // True when a mapping starts in [va, va+size).
    bool has_mapping_in(CUdeviceptr va, size_t size) const {
        auto m = mapped_.lower_bound(va);
        return m != mapped_.end() && m->first < va + size;
    }

    void add_allocation(uint64_t id, size_t size, size_t device, bool foreign = false,
                        const CUmemAllocationProp& prop = {}, bool exportable = false) {
        allocations_[id] = {size, device, 0, false, foreign, prop, exportable};
    }
    std::optional<allocation> allocation_of(uint64_t id) const {
        auto it = allocations_.find(id);
        if (it == allocations_.end()) return std::nullopt;
        return it->second;
    }
    // cuMemRelease of `id`: the allocation, when its memory goes now (no mapping uses it) and it is
    // forgotten; otherwise it is marked released and goes at its last unmap.
    std::optional<allocation> release(uint64_t id) {
        auto it = allocations_.find(id);
        if (it == allocations_.end()) return std::nullopt;
        if (it->second.maps > 0) {
            it->second.released = true;
            return std::nullopt;
        }
        allocation a = it->second;
        allocations_.erase(it);
        return a;
    }

    // cuMemRelease of `id` while cuMemRetainAllocationHandle gave it out more than once: one reference goes,
    // the handle stays (true). False at its last reference (release() follows).
    bool drop_reference(uint64_t id) {
        auto it = allocations_.find(id);
        if (it == allocations_.end() || it->second.refs <= 1) return false;
        --it->second.refs;
        return true;
    }
    // cuMemRetainAllocationHandle of `va`: the mem_handle id of the allocation mapped there, with one more
    // reference; 0 when no mapping of the session holds va, or (`released` set) when its allocation's handle
    // was released already, so that the session has no handle of it to give.
    uint64_t retain_at(CUdeviceptr va, bool& released) {
        released = false;
        auto m = mapped_.upper_bound(va);
        if (m == mapped_.begin()) return 0;
        --m;
        if (va - m->first >= m->second.size) return 0;
        auto a = allocations_.find(m->second.handle);
        if (a == allocations_.end()) return 0;
        if (a->second.released) {
            released = true;
            return 0;
        }
        ++a->second.refs;
        return m->second.handle;
    }

    void add_mapping(CUdeviceptr va, size_t size, uint64_t id, size_t offset) {
        mapped_[va] = {size, id, offset};
        allocations_[id].maps++;
    }
    bool empty() const { return reserved_.empty() && mapped_.empty() && allocations_.empty(); }
    // A suspend gave the physical memory back (server/vmm_image.cpp): mappings and handles are the
    // bookkeeping only until the rebuild.
    bool physical_released() const { return physical_released_; }
    // The mapping starting at va, or nothing.
    std::optional<mapping> mapping_at(CUdeviceptr va) const {
        auto it = mapped_.find(va);
        if (it == mapped_.end()) return std::nullopt;
        return it->second;
    }
    // Forgets the mapping at va (which exists): the allocation it used, when that was released and this was
    // its last mapping, so its memory went with the unmap (it is forgotten too).
    std::optional<allocation> erase_mapping(CUdeviceptr va) {
        auto it = mapped_.find(va);
        std::optional<allocation> freed;
        if (auto a = allocations_.find(it->second.handle); a != allocations_.end())
            if (--a->second.maps == 0 && a->second.released) {
                freed = a->second;
                allocations_.erase(a);
            }
        mapped_.erase(it);
        return freed;
    }

  private:
    friend class session;
    std::map<CUdeviceptr, reservation_entry> reserved_;  // start -> reservation
    std::map<CUdeviceptr, mapping> mapped_;              // start -> mapping
    std::map<uint64_t, allocation> allocations_;         // mem_handle id -> allocation, charged until freed
    bool physical_released_ = false;
};

// CUDA arrays and the texture and surface objects of a session (server/handlers_array.cpp). Arrays are
// handles (kind array) whose bytes are charged to their device's quota; texture and surface objects are the
// driver's own values (kernels receive them by value), kept here so that only the session's own are destroyed
// or asked about, and so that a suspend or a move makes them again (server/array_image.cpp). The driver
// numbers them per context, so two devices' objects may have the same value. Both are released per device at
// a reset and at session end (server/session.cpp).
class array_tables {
  public:
    struct array {
        size_t device = 0;
        uint64_t bytes = 0;  // charged
        CUDA_ARRAY3D_DESCRIPTOR desc{};
        unsigned level = 0;  // a mipmapped array's level (its handle is owned by the mipmapped array)
    };
    struct object {
        bool surface = false;
        CUDA_RESOURCE_DESC res{};   // as the client gave it (its array handle, not the driver's)
        CUDA_RESOURCE_DESC made{};  // as the driver got it, but with the session's array handle
        CUDA_TEXTURE_DESC tex{};
        bool has_view = false;
        CUDA_RESOURCE_VIEW_DESC view{};
    };
    using object_key = std::pair<size_t, uint64_t>;  // the session's device index, the driver's value
    std::map<uint64_t, array> arrays;                // array handle id -> array
    std::map<object_key, object> objects;            // CUtexObject / CUsurfObject of a device -> object
};

// Images (modules, libraries) the client has sent, by content hash, so that it sends each only once. Held
// through shared pointers: a lane loads from its image after `mu` is released, while another lane may start
// the cache over.
class image_cache {
  public:
    // The parts of one image, each 8-byte aligned and zero-terminated (for PTX).
    using parts = std::vector<std::vector<uint64_t>>;
    // The image with this hash, or null.
    std::shared_ptr<const parts> find(uint64_t hash) const {
        auto it = images_.find(hash);
        return it == images_.end() ? nullptr : it->second;
    }
    // Keeps an image of `bytes` bytes (as sent) under `hash`; when that would pass `limit` bytes in all, the
    // cache starts over first (a simple bound).
    std::shared_ptr<const parts> add(uint64_t hash, parts image, size_t bytes, size_t limit) {
        if (bytes_ + bytes > limit) clear();
        bytes_ += bytes;
        auto p = std::make_shared<const parts>(std::move(image));
        images_[hash] = p;
        return p;
    }
    void clear() {
        images_.clear();
        bytes_ = 0;
    }

  private:
    std::unordered_map<uint64_t, std::shared_ptr<const parts>> images_;  // content hash -> parts
    size_t bytes_ = 0;
};

// Link states' creation options, with the log buffers the driver writes into until the link is destroyed
// (handlers_link.cpp): link_state handle -> options.
class link_states {
  public:
    void add(uint64_t handle, std::unique_ptr<jit_request> job) { links_[handle] = std::move(job); }
    // The options of the link state `handle`, or null. Valid until erase(handle).
    jit_request* find(uint64_t handle) const {
        auto it = links_.find(handle);
        return it == links_.end() ? nullptr : it->second.get();
    }
    void erase(uint64_t handle) { links_.erase(handle); }

  private:
    std::map<uint64_t, std::unique_ptr<jit_request>> links_;
};

// IPC between sessions (server/handlers_ipc.cpp, server/ipc.hpp): what this session exported, withdrawn when
// the exported object goes, and the memory and events it opened.
class ipc_tables {
  public:
    // Memory it opened: another session's physical memory mapped here, by the mapping's start.
    struct opened {
        size_t size = 0;  // of the mapping
        CUmemGenericAllocationHandle handle = 0;
        size_t offset = 0, bytes = 0;  // the exporter's allocation inside it
        size_t device = 0;
        ipc_token token{};
        unsigned refs =
            1;  // opened this many times (cuIpcOpenMemHandle of an open handle gives the same address)
    };

    std::map<CUdeviceptr, ipc_token> memory_exports;                // allocation start -> token
    std::map<uint64_t, std::vector<ipc_token>> allocation_exports;  // mem_handle id -> tokens
    std::map<uint64_t, ipc_token> event_exports;                    // event id -> token
    std::map<CUdeviceptr, ipc_token>
        pointer_exports;  // stream-ordered allocation -> token (cuMemPoolExportPointer)
    std::map<CUdeviceptr, opened> opened_memory;

    // The opened memory whose allocation holds [p, p+n).
    const opened* holding(CUdeviceptr p, size_t n) const {
        for (const auto& [va, o] : opened_memory)
            if (range_inside(p, n, va + o.offset, o.bytes)) return &o;
        return nullptr;
    }
    // The opened memory whose allocation starts at p (the address cuIpcOpenMemHandle gave), by mapping start.
    std::map<CUdeviceptr, opened>::iterator opened_at(CUdeviceptr p) {
        for (auto it = opened_memory.begin(); it != opened_memory.end(); ++it)
            if (it->first + it->second.offset == p) return it;
        return opened_memory.end();
    }
    bool empty() const {
        return memory_exports.empty() && allocation_exports.empty() && event_exports.empty() &&
               pointer_exports.empty() && opened_memory.empty();
    }
};

// Events recorded before a suspend are made again and recorded at the resume; what they measured is kept as
// an age: how long before the suspend each was recorded, in ms (server/session_image.cpp). Elapsed times are
// the driver's between the new events, corrected by the ages (server/handlers_event.cpp), so that a time
// measured across a suspend leaves out the time the session was suspended. Recording an event again drops
// its age. event handle -> age.
class event_ages {
  public:
    double age(uint64_t event) const {
        auto it = ages_.find(event);
        return it == ages_.end() ? 0.0 : it->second;
    }
    void set(uint64_t event, double ms) { ages_[event] = ms; }
    void forget(uint64_t event) { ages_.erase(event); }

  private:
    std::map<uint64_t, double> ages_;
};

// Executable graphs and what each was instantiated from (server/graph_image.cpp): a clone of its graph, kept
// in step with the updates made through the session, so that a suspend can make the executable graph again
// from it. `not_kept` names an update the clone cannot follow; a suspend is then refused with it. A child
// graph given to a node of the executable graph (cuGraphExecChildGraphNodeSetParams) is cloned and read by
// a suspend in place of what the clone's node holds: the driver takes only a child of the same topology, so
// the graph made again from the clone with it is the updated executable graph's. locks: none inside; the
// session's `mu`.
class graph_exec_origins {
  public:
    struct origin {
        CUgraph clone = nullptr;
        unsigned long long flags = 0;
        std::string not_kept;
        uint64_t source = 0;  // the graph it was instantiated from
        // Made again from its clone by a suspend: the executable graph's nodes are the clone's, and the
        // application's node handles (of `source`) stand for them in executable-graph calls.
        std::unordered_map<void*, CUgraphNode> nodes;
        // Clones such an executable graph was made from and then updated past (cuGraphExecUpdate): its nodes,
        // which `nodes` names, are theirs, so they live as long as it does.
        std::vector<CUgraph> retired;
        // The clone's child graph nodes given new children since it was made: a clone of each new child.
        std::unordered_map<CUgraphNode, CUgraph> children;
        void drop_children(const driver_table& d) {
            if (d.cuGraphDestroy)
                for (auto& [node, g] : children) d.cuGraphDestroy(g);
            children.clear();
        }
    };
    // The node `node` of the application's graph stands for in executable graph `exec`.
    CUgraphNode node_in(uint64_t exec, CUgraphNode node) {
        auto* o = find(exec);
        if (!o) return node;
        auto it = o->nodes.find(node);
        return it == o->nodes.end() ? node : it->second;
    }
    origin* find(uint64_t exec) {
        auto it = by_exec_.find(exec);
        return it == by_exec_.end() ? nullptr : &it->second;
    }
    origin& add(uint64_t exec) { return by_exec_[exec]; }
    // The executable graph `exec` is gone: its clones too.
    void forget(const driver_table& d, uint64_t exec) {
        auto it = by_exec_.find(exec);
        if (it == by_exec_.end()) return;
        if (d.cuGraphDestroy) {
            if (it->second.clone) d.cuGraphDestroy(it->second.clone);
            for (CUgraph g : it->second.retired) d.cuGraphDestroy(g);
        }
        it->second.drop_children(d);
        by_exec_.erase(it);
    }
    std::unordered_map<uint64_t, origin>& all() { return by_exec_; }

  private:
    std::unordered_map<uint64_t, origin> by_exec_;
};

}  // namespace vcuda::server
