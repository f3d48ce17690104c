#include "server/host_window.hpp"

#include <sys/mman.h>

#include "common/log.hpp"

namespace vcuda::server {

namespace {
constexpr int reserve_flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
}  // namespace

host_window::host_window(uint32_t index) {
    void* want = reinterpret_cast<void*>(common_base);
    void* p = index < window_runs::count
                  ? ::mmap(want, window_runs::total, PROT_NONE, reserve_flags | MAP_FIXED_NOREPLACE, -1, 0)
                  : MAP_FAILED;
    if (p != want) {
        if (p != MAP_FAILED) ::munmap(p, window_runs::total);
        VCUDA_LOG_WARN(
            "host window {}: the common range of host addresses is taken in this process; pinned memory "
            "shared "
            "with clients goes where the kernel puts it, and sessions holding some may fail to move",
            index);
        return;
    }
    runs_.start(common_base, index);
}

host_window::~host_window() {
    if (runs_.base()) ::munmap(reinterpret_cast<void*>(runs_.base()), window_runs::total);
}

bool host_window::reassign(uint32_t index) {
    std::lock_guard lock(mu_);
    if (index >= window_runs::count || used_) return false;
    if (runs_.base()) {
        runs_ = window_runs{};
        runs_.start(common_base, index);
    }
    return true;
}

void* host_window::map(int fd, size_t size) {
    std::lock_guard lock(mu_);
    used_ = true;
    const uintptr_t at = runs_.take(size);
    if (!at) return nullptr;
    void* want = reinterpret_cast<void*>(at);
    if (::mmap(want, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == want) return want;
    runs_.give_back(at, size);
    return nullptr;
}

bool host_window::map_at(uintptr_t addr, int fd, size_t size) {
    std::lock_guard lock(mu_);
    used_ = true;
    if (!runs_.claim(addr, size)) return false;
    void* want = reinterpret_cast<void*>(addr);
    return ::mmap(want, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == want;
}

bool host_window::unmap(uintptr_t addr, size_t size, bool reuse) {
    std::lock_guard lock(mu_);
    if (!runs_.inside(addr, size)) return false;
    if (::mmap(reinterpret_cast<void*>(addr), size, PROT_NONE, reserve_flags | MAP_FIXED, -1, 0) ==
        MAP_FAILED) {
        ::munmap(reinterpret_cast<void*>(addr), size);  // the pages go; the range is not handed out again
        return true;
    }
    if (reuse) runs_.give_back(addr, size);
    return true;
}

}  // namespace vcuda::server
