#include "server/device_memory.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <functional>

#include "common/log.hpp"

namespace vcuda::server {

namespace {
size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }
}  // namespace

// Backs [va, va+size) of a reservation with new physical memory, readable and writable from the device. It
// is made exportable as a file descriptor where the driver allows, so that a move to a server on the same GPU
// hands the memory over instead of copying it (save(by_descriptor)).
CUresult device_memory::map_at(CUdeviceptr va, size_t size, CUmemGenericAllocationHandle& h,
                               bool& exportable) {
    auto& d = *drv_;
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev_;
    CUresult rc = create_physical(d, h, size, prop, 0, export_allowed_, exportable);
    if (rc != CUDA_SUCCESS) return rc;
    // The handle type was what the driver refused: later mappings are made plain at once.
    if (!exportable) export_allowed_ = false;
    return map_handle(va, size, h);
}

CUresult create_physical(const driver_table& d, CUmemGenericAllocationHandle& h, size_t size,
                         CUmemAllocationProp prop, unsigned long long flags, bool try_export,
                         bool& exportable) {
    h = 0;
    exportable = (prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != 0;
    if (try_export && prop.requestedHandleTypes == CU_MEM_HANDLE_TYPE_NONE &&
        prop.location.type == CU_MEM_LOCATION_TYPE_DEVICE) {
        prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        CUresult rc = d.cuMemCreate(&h, size, &prop, flags);
        if (rc != CUDA_ERROR_NOT_SUPPORTED && rc != CUDA_ERROR_INVALID_VALUE) {
            exportable = rc == CUDA_SUCCESS;
            return rc;
        }
        prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
    }
    return d.cuMemCreate(&h, size, &prop, flags);
}

CUresult device_memory::map_handle(CUdeviceptr va, size_t size, CUmemGenericAllocationHandle h) {
    auto& d = *drv_;
    CUresult rc = d.cuMemMap(va, size, 0, h, 0);
    if (rc == CUDA_SUCCESS) {
        std::vector<CUmemAccessDesc> access(1 + peers_.size());
        for (size_t i = 0; i < access.size(); ++i) {
            access[i].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
            access[i].location.id = i == 0 ? dev_ : peers_[i - 1];
            access[i].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        }
        rc = d.cuMemSetAccess(va, size, access.data(), access.size());
        if (rc != CUDA_SUCCESS) d.cuMemUnmap(va, size);
    }
    if (rc != CUDA_SUCCESS) d.cuMemRelease(h);
    return rc;
}

CUresult device_memory::map_new(size_t size, bool shared, CUdeviceptr& va) {
    auto& d = *drv_;
    if (!d.cuMemCreate || !d.cuMemAddressReserve || !d.cuMemMap || !d.cuMemSetAccess)
        return CUDA_ERROR_NOT_SUPPORTED;
    settle();
    if (quota_ && (size > quota_ || mapped_ > quota_ - size)) return CUDA_ERROR_OUT_OF_MEMORY;
    CUdeviceptr addr = window_ ? window_->take(d, size) : 0;
    const bool windowed = addr != 0;
    if (!windowed)
        if (CUresult rc = d.cuMemAddressReserve(&addr, size, granularity, 0, 0); rc != CUDA_SUCCESS)
            return rc;
    CUmemGenericAllocationHandle h = 0;
    bool exportable = false;
    if (CUresult rc = map_at(addr, size, h, exportable); rc != CUDA_SUCCESS) {
        if (windowed)
            window_->give_back(addr, size);
        else
            d.cuMemAddressFree(addr, size);
        return rc;
    }
    mapping m;
    m.windowed = windowed;
    m.size = size;
    m.handle = h;
    m.exportable = exportable;
    m.shared = shared;
    if (shared) m.free_runs[0] = size;
    mappings_[addr] = std::move(m);
    mapped_ += size;
    va = addr;
    return CUDA_SUCCESS;
}

void device_memory::unmap(CUdeviceptr va, mapping& m) {
    auto& d = *drv_;
    if (m.handle) {  // none while suspended: only the reservation is left
        d.cuMemUnmap(va, m.size);
        d.cuMemRelease(m.handle);
    }
    free_addresses(va, m);
    mapped_ -= m.size;
}

void device_memory::free_addresses(CUdeviceptr va, const mapping& m) {
    if (!m.windowed)
        drv_->cuMemAddressFree(va, m.size);
    else if (!keep_addresses_)
        window_->give_back(va, m.size);
}

void device_memory::keep_addresses() {
    if (keep_addresses_) return;
    keep_addresses_ = true;
    for (auto& [va, m] : mappings_)
        if (m.windowed) window_->keep(va, m.size);
}

void address_window::reserve_once(const driver_table& d) {
    if (tried_) return;
    tried_ = true;
    CUdeviceptr base = 0;
    if (index_ >= count || !d.cuMemAddressReserve ||
        d.cuMemAddressReserve(&base, window_runs::total, device_memory::granularity, 0, 0) != CUDA_SUCCESS) {
        VCUDA_LOG_WARN(
            "address window {}: the driver gave no common range; sessions' memory goes where the driver puts "
            "it, and moving them to another server may fail",
            index_);
        return;
    }
    runs_.start(base, index_);
    VCUDA_LOG_INFO("address window {}: sessions' memory at {:#x}-{:#x}", index_, runs_.first(),
                   runs_.first() + window_runs::span);
}

bool address_window::reassign(uint32_t index) {
    std::lock_guard lock(mu_);
    if (index >= count || (used_ && index != index_.load())) return false;
    index_.store(index);
    if (runs_.base()) {
        const uint64_t base = runs_.base();
        runs_ = window_runs{};
        runs_.start(base, index);
    }
    return true;
}

CUdeviceptr address_window::take(const driver_table& d, size_t size, size_t align) {
    std::lock_guard lock(mu_);
    used_ = true;
    reserve_once(d);
    align = std::max<size_t>(align, device_memory::granularity);
    if (shared_.take) return runs_.base() ? shared_.take(runs_.base(), size, align) : 0;
    return runs_.take(size, align);
}

void address_window::give_back(CUdeviceptr va, size_t size) {
    std::lock_guard lock(mu_);
    if (shared_.give_back)
        shared_.give_back(va, size);
    else
        runs_.give_back(va, size);
}

void address_window::keep(CUdeviceptr va, size_t size) {
    std::lock_guard lock(mu_);
    if (!shared_.take) runs_.keep(va, size);
}

bool address_window::claim(const driver_table& d, CUdeviceptr va, size_t size) {
    std::lock_guard lock(mu_);
    used_ = true;
    reserve_once(d);
    if (shared_.claim) return runs_.inside(va, size) && shared_.claim(runs_.base(), va, size);
    return runs_.claim(va, size);
}

void device_memory::unmap_bytes::operator()(std::byte* p) const { ::munmap(p, size); }

CUresult copy_registered(const driver_table& d, void* host, size_t size,
                         const std::function<CUresult()>& copy) {
    const bool pinned = d.cuMemHostRegister_v2 && d.cuMemHostRegister_v2(host, size, 0) == CUDA_SUCCESS;
    CUresult rc = copy();
    if (pinned) d.cuMemHostUnregister(host);
    return rc;
}

device_memory::saved_mapping::bytes_type host_pages(size_t size) {
    void* p =
        ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (p == MAP_FAILED) return {nullptr, device_memory::unmap_bytes{0}};
    return {static_cast<std::byte*>(p), device_memory::unmap_bytes{size}};
}

void device_memory::close_descriptor::operator()(int* fd) const {
    ::close(*fd);
    delete fd;
}

std::unique_ptr<int, device_memory::close_descriptor> device_memory::own_descriptor(int fd) {
    return fd < 0 ? nullptr : std::unique_ptr<int, close_descriptor>(new int(fd));
}

CUresult device_memory::save(std::vector<saved_mapping>& out, save_mode mode) const {
    for (const auto& [va, m] : mappings_) {
        if (mode == save_mode::none) {
            saved_mapping s;
            s.va = va;
            s.size = m.size;
            out.push_back(std::move(s));
            continue;
        }
        if (mode == save_mode::descriptor && m.exportable && drv_->cuMemExportToShareableHandle) {
            int fd = -1;
            if (CUresult rc = drv_->cuMemExportToShareableHandle(&fd, m.handle,
                                                                 CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
                rc != CUDA_SUCCESS)
                return rc;
            saved_mapping s;
            s.va = va;
            s.size = m.size;
            s.descriptor = own_descriptor(fd);
            out.push_back(std::move(s));
            continue;
        }
        saved_mapping s;
        s.va = va;
        s.size = m.size;
        s.bytes = host_pages(m.size);
        if (!s.bytes) return CUDA_ERROR_OUT_OF_MEMORY;
        void* p = s.bytes.get();
        CUdeviceptr from = va;
        size_t n = m.size;
        if (CUresult rc = copy_registered(*drv_, p, n, [&] { return drv_->cuMemcpyDtoH_v2(p, from, n); });
            rc != CUDA_SUCCESS)
            return rc;
        out.push_back(std::move(s));
    }
    return CUDA_SUCCESS;
}

void device_memory::drop_physical() {
    for (auto& [va, m] : mappings_) {
        if (!m.handle) continue;
        drv_->cuMemUnmap(va, m.size);
        drv_->cuMemRelease(m.handle);
        m.handle = 0;
    }
    resident_ = false;
}

CUresult device_memory::restore(const std::vector<saved_mapping>& saved) {
    auto s = saved.begin();
    for (auto& [va, m] : mappings_) {
        while (s != saved.end() && s->va < va) ++s;
        if (s == saved.end() || s->va != va || s->size != m.size) return CUDA_ERROR_INVALID_VALUE;
        if (s->fd() >= 0) {  // the same physical memory, handed over: nothing to copy
            CUmemGenericAllocationHandle h = 0;
            if (!drv_->cuMemImportFromShareableHandle) return CUDA_ERROR_NOT_SUPPORTED;
            if (CUresult rc = drv_->cuMemImportFromShareableHandle(
                    &h, reinterpret_cast<void*>(static_cast<uintptr_t>(s->fd())),
                    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
                rc != CUDA_SUCCESS)
                return rc;
            if (CUresult rc = map_handle(va, m.size, h); rc != CUDA_SUCCESS) return rc;
            m.handle = h;
            m.exportable = true;
            continue;
        }
        if (CUresult rc = map_at(va, m.size, m.handle, m.exportable); rc != CUDA_SUCCESS) return rc;
        void* host = s->bytes.get();
        CUdeviceptr to = va;
        size_t n = m.size;
        if (CUresult rc = copy_registered(*drv_, host, n, [&] { return drv_->cuMemcpyHtoD_v2(to, host, n); });
            rc != CUDA_SUCCESS)
            return rc;
    }
    resident_ = true;
    return CUDA_SUCCESS;
}

std::vector<device_memory::moved_mapping> device_memory::mappings_to_move() const {
    std::vector<moved_mapping> out;
    out.reserve(mappings_.size());
    for (const auto& [va, m] : mappings_) out.push_back({va, m.size, m.shared, m.live, m.free_runs});
    return out;
}

CUresult device_memory::adopt(const std::vector<moved_mapping>& mappings, allocation_map allocations,
                              uint64_t heap_charge, std::string& why) {
    auto& d = *drv_;
    uint64_t total = heap_charge;
    for (auto& m : mappings) total += m.size;
    if (quota_ && total > quota_) {
        why = "its " + std::to_string(total >> 20) + " MiB exceed the quota here";
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    for (auto& m : mappings) {
        CUresult rc = m.size % granularity || m.va % granularity ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
        // In the range every server reserved (address_window), else a reservation at exactly its address.
        const bool windowed = rc == CUDA_SUCCESS && window_ && window_->claim(d, m.va, m.size);
        CUdeviceptr got = 0;
        if (rc == CUDA_SUCCESS && !windowed) rc = d.cuMemAddressReserve(&got, m.size, granularity, m.va, 0);
        if (rc == CUDA_SUCCESS && !windowed && got != m.va) {
            d.cuMemAddressFree(got, m.size);
            rc = CUDA_ERROR_ALREADY_MAPPED;
        }
        if (rc != CUDA_SUCCESS) {
            why = "device addresses " + std::to_string(m.va) + "+" + std::to_string(m.size) +
                  " cannot be reserved here (" + std::to_string(static_cast<int>(rc)) +
                  "): the two servers' address windows overlap, or one of them has none";
            for (auto& [va, done] : mappings_) free_addresses(va, done);
            mappings_.clear();
            return rc;
        }
        mapping made;
        made.windowed = windowed;
        made.size = m.size;
        made.shared = m.shared;
        made.free_runs = m.free_runs;
        made.live = m.live;
        mappings_[m.va] = std::move(made);
    }
    allocations_ = std::move(allocations);
    mapped_ = total;
    heap_charge_ = heap_charge;
    resident_ = false;
    return CUDA_SUCCESS;
}

CUresult device_memory::allocate(size_t size, CUdeviceptr& out) {
    if (size == 0) return CUDA_ERROR_INVALID_VALUE;
    if (size > (size_t{1} << 50)) return CUDA_ERROR_OUT_OF_MEMORY;
    if (size <= small_limit) {
        size_t need = round_up(size, small_align);
        for (auto& [va, m] : mappings_) {
            if (!m.shared) continue;
            for (auto it = m.free_runs.begin(); it != m.free_runs.end(); ++it) {
                if (it->second < need) continue;
                size_t off = it->first, len = it->second;
                m.free_runs.erase(it);
                if (len > need) m.free_runs[off + need] = len - need;
                ++m.live;
                out = va + off;
                allocations_[out] = {need, va};
                return CUDA_SUCCESS;
            }
        }
        CUdeviceptr va;
        if (CUresult rc = map_making_room(granularity, true, va); rc != CUDA_SUCCESS) return rc;
        auto& m = mappings_[va];
        m.free_runs.clear();
        if (granularity > need) m.free_runs[need] = granularity - need;
        m.live = 1;
        out = va;
        allocations_[out] = {need, va};
        return CUDA_SUCCESS;
    }
    CUdeviceptr va = 0;
    const size_t whole = round_up(size, granularity);
    if (auto spare = spares_.find(whole); spare != spares_.end()) {
        va = spare->second;
        spares_.erase(spare);
        spare_bytes_ -= whole;
    } else if (CUresult rc = map_making_room(whole, false, va); rc != CUDA_SUCCESS) {
        return rc;
    }
    mappings_[va].live = 1;
    out = va;
    allocations_[out] = {size, va};
    return CUDA_SUCCESS;
}

bool device_memory::take_again(CUdeviceptr p, size_t size) {
    auto it = allocations_.find(p);
    if (it == allocations_.end() || size == 0) return false;
    const mapping& m = mappings_.at(it->second.second);
    if (m.shared ? size > small_limit || round_up(size, small_align) != it->second.first
                 : size <= small_limit || m.size != round_up(size, granularity))
        return false;
    it->second.first = m.shared ? round_up(size, small_align) : size;
    return true;
}

CUresult device_memory::map_making_room(size_t size, bool shared, CUdeviceptr& va) {
    CUresult rc = map_new(size, shared, va);
    if (rc != CUDA_ERROR_OUT_OF_MEMORY || spares_.empty()) return rc;
    drop_spares();  // room for it, rather than memory kept for allocations that may never come
    return map_new(size, shared, va);
}

void device_memory::drop_spares() {
    while (!spares_.empty()) drop_spare(spares_.begin());
}

void device_memory::drop_spare(std::multimap<size_t, CUdeviceptr>::iterator spare) {
    auto [size, va] = *spare;
    spares_.erase(spare);
    spare_bytes_ -= size;
    unmap(va, mappings_.at(va));
    mappings_.erase(va);
}

CUresult device_memory::release(CUdeviceptr p, bool spare) {
    auto it = allocations_.find(p);
    if (it == allocations_.end()) return CUDA_ERROR_INVALID_VALUE;
    auto [size, va] = it->second;
    allocations_.erase(it);
    auto& m = mappings_.at(va);
    if (!m.shared) {
        if (spare && m.handle && m.size <= spare_limit) {
            while (spare_bytes_ + m.size > spare_limit) drop_spare(spares_.begin());  // the smallest first
            m.live = 0;
            spares_.emplace(m.size, va);
            spare_bytes_ += m.size;
            return CUDA_SUCCESS;
        }
        unmap(va, m);
        mappings_.erase(va);
        return CUDA_SUCCESS;
    }
    // Return the run and merge it with its neighbours; an empty shared mapping stays for reuse
    // unless the session holds more than one empty one.
    size_t off = p - va;
    auto next = m.free_runs.lower_bound(off);
    size_t len = size;
    if (next != m.free_runs.end() && next->first == off + len) {
        len += next->second;
        next = m.free_runs.erase(next);
    }
    if (next != m.free_runs.begin()) {
        auto prev = std::prev(next);
        if (prev->first + prev->second == off) {
            off = prev->first;
            len += prev->second;
            m.free_runs.erase(prev);
        }
    }
    m.free_runs[off] = len;
    if (--m.live == 0) {
        unmap(va, m);
        mappings_.erase(va);
    }
    return CUDA_SUCCESS;
}

bool device_memory::contains(CUdeviceptr p, size_t n) const {
    auto it = allocations_.upper_bound(p);
    if (it == allocations_.begin()) return false;
    --it;
    size_t size = it->second.first;
    if (p - it->first >= size) return false;
    return n <= size - (p - it->first);
}

CUresult device_memory::export_allocation(CUdeviceptr p, exported& out) const {
    auto it = allocations_.upper_bound(p);
    if (it == allocations_.begin()) return CUDA_ERROR_INVALID_VALUE;
    --it;
    if (p - it->first >= it->second.first) return CUDA_ERROR_INVALID_VALUE;
    const mapping& m = mappings_.at(it->second.second);
    if (!m.exportable || !m.handle || !drv_->cuMemExportToShareableHandle) return CUDA_ERROR_NOT_SUPPORTED;
    int fd = -1;
    if (CUresult rc =
            drv_->cuMemExportToShareableHandle(&fd, m.handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
        rc != CUDA_SUCCESS)
        return rc;
    out = {it->first, it->second.first, it->second.second, m.size, fd};
    return CUDA_SUCCESS;
}

CUresult device_memory::map_foreign(CUmemGenericAllocationHandle h, size_t size, CUdeviceptr& va) {
    auto& d = *drv_;
    CUdeviceptr addr = window_ ? window_->take(d, size) : 0;
    const bool windowed = addr != 0;
    if (!windowed)
        if (CUresult rc = d.cuMemAddressReserve(&addr, size, granularity, 0, 0); rc != CUDA_SUCCESS) {
            d.cuMemRelease(h);
            return rc;
        }
    if (CUresult rc = map_handle(addr, size, h); rc != CUDA_SUCCESS) {
        if (windowed)
            window_->give_back(addr, size);
        else
            d.cuMemAddressFree(addr, size);
        return rc;
    }
    foreign_[addr] = windowed;
    va = addr;
    return CUDA_SUCCESS;
}

void device_memory::unmap_foreign(CUdeviceptr va, size_t size, CUmemGenericAllocationHandle h) {
    auto it = foreign_.find(va);
    if (it == foreign_.end()) return;
    drv_->cuMemUnmap(va, size);
    drv_->cuMemRelease(h);
    if (!it->second)
        drv_->cuMemAddressFree(va, size);
    else if (!keep_addresses_)
        window_->give_back(va, size);
    foreign_.erase(it);
}

void device_memory::release_all() {
    for (auto& [va, m] : mappings_) unmap(va, m);
    mappings_.clear();
    spares_.clear();
    spare_bytes_ = 0;
    allocations_.clear();
    credit(heap_charge_);  // the context goes, and its heap with it
    heap_charge_ = 0;
}

}  // namespace vcuda::server
