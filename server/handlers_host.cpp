// Pinned host memory shared with a client on this host. The server creates the pages (a memfd), maps them,
// registers them with the driver (so the GPU reaches them by DMA, and kernels through their device pointer)
// and passes the file descriptor to the client with the reply; the client maps the same pages, at the same
// address where it can. Copies between such pages and the GPU then move no bytes over the socket.
// Only over a Unix socket: a client on another host has no way to share the pages.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "common/log.hpp"
#include "server/call_context.hpp"
#include "server/ipc.hpp"
#include "server_ops.hpp"

namespace vcuda::server {

namespace {
// A shared copy's optional 5th argument, 1: mark the copy against its host region (the client's staging
// slot), for host_region_wait. The copy was just issued on `s`.
CUresult mark_copy(call_context& cx, uintptr_t host, uint64_t n, CUstream s) {
    if (cx.arg_count() < 5 || cx.arg(4) == 0) return CUDA_SUCCESS;
    auto mark = cx.sess.host_copy_mark(host, n);
    if (!mark) return cx.fail(CUDA_ERROR_INVALID_VALUE, "not this session's shared host memory");
    std::lock_guard lock(mark->mu);
    return record_in_current_context(cx.drv(), mark->event, mark->ctx, s);
}

bool shared_copy_args(const call_context& cx) {
    return cx.expect_args(4) || (cx.expect_args(5) && cx.arg(4) <= 1);
}

// Counts `size` bytes of pinned pages (`what`) against the session's host memory quota, before they exist:
// concurrent lanes cannot both pass.
CUresult reserve_host(call_context& cx, uint64_t size, const std::string& what) {
    std::lock_guard lock(cx.sess.mu);
    if (cx.sess.host.reserve(size, cx.sess.host_quota())) return CUDA_SUCCESS;
    return cx.fail(CUDA_ERROR_OUT_OF_MEMORY,
                   what + " of " + std::to_string(size) + " bytes exceeds the session's host memory quota");
}

void unreserve_host(call_context& cx, uint64_t size) {
    std::lock_guard lock(cx.sess.mu);
    cx.sess.host.unreserve(size);
}

// Registers pages the server mapped with the driver (every context may use them, kernels address them) and
// gives their device pointer; nothing stays registered when that fails.
CUresult register_pages(const driver_table& d, void* p, uint64_t size, CUdeviceptr& dptr) {
    CUresult rc = d.cuMemHostRegister_v2(p, size, host_regions::register_flags);
    if (rc == CUDA_SUCCESS) rc = d.cuMemHostGetDevicePointer_v2(&dptr, p, 0);
    if (rc != CUDA_SUCCESS) d.cuMemHostUnregister(p);
    return rc;
}
}  // namespace

// The memfd travels with the reply.
CUresult handle_host_alloc(call_context& cx, const host_alloc_args& a) {
    if (!cx.lane.stream->raw().is_local())
        return cx.fail(CUDA_ERROR_NOT_SUPPORTED,
                       "shared host memory needs a client on this host (Unix socket)");
    uint64_t size = a.bytes;
    if (size == 0 || size > (uint64_t{1} << 40)) return CUDA_ERROR_INVALID_VALUE;
    size = (size + 4095) & ~uint64_t{4095};
    if (CUresult rc = reserve_host(cx, size, "pinned host memory"); rc != CUDA_SUCCESS) return rc;
    auto unreserve = [&] { unreserve_host(cx, size); };
    int fd = ::memfd_create("vcuda-pinned", MFD_CLOEXEC);
    if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(size)) != 0) {
        if (fd >= 0) ::close(fd);
        unreserve();
        return cx.fail(CUDA_ERROR_OUT_OF_MEMORY, "cannot create shared pages");
    }
    void* p = cx.sess.map_host_pages(fd, size);
    if (!p) {
        ::close(fd);
        unreserve();
        return cx.fail(CUDA_ERROR_OUT_OF_MEMORY, "cannot map shared pages");
    }
    CUdeviceptr dptr = 0;
    if (CUresult rc = register_pages(cx.drv(), p, size, dptr); rc != CUDA_SUCCESS) {
        cx.sess.unmap_host_pages(reinterpret_cast<uintptr_t>(p), size);
        ::close(fd);
        unreserve();
        return rc;
    }
    {
        std::lock_guard lock(cx.sess.mu);
        cx.sess.host.add(reinterpret_cast<uintptr_t>(p), size, ::fcntl(fd, F_DUPFD_CLOEXEC, 0));
    }
    cx.reply_fd = fd;
    cx.out(reinterpret_cast<uint64_t>(p));
    cx.out(static_cast<uint64_t>(dptr));
    return CUDA_SUCCESS;
}

