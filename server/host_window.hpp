// Where a server maps the pinned host pages it shares with local clients (server/handlers_host.cpp), so that
// a session moved to another server on this host finds their addresses free there: the pages' address is also
// their device pointer, which the application keeps. As for device memory (address_window in
// server/device_memory.hpp), every server reserves one common range of host addresses at start (measured free
// in processes with and without the CUDA driver) and maps its own sessions' pages only in its window of it; a
// moved session's pages land in the sender's window, which this server never hands out. Freed pages are
// reserved again rather than unmapped, so nothing else of the process lands in the range.
// locks: its own mutex.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>

#include "server/window_runs.hpp"

namespace vcuda::server {

class host_window {
  public:
    explicit host_window(uint32_t index);
    ~host_window();
    host_window(const host_window&) = delete;
    host_window& operator=(const host_window&) = delete;

    // Maps `fd` (size bytes, shared) at a free address of this server's window; null when the common range
    // could not be reserved or the window is full (the caller maps where the kernel chooses then).
    void* map(int fd, size_t size);
    // Maps `fd` at exactly `addr` for a moved session: true when addr lies in the common range outside the
    // ranges this server handed out itself.
    bool map_at(uintptr_t addr, int fd, size_t size);
    // The pages at addr go; true when the range was the window's (reserved again), false when the caller
    // unmaps it. `reuse`: false for a session that moved away (its pages live on at the same addresses).
    bool unmap(uintptr_t addr, size_t size, bool reuse = true);
    // Another window (address_window::reassign), only while nothing was mapped: true when it is this one now.
    bool reassign(uint32_t index);

    static constexpr uintptr_t common_base = uintptr_t{32} << 40;  // 32 TiB

  private:
    std::mutex mu_;
    window_runs runs_;
    bool used_ = false;  // something was mapped here: the window stays
};

}  // namespace vcuda::server
