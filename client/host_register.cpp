// cuMemHostRegister with CU_MEMHOSTREGISTER_DEVICEMAP over shared memory. The GPU can only reach pages the
// server has registered with its driver, and the server can only register pages it maps itself. Two cases:
// - Private memory (malloc, new, anonymous mmap, the heap): the pages holding the range are moved onto a
//   memfd the server made (op host_alloc, as cuMemHostAlloc's pinned memory): their contents are copied into
//   it, then it is mapped over the same addresses (MAP_FIXED), so the application's pointers stay valid and
//   it sees the same bytes.
// - Pages of a file the application maps shared (NCCL's /dev/shm segments, memfds): nothing moves; the
//   file's descriptor goes to the server (op host_register_file), which maps and registers the same pages,
//   so other processes mapping the file see what kernels write.
// Kernels then reach the pages through the server's device pointer, and copies from and into them move no
// bytes over the socket.
//
// What this needs, and the limits (each refusal is CUDA_ERROR_NOT_SUPPORTED with the reason logged):
// - a server on this host (Unix socket) with shared host memory on (VCUDA_SHARED_HOST);
// - private anonymous memory, pages an earlier registration moved, or one shared mapping of a file this
//   process still holds open or can open by its name; private file mappings and the caller's stack are
//   refused;
// - whole pages move: bytes before and after the range on its first and last page move with it (same
//   contents);
// - the application must not write a moved range from another thread while cuMemHostRegister runs (the copy
//   would miss the write);
// - after a fork the moved pages are shared with the child instead of copied on write.
#include "client/host_register.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "client/env_switch.hpp"
#include "client/remote.hpp"
#include "client/remote_call.hpp"
#include "client/unsupported.hpp"
#include "client_ops.hpp"
#include "common/log.hpp"