// args {file offset, bytes}, both whole pages; the client's descriptor of the file travels with the call.
// Out {server address, device pointer}. Pages of a file the client maps shared (NCCL's /dev/shm segments,
// memfds: client/host_register.cpp): mapped here too and registered, so kernels reach the very pages the
// client, and every other process mapping the file, sees. Charged to the host quota as pinned memory.
CUresult handle_host_register_file(call_context& cx) {
    unique_fd fd(cx.lane.stream->raw().take_fd());  // first: a refused call must not leave it queued
    if (!cx.expect_args(2) || fd.get() < 0)
        return cx.fail(CUDA_ERROR_INVALID_VALUE, "a file registration needs its offset, size and descriptor");
    const uint64_t offset = cx.arg(0), size = cx.arg(1);
    struct stat st {};
    // The file's last page may be partly past its end (NCCL's segments are not whole pages): it maps whole.
    const auto pages = [](uint64_t n) { return (n + 4095) & ~uint64_t{4095}; };
    if (size == 0 || size > (uint64_t{1} << 40) || offset % 4096 || size % 4096 ||
        ::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) ||
        offset > pages(static_cast<uint64_t>(st.st_size)) ||
        size > pages(static_cast<uint64_t>(st.st_size)) - offset)
        return cx.fail(CUDA_ERROR_INVALID_VALUE, "not whole pages of a regular file the client mapped");
    if (CUresult rc = reserve_host(cx, size, "a shared file's registration"); rc != CUDA_SUCCESS) return rc;
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), static_cast<off_t>(offset));
    fd = unique_fd();  // the mapping keeps the file
    if (p == MAP_FAILED) {
        unreserve_host(cx, size);
        return cx.fail(CUDA_ERROR_INVALID_VALUE,
                       std::string("cannot map the client's file: ") + std::strerror(errno));
    }
    relaxed_capture_scope relaxed(
        cx.drv());  // as NCCL registers its segments: an application capture goes on
    CUdeviceptr dptr = 0;
    if (CUresult rc = register_pages(cx.drv(), p, size, dptr); rc != CUDA_SUCCESS) {
        ::munmap(p, size);
        unreserve_host(cx, size);
        return rc;
    }
    {
        std::lock_guard lock(cx.sess.mu);
        cx.sess.host.add_file(reinterpret_cast<uintptr_t>(p), size);
    }
    cx.out(reinterpret_cast<uint64_t>(p));
    cx.out(static_cast<uint64_t>(dptr));
    return CUDA_SUCCESS;
}

CUresult handle_host_free(call_context& cx, const host_free_args& a) {
    auto addr = static_cast<uintptr_t>(a.server_address);
    size_t size;
    {
        std::lock_guard lock(cx.sess.mu);
        auto removed = cx.sess.host.remove(addr);
        if (!removed) return cx.fail(CUDA_ERROR_INVALID_VALUE, "not a shared host region of this session");
        size = *removed;
    }
    auto& d = cx.drv();
    d.cuCtxSynchronize();  // as cuMemFreeHost: no copy in flight may still use the pages
    cx.sess.unregister_host_pages(addr);
    cx.sess.unmap_host_pages(addr, size);
    return CUDA_SUCCESS;
}

// args {device dst, server address of the source, bytes, stream[, mark (mark_copy)]}. Queued: enqueued on the
// stream as it is.
// Waited for: the copy is complete when the reply goes (cuMemcpyHtoD's behaviour).
CUresult handle_copy_htod_shared(call_context& cx) {
    if (!shared_copy_args(cx)) return cx.bad_arguments();
    CUdeviceptr dst = cx.arg(0);
    auto src = static_cast<uintptr_t>(cx.arg(1));
    uint64_t n = cx.arg(2);
    if (n == 0) return CUDA_SUCCESS;
    if (CUresult rc = cx.device_range_now(dst, n); rc != CUDA_SUCCESS) return rc;
    if (!cx.sess.owns_host(src, n))
        return cx.fail(CUDA_ERROR_INVALID_VALUE, "source is not this session's shared host memory");
    CUstream s;
    if (CUresult rc = cx.handle(3, handle_kind::stream, s); rc != CUDA_SUCCESS) return rc;
    CUresult rc = cx.drv().cuMemcpyHtoDAsync_v2(dst, reinterpret_cast<const void*>(src), n, s);
    if (rc == CUDA_SUCCESS) rc = mark_copy(cx, src, n, s);
    if (rc == CUDA_SUCCESS && !cx.queued()) rc = cx.drv().cuStreamSynchronize(s);
    return rc;
}

// args {server address of the destination, device src, bytes, stream[, mark]}; as handle_copy_htod_shared.
CUresult handle_copy_dtoh_shared(call_context& cx) {
    if (!shared_copy_args(cx)) return cx.bad_arguments();
    auto dst = static_cast<uintptr_t>(cx.arg(0));
    CUdeviceptr src = cx.arg(1);
    uint64_t n = cx.arg(2);
    if (n == 0) return CUDA_SUCCESS;
    if (CUresult rc = cx.device_range_now(src, n); rc != CUDA_SUCCESS) return rc;
    if (!cx.sess.owns_host(dst, n))
        return cx.fail(CUDA_ERROR_INVALID_VALUE, "destination is not this session's shared host memory");
    CUstream s;
    if (CUresult rc = cx.handle(3, handle_kind::stream, s); rc != CUDA_SUCCESS) return rc;
    CUresult rc = cx.drv().cuMemcpyDtoHAsync_v2(reinterpret_cast<void*>(dst), src, n, s);
    if (rc == CUDA_SUCCESS) rc = mark_copy(cx, dst, n, s);
    if (rc == CUDA_SUCCESS && !cx.queued()) rc = cx.drv().cuStreamSynchronize(s);
    return rc;
}

// args {server address}: waits until the last copy marked against the region holding it is done (the
// client's staging slot may be refilled or read).
CUresult handle_host_region_wait(call_context& cx) {
    if (!cx.expect_args(1)) return cx.bad_arguments();
    auto mark = cx.sess.host_copy_mark(static_cast<uintptr_t>(cx.arg(0)), 1);
    if (!mark) return cx.fail(CUDA_ERROR_INVALID_VALUE, "not this session's shared host memory");
    std::lock_guard lock(mark->mu);
    return mark->event ? cx.drv().cuEventSynchronize(mark->event) : CUDA_SUCCESS;
}

}  // namespace vcuda::server
