#include "server/host_window.hpp"

#include <sys/mman.h>

#include "common/log.hpp"

namespace vcuda::server {

namespace {
constexpr int reserve_flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
}  // namespace

host_window::host_window(uint32_t index) : index_(index) {
    void* want = reinterpret_cast<void*>(common_base);
    void* p = index < count ? ::mmap(want, total, PROT_NONE, reserve_flags | MAP_FIXED_NOREPLACE, -1, 0)
                            : MAP_FAILED;
    if (p != want) {
        if (p != MAP_FAILED) ::munmap(p, total);
        VCUDA_LOG_WARN(
            "host window {}: the common range of host addresses is taken in this process; pinned memory "
            "shared "
            "with clients goes where the kernel puts it, and sessions holding some may fail to move",
            index);
        return;
    }
    base_ = common_base;
    free_[base_ + index_ * span] = span;
}

host_window::~host_window() {
    if (base_) ::munmap(reinterpret_cast<void*>(base_), total);
}

void* host_window::map(int fd, size_t size) {
    std::lock_guard lock(mu_);
    for (auto it = free_.begin(); it != free_.end(); ++it) {
        if (it->second < size) continue;
        auto [at, len] = *it;
        void* want = reinterpret_cast<void*>(at);
        if (::mmap(want, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) != want) return nullptr;
        free_.erase(it);
        if (len > size) free_[at + size] = len - size;
        return want;
    }
    return nullptr;
}

bool host_window::map_at(uintptr_t addr, int fd, size_t size) {
    std::lock_guard lock(mu_);
    if (!inside(addr, size)) return false;
    const uintptr_t mine = base_ + index_ * span;
    if (addr < mine + span && addr + size > mine) {  // this server's window: only a run it has free
        auto it = free_.upper_bound(addr);
        if (it == free_.begin()) return false;
        --it;
        auto [at, len] = *it;
        if (addr + size > at + len) return false;
        free_.erase(it);
        if (addr > at) free_[at] = addr - at;
        if (at + len > addr + size) free_[addr + size] = at + len - (addr + size);
    }
    void* want = reinterpret_cast<void*>(addr);
    return ::mmap(want, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == want;
}

bool host_window::unmap(uintptr_t addr, size_t size, bool reuse) {
    std::lock_guard lock(mu_);
    if (!inside(addr, size)) return false;
    if (::mmap(reinterpret_cast<void*>(addr), size, PROT_NONE, reserve_flags | MAP_FIXED, -1, 0) ==
        MAP_FAILED) {
        ::munmap(reinterpret_cast<void*>(addr), size);  // the pages go; the range is not handed out again
        return true;
    }
    const uintptr_t mine = base_ + index_ * span;
    if (!reuse || addr < mine || addr - mine >= span) return true;  // another server's window
    auto next = free_.lower_bound(addr);
    if (next != free_.end() && next->first == addr + size) {
        size += next->second;
        next = free_.erase(next);
    }
    if (next != free_.begin()) {
        auto prev = std::prev(next);
        if (prev->first + prev->second == addr) {
            prev->second += size;
            return true;
        }
    }
    free_[addr] = size;
    return true;
}

}  // namespace vcuda::server