namespace vcuda::client {

namespace {

constexpr uintptr_t page = 4096;

struct segment {
    uintptr_t lo, hi;  // clipped to the range asked about
    int prot;
    bool shared;            // MAP_SHARED
    unsigned long offset;   // into its file, of `lo`
    unsigned long inode;    // 0: anonymous
    unsigned major, minor;  // the file's device
    std::string path;
};

// The mappings covering [lo, hi), from /proc/self/maps, each clipped to the range; false when the range is
// not all mapped (a hole) or the maps cannot be read.
bool mappings_of(uintptr_t lo, uintptr_t hi, std::vector<segment>& out) {
    FILE* f = std::fopen("/proc/self/maps", "re");
    if (!f) return false;
    char line[4096];
    uintptr_t next = lo;
    while (next < hi && std::fgets(line, sizeof line, f)) {
        unsigned long a = 0, b = 0, offset = 0, inode = 0;
        unsigned major = 0, minor = 0;
        char perms[8] = {};
        int consumed = 0;
        if (std::sscanf(line, "%lx-%lx %7s %lx %x:%x %lu %n", &a, &b, perms, &offset, &major, &minor, &inode,
                        &consumed) < 7)
            continue;
        if (b <= next || a >= hi) continue;
        if (a > next) break;  // a hole before this mapping
        std::string path(line + consumed);
        while (!path.empty() && (path.back() == '\n' || path.back() == ' ')) path.pop_back();
        const int prot = (perms[0] == 'r' ? PROT_READ : 0) | (perms[1] == 'w' ? PROT_WRITE : 0) |
                         (perms[2] == 'x' ? PROT_EXEC : 0);
        const uintptr_t end = b < hi ? b : hi;
        out.push_back({next, end, prot, perms[3] == 's', offset + (next - a), inode, major, minor, path});
        next = end;
    }
    std::fclose(f);
    return next >= hi;
}

// Pages an earlier registration moved, which unregistration left in place (vcuda's own memfd).
bool moved_before(const segment& seg) { return seg.shared && seg.path.rfind("/memfd:vcuda-pinned", 0) == 0; }

// A shared mapping of a file of the application's (not one of vcuda's own memfds).
bool shared_file(const segment& seg) { return seg.shared && seg.inode != 0 && !moved_before(seg); }

// Private anonymous memory (malloc, new, anonymous mmap, the heap), or pages an earlier registration moved:
// pages that can move onto a memfd of the server's. `why` says why not.
bool movable(const std::vector<segment>& segments, std::string& why) {
    for (auto& seg : segments) {
        if (!moved_before(seg) &&
            (seg.shared || seg.inode != 0 ||
             (!seg.path.empty() && seg.path != "[heap]" && seg.path.rfind("[anon:", 0) != 0))) {
            why = "the range is not private anonymous memory (" +
                  (seg.path.empty() ? std::string("shared") : seg.path) + ")";
            return false;
        }
        if (!(seg.prot & PROT_READ)) {
            why = "the range has pages that cannot be read";
            return false;
        }
    }
    return true;
}

// A descriptor of the file a shared file mapping shows, opened read-write (the caller closes it), or -1. The
// application's own descriptors are looked at first: NCCL unlinks a segment's name before registering it, but
// keeps it open. Then the path, when the file still has it.
int open_mapped_file(const segment& seg) {
    const dev_t dev = makedev(seg.major, seg.minor);
    auto same = [&](int fd) {
        struct stat st {};
        return ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_dev == dev && st.st_ino == seg.inode;
    };
    if (DIR* dir = ::opendir("/proc/self/fd")) {
        const int skip = ::dirfd(dir);
        int found = -1;
        while (dirent* e = ::readdir(dir)) {
            char* end = nullptr;
            const long fd = std::strtol(e->d_name, &end, 10);
            if (end == e->d_name || *end || fd == skip || !same(static_cast<int>(fd))) continue;
            // Its own descriptor, read-write (the one the application has may be read-only).
            const std::string self = "/proc/self/fd/" + std::string(e->d_name);
            found = ::open(self.c_str(), O_RDWR | O_CLOEXEC);
            if (found >= 0 && !same(found)) {
                ::close(found);
                found = -1;
            }
            if (found >= 0) break;
        }
        ::closedir(dir);
        if (found >= 0) return found;
    }
    if (seg.path.empty() || seg.path[0] != '/') return -1;
    int fd = ::open(seg.path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd >= 0 && !same(fd)) {  // the name now names another file
        ::close(fd);
        fd = -1;
    }
    return fd;
}

bool sharing_enabled() {  // as client/copy_paths.cpp: VCUDA_SHARED_HOST=0 turns shared host memory off
    return env_switch_on("VCUDA_SHARED_HOST");
}

CUresult refuse(const std::string& why) {
    std::string what = "cuMemHostRegister with CU_MEMHOSTREGISTER_DEVICEMAP (" + why + ")";
    return static_cast<CUresult>(unsupported(what.c_str()));
}

// Pages of a file the application maps shared (NCCL's /dev/shm segments, a memfd): nothing moves. The server
// maps the same file and registers its own mapping (op host_register_file), so kernels write the very pages
// this process, and any other that maps the file, reads.
CUresult share_file_range(const segment& seg, uintptr_t a, size_t size, session& s, host_allocation& r) {
    if (!(seg.prot & PROT_READ)) return refuse("the range has pages that cannot be read");
    const int fd = open_mapped_file(seg);
    if (fd < 0)
        return refuse("the range maps a shared file (" + seg.path +
                      ") that this process no longer holds open and that has no name to open it by");
    const uintptr_t lo = seg.lo;
    call_reply rp;
    CUresult rc = remote(op::host_register_file, {seg.offset, seg.hi - seg.lo}, mode::sync, &rp, {}, {}, fd);
    ::close(fd);
    if (rc != CUDA_SUCCESS) return rc;
    if (rp.outs.size() != 2) return CUDA_ERROR_UNKNOWN;
    r.server_addr = rp.outs[0] + (a - lo);
    r.device_ptr = rp.outs[1] + (a - lo);
    r.owner = &s;
    VCUDA_LOG_DEBUG(
        "cuMemHostRegister: {:#x}+{} of the shared file {} registered by the server (device pointer "
        "{:#x})",
        a, size, seg.path, r.device_ptr);
    return CUDA_SUCCESS;
}

}  // namespace

CUresult share_registered_range(void* p, size_t size, host_allocation& r) {
    session& s = state::get().remote();
    if (!s.local())
        return refuse(
            "mapped host memory needs a server on this host, over a Unix socket: a GPU on another host "
            "cannot address this process's pages");
    if (!sharing_enabled()) return refuse("VCUDA_SHARED_HOST=0: host memory is not shared with the server");
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    uintptr_t end = 0;
    if (__builtin_add_overflow(a, size, &end)) return CUDA_ERROR_INVALID_VALUE;
    const uintptr_t lo = a & ~(page - 1), hi = (end + page - 1) & ~(page - 1);
    const size_t len = hi - lo;

    std::vector<segment> segments;
    if (!mappings_of(lo, hi, segments))
        return CUDA_ERROR_INVALID_VALUE;  // not all mapped: the driver refuses it the same way
    if (segments.size() == 1 && shared_file(segments[0])) return share_file_range(segments[0], a, size, s, r);
    std::string why;
    if (!movable(segments, why)) return refuse(why);
    // Thread stacks: the pages the caller runs on cannot move under it.
    int here = 0;
    const auto sp = reinterpret_cast<uintptr_t>(&here);
    if (sp >= lo && sp < hi) return refuse("the range holds this thread's stack");

    host_alloc_call c("cuMemHostRegister", len);
    CUresult rc = c.send_sync();
    const int fd = c.reply().fd;
    if (rc != CUDA_SUCCESS || fd < 0) {
        if (fd >= 0) ::close(fd);
        return rc == CUDA_SUCCESS ? CUDA_ERROR_UNKNOWN : rc;
    }
    const uint64_t server_addr = c.server_address(), device_ptr = c.device_pointer();
    auto give_back = [&] { (void)host_free_call("cuMemHostRegister", server_addr).send_sync(); };
    // The contents first, through a second mapping of the memfd; then the memfd over the application's pages.
    void* staging = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (staging == MAP_FAILED) {
        ::close(fd);
        give_back();
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    std::memcpy(staging, reinterpret_cast<const void*>(lo), len);
    void* moved =
        ::mmap(reinterpret_cast<void*>(lo), len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
    ::munmap(staging, len);
    ::close(fd);
    if (moved ==
        MAP_FAILED) {  // the old pages are still in place (a failed MAP_FIXED leaves the range as it was
        give_back();   // only when the kernel could not even start; report it either way)
        VCUDA_LOG_ERROR("cuMemHostRegister: mapping the shared pages over {:#x}+{} failed: {}", lo, len,
                        std::strerror(errno));
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    for (auto& seg : segments)  // the protections the application had
        if (seg.prot != (PROT_READ | PROT_WRITE))
            ::mprotect(reinterpret_cast<void*>(seg.lo), seg.hi - seg.lo, seg.prot);
    r.server_addr = server_addr + (a - lo);
    r.device_ptr = device_ptr + (a - lo);
    r.owner = &s;
    VCUDA_LOG_DEBUG(
        "cuMemHostRegister: {:#x}+{} moved onto pages shared with the server (device pointer {:#x})", a, size,
        r.device_ptr);
    return CUDA_SUCCESS;
}

void unshare_registered_range(const host_allocation& r) {
    if (!r.shared() || r.owner->lost()) return;
    const uint64_t region = r.server_addr - (r.base & (page - 1));
    (void)host_free_call("cuMemHostUnregister", region).send_sync();
}

}  // namespace vcuda::client
