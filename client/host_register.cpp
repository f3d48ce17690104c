// cuMemHostRegister with CU_MEMHOSTREGISTER_DEVICEMAP over shared memory. The GPU can only reach pages the
// server has registered with its driver, and the server can only register pages it maps itself: so the pages
// holding the application's range are moved onto a memfd the server made (op host_alloc, as cuMemHostAlloc's
// pinned memory): their contents are copied into it, then it is mapped over the same addresses (MAP_FIXED),
// so the application's pointers stay valid and it sees the same bytes. Kernels then reach them through the
// server's device pointer, and copies from and into them move no bytes over the socket.
//
// What this needs, and the limits (each refusal is CUDA_ERROR_NOT_SUPPORTED with the reason logged):
// - a server on this host (Unix socket) with shared host memory on (VCUDA_SHARED_HOST);
// - private anonymous memory (malloc, new, anonymous mmap, the heap), or pages an earlier registration moved:
// a
//   file's pages or shared memory would lose their file or their sharing; the caller's stack is refused too;
// - whole pages move: bytes before and after the range on its first and last page move with it (same
// contents);
// - the application must not write the range from another thread while cuMemHostRegister runs (the copy would
//   miss the write);
// - after a fork the moved pages are shared with the child instead of copied on write.
#include "client/host_register.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "client/remote.hpp"
#include "client/remote_call.hpp"
#include "client/unsupported.hpp"
#include "common/log.hpp"

namespace vcuda::client {

namespace {

constexpr uintptr_t page = 4096;

struct segment {
    uintptr_t lo, hi;
    int prot;
};

// The mappings covering [lo, hi), from /proc/self/maps, each clipped to the range; `why` says why they cannot
// move (an empty `why` and false: a hole, the range is not all mapped).
bool private_anonymous(uintptr_t lo, uintptr_t hi, std::vector<segment>& out, std::string& why) {
    FILE* f = std::fopen("/proc/self/maps", "re");
    if (!f) {
        why = "cannot read /proc/self/maps";
        return false;
    }
    char line[4096];
    uintptr_t next = lo;
    bool ok = true;
    while (ok && next < hi && std::fgets(line, sizeof line, f)) {
        unsigned long a = 0, b = 0, offset = 0, inode = 0;
        char perms[8] = {}, dev[32] = {};
        int consumed = 0;
        if (std::sscanf(line, "%lx-%lx %7s %lx %31s %lu %n", &a, &b, perms, &offset, dev, &inode, &consumed) <
            6)
            continue;
        if (b <= next || a >= hi) continue;
        if (a > next) {  // a hole before this mapping
            ok = false;
            break;
        }
        std::string path(line + consumed);
        while (!path.empty() && (path.back() == '\n' || path.back() == ' ')) path.pop_back();
        // Pages an earlier registration moved and unregistration left here (vcuda's own memfd) move again.
        const bool ours_before = perms[3] == 's' && path.rfind("/memfd:vcuda-pinned", 0) == 0;
        if (!ours_before && (perms[3] != 'p' || inode != 0 ||
                             (!path.empty() && path != "[heap]" && path.rfind("[anon:", 0) != 0))) {
            why = "the range is not private anonymous memory (" +
                  (path.empty() ? std::string("shared") : path) + ")";
            ok = false;
            break;
        }
        int prot = (perms[0] == 'r' ? PROT_READ : 0) | (perms[1] == 'w' ? PROT_WRITE : 0) |
                   (perms[2] == 'x' ? PROT_EXEC : 0);
        if (!(prot & PROT_READ)) {
            why = "the range has pages that cannot be read";
            ok = false;
            break;
        }
        out.push_back({next, b < hi ? b : hi, prot});
        next = b < hi ? b : hi;
    }
    std::fclose(f);
    return ok && next >= hi;
}

bool sharing_enabled() {  // as client/api_memory.cpp: VCUDA_SHARED_HOST=0 turns shared host memory off
    const char* v = std::getenv("VCUDA_SHARED_HOST");
    return !v || std::strcmp(v, "0") != 0;
}

CUresult refuse(const std::string& why) {
    std::string what = "cuMemHostRegister with CU_MEMHOSTREGISTER_DEVICEMAP (" + why + ")";
    return static_cast<CUresult>(unsupported(what.c_str()));
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
    std::string why;
    if (!private_anonymous(lo, hi, segments, why)) {
        if (why.empty())
            return CUDA_ERROR_INVALID_VALUE;  // not all mapped: the driver refuses it the same way
        return refuse(why);
    }
    // Thread stacks: the pages the caller runs on cannot move under it.
    int here = 0;
    const auto sp = reinterpret_cast<uintptr_t>(&here);
    if (sp >= lo && sp < hi) return refuse("the range holds this thread's stack");

    call_reply rp;
    CUresult rc = remote(op::host_alloc, {len}, mode::sync, &rp);
    if (rc != CUDA_SUCCESS || rp.outs.size() != 2 || rp.fd < 0) {
        if (rp.fd >= 0) ::close(rp.fd);
        return rc == CUDA_SUCCESS ? CUDA_ERROR_UNKNOWN : rc;
    }
    const uint64_t server_addr = rp.outs[0], device_ptr = rp.outs[1];
    auto give_back = [&] { remote(op::host_free, {server_addr}, mode::sync); };
    // The contents first, through a second mapping of the memfd; then the memfd over the application's pages.
    void* staging = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, rp.fd, 0);
    if (staging == MAP_FAILED) {
        ::close(rp.fd);
        give_back();
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    std::memcpy(staging, reinterpret_cast<const void*>(lo), len);
    void* moved =
        ::mmap(reinterpret_cast<void*>(lo), len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, rp.fd, 0);
    ::munmap(staging, len);
    ::close(rp.fd);
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
    remote(op::host_free, {region}, mode::sync);
}

}  // namespace vcuda::client
