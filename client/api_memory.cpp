// Device memory (server allocations at the server's real addresses), host memory (the client's own),
// pointer queries (answered from the mirror), copies and sets.
// The paths the copies take are in client/copy_paths.cpp.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "client/copy_paths.hpp"
#include "client/deferred_copies.hpp"
#include "client/entry_point.hpp"
#include "client/host_register.hpp"
#include "client/managed.hpp"
#include "client/plain_call.hpp"
#include "client/remote_call.hpp"
#include "client/state.hpp"
#include "client/trace.hpp"
#include "client_ops.hpp"
#include "common/log.hpp"

using namespace vcuda;
using namespace vcuda::client;

// ---------------------------------------------------------------- device memory

VCUDA_API cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) noexcept {
    VCUDA_TRACE_HOOK(cuMemAlloc_v2, dptr, bytesize);
    VCUDA_REQUIRE_INIT();
    if (!dptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
    int d = current_device();
    if (d < 0) return CUDA_ERROR_INVALID_CONTEXT;
    mem_alloc_call c("cuMemAlloc", bytesize);
    if (CUresult rc = c.send_sync(); rc != CUDA_SUCCESS) return rc;
    const CUdeviceptr p = c.address();
    if (!p) return CUDA_ERROR_UNKNOWN;
    if (!state::get().add_allocation(p, bytesize, d)) {
        (void)mem_free_call("cuMemFree", p).send_sync();
        return refuse_overlapping(p, bytesize, d, "cuMemAlloc");
    }
    *dptr = p;
    state::get().journal().made(op::mem_alloc, std::array<uint64_t, 1>{bytesize}, *dptr);
    return CUDA_SUCCESS;
}

VCUDA_API cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pitch, size_t width, size_t height,
                             unsigned int elem) noexcept {
    VCUDA_TRACE_HOOK(cuMemAllocPitch_v2, dptr, pitch, width, height, elem);
    VCUDA_REQUIRE_INIT();
    if (!dptr || !pitch || width == 0 || height == 0 || (elem != 4 && elem != 8 && elem != 16))
        return CUDA_ERROR_INVALID_VALUE;
    int d = current_device();
    if (d < 0) return CUDA_ERROR_INVALID_CONTEXT;
    mem_alloc_pitch_call c("cuMemAllocPitch", width, height, elem);
    if (CUresult rc = c.send_sync(); rc != CUDA_SUCCESS) return rc;
    const CUdeviceptr p = c.address();
    if (!p) return CUDA_ERROR_UNKNOWN;
    if (!state::get().add_allocation(p, c.pitch() * height, d)) {
        (void)mem_free_call("cuMemFree", p).send_sync();
        return refuse_overlapping(p, c.pitch() * height, d, "cuMemAllocPitch");
    }
    *dptr = p;
    *pitch = c.pitch();
    state::get().journal().made(op::mem_alloc_pitch, std::array<uint64_t, 3>{width, height, elem}, *dptr);
    return CUDA_SUCCESS;
}

VCUDA_API cuMemFree_v2(CUdeviceptr dptr) noexcept {
    VCUDA_TRACE_HOOK(cuMemFree_v2, dptr);
    VCUDA_REQUIRE_INIT();
    if (dptr == 0) return CUDA_SUCCESS;
    // The mirror forgets the allocation before the server frees it: once freed, another thread's allocation
    // may get the same address, which the mirror must then keep. Managed memory loses its CPU view first, so
    // that no other thread's write-back reaches freed memory.
    const bool managed = managed_release(dptr);
    device_allocation a;
    const bool known = state::get().remove_allocation(dptr, a);
    CUresult rc = mem_free_call("cuMemFree", dptr).send_sync();
    if (rc != CUDA_SUCCESS) {
        if (known) state::get().add_allocation(a.base, a.size, a.device);
        if (managed)
            VCUDA_LOG_ERROR("cuMemFree of managed memory at {:#x} failed ({}): its CPU view is gone already",
                            dptr, static_cast<int>(rc));
        return rc;
    }
    state::get().journal().ended(dptr);
    return CUDA_SUCCESS;
}

VCUDA_API cuMemGetInfo_v2(size_t* free, size_t* total) noexcept {
    VCUDA_TRACE_HOOK(cuMemGetInfo_v2, free, total);
    VCUDA_REQUIRE_INIT();
    if (!free || !total) return CUDA_ERROR_INVALID_VALUE;
    mem_get_info_call c("cuMemGetInfo");
    if (CUresult rc = c.send_sync(); rc != CUDA_SUCCESS) return rc;
    *free = c.free();
    *total = c.total();
    return CUDA_SUCCESS;
}

VCUDA_API cuMemGetAddressRange_v2(CUdeviceptr* base, size_t* size, CUdeviceptr dptr) noexcept {
    VCUDA_TRACE_HOOK(cuMemGetAddressRange_v2, base, size, dptr);
    VCUDA_REQUIRE_INIT();
    device_allocation a;
    if (!state::get().find_allocation(dptr, 1, a)) return CUDA_ERROR_NOT_FOUND;
    if (base) *base = a.base;
    if (size) *size = a.size;
    return CUDA_SUCCESS;
}

// ---------------------------------------------------------------- pointer attributes

namespace {
// Mapped pinned memory with a server on another host (cuMemHostAlloc with CU_MEMHOSTALLOC_DEVICEMAP, as XLA
// and cudaHostAllocMapped allocate it): a GPU there cannot reach this process's pages, so the allocation is
// managed memory of the session (client/managed.hpp), at one address for both sides as unified addressing
// gives it natively. The GPU sees the CPU's writes at its next launch, the CPU the GPU's once that work is
// done; a kernel that waits for a CPU write made while it runs waits in vain (README, limits). Kept here:
// each such allocation's base and the flags it was made with (its extent is the mirror's allocation).
std::mutex mapped_mu;
std::map<uintptr_t, unsigned>& mapped_allocations() {
    static auto* m = new std::map<uintptr_t, unsigned>();  // never destroyed: atexit may free memory
    return *m;
}

// Whether allocation `a` of the mirror is such an allocation, and its flags.
bool find_mapped(const device_allocation& a, unsigned& flags) {
    if (!a.managed) return false;
    std::lock_guard lock(mapped_mu);
    auto it = mapped_allocations().find(a.base);
    if (it == mapped_allocations().end()) return false;
    flags = it->second;
    return true;
}

// Whether p lies in such an allocation, and its flags.
bool find_mapped(uintptr_t p, unsigned& flags) {
    device_allocation a;
    return state::get().find_allocation(p, 1, a) && find_mapped(a, flags);
}

CUresult pointer_attribute(void* data, CUpointer_attribute attr, CUdeviceptr ptr) {
    auto& st = state::get();
    device_allocation a;
    host_allocation h;
    bool dev = st.find_allocation(ptr, 1, a);
    bool host = !dev && st.find_host(ptr, h);
    if (!dev && !host) return CUDA_ERROR_INVALID_VALUE;
    int device = dev ? a.device : 0;
    if (unsigned flags = 0; dev && find_mapped(a, flags)) {  // pinned host memory, as the application made it
        switch (attr) {
            case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
                *static_cast<unsigned*>(data) = CU_MEMORYTYPE_HOST;
                return CUDA_SUCCESS;
            case CU_POINTER_ATTRIBUTE_IS_MANAGED:
                *static_cast<unsigned*>(data) = 0;
                return CUDA_SUCCESS;
            default:
                break;  // one address for both sides: the rest as for the allocation
        }
    }
    switch (attr) {
        case CU_POINTER_ATTRIBUTE_CONTEXT:
            *static_cast<CUcontext*>(data) = reinterpret_cast<CUcontext>(st.primary_context(device));
            return CUDA_SUCCESS;
        case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
            *static_cast<unsigned*>(data) = dev ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST;
            return CUDA_SUCCESS;
        case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
            if (!dev && !h.shared())
                return CUDA_ERROR_INVALID_VALUE;  // this process's own pages: the GPU cannot reach them
            *static_cast<CUdeviceptr*>(data) = dev ? ptr : h.device_ptr + (ptr - h.base);
            return CUDA_SUCCESS;
        case CU_POINTER_ATTRIBUTE_HOST_POINTER:
            if (dev && !a.managed) return CUDA_ERROR_INVALID_VALUE;
            *static_cast<void**>(data) = reinterpret_cast<void*>(ptr);
            return CUDA_SUCCESS;
        case CU_POINTER_ATTRIBUTE_IS_MANAGED:
            *static_cast<unsigned*>(data) = dev && a.managed;
            return CUDA_SUCCESS;
        case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
            *static_cast<int*>(data) = device;
            return CUDA_SUCCESS;
        case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
            *static_cast<CUdeviceptr*>(data) = dev ? a.base : h.base;
            return CUDA_SUCCESS;
        case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
            *static_cast<size_t*>(data) = dev ? a.size : h.size;
            return CUDA_SUCCESS;
        case CU_POINTER_ATTRIBUTE_MAPPED:
            *static_cast<unsigned*>(data) = 1;
            return CUDA_SUCCESS;
        case CU_POINTER_ATTRIBUTE_BUFFER_ID:
            *static_cast<unsigned long long*>(data) = dev ? a.base : h.base;
            return CUDA_SUCCESS;
        case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS:
        case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
        case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
        case CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE:
        case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS:
            *static_cast<unsigned*>(data) = 0;
            return CUDA_SUCCESS;
        case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
            *static_cast<void**>(data) = nullptr;
            return CUDA_SUCCESS;
        default:
            return CUDA_ERROR_INVALID_VALUE;
    }
}
}  // namespace

VCUDA_API cuPointerGetAttribute(void* data, CUpointer_attribute attr, CUdeviceptr ptr) noexcept {
    VCUDA_TRACE_HOOK(cuPointerGetAttribute, data, attr, ptr);
    VCUDA_REQUIRE_INIT();
    if (!data) return CUDA_ERROR_INVALID_VALUE;
    return pointer_attribute(data, attr, ptr);
}

VCUDA_API cuPointerGetAttributes(unsigned int n, CUpointer_attribute* attrs, void** data,
                                 CUdeviceptr ptr) noexcept {
    VCUDA_TRACE_HOOK(cuPointerGetAttributes, n, attrs, data, ptr);
    VCUDA_REQUIRE_INIT();
    if (!attrs || !data) return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < n; ++i) {
        if (!data[i]) continue;
        if (pointer_attribute(data[i], attrs[i], ptr) != CUDA_SUCCESS) {
            // Unknown memory: the driver reports it as unregistered instead of failing the whole query.
            if (attrs[i] == CU_POINTER_ATTRIBUTE_MEMORY_TYPE)
                *static_cast<unsigned*>(data[i]) = 0;
            else if (attrs[i] == CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL)
                *static_cast<int*>(data[i]) = -2;
            else if (attrs[i] == CU_POINTER_ATTRIBUTE_CONTEXT ||
                     attrs[i] == CU_POINTER_ATTRIBUTE_HOST_POINTER ||
                     attrs[i] == CU_POINTER_ATTRIBUTE_DEVICE_POINTER)
                *static_cast<void**>(data[i]) = nullptr;
        }
    }
    return CUDA_SUCCESS;
}

// ---------------------------------------------------------------- host memory: the client's own pages

VCUDA_API cuMemHostAlloc(void** pp, size_t bytesize, unsigned int flags) noexcept {
    VCUDA_TRACE_HOOK(cuMemHostAlloc, pp, bytesize, flags);
    VCUDA_REQUIRE_INIT();
    if (!pp || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
    if (flags & ~(CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED))
        return CUDA_ERROR_INVALID_VALUE;
    host_allocation h;
    h.size = bytesize;
    h.flags = flags;
    CUresult rc = shared_host_alloc(h);
    if (rc == CUDA_ERROR_OUT_OF_MEMORY && release_staging_slots()) rc = shared_host_alloc(h);
    if (rc != CUDA_ERROR_NOT_SUPPORTED) {
        if (rc != CUDA_SUCCESS) return rc;
    } else if (CUdeviceptr m = 0; (flags & CU_MEMHOSTALLOC_DEVICEMAP) &&
                                  managed_alloc(&m, bytesize, CU_MEM_ATTACH_GLOBAL) == CUDA_SUCCESS) {
        std::lock_guard lock(mapped_mu);
        mapped_allocations()[m] = flags;
        *pp = reinterpret_cast<void*>(m);
        return CUDA_SUCCESS;
    } else {  // a server on another host: this process's own pages, copied over the socket
        void* p = mmap(nullptr, bytesize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
        mlock(p, bytesize);  // page-locked where the system allows it; not fatal when it does not
        h.base = reinterpret_cast<uintptr_t>(p);
    }
    state::get().add_host(h);
    *pp = reinterpret_cast<void*>(h.base);
    return CUDA_SUCCESS;
}

VCUDA_API cuMemAllocHost_v2(void** pp, size_t bytesize) noexcept {
    VCUDA_TRACE_HOOK(cuMemAllocHost_v2, pp, bytesize);
    return cuMemHostAlloc(pp, bytesize, 0);
}

VCUDA_API cuMemFreeHost(void* p) noexcept {
    VCUDA_TRACE_HOOK(cuMemFreeHost, p);
    VCUDA_REQUIRE_INIT();
    {
        std::unique_lock lock(mapped_mu);
        if (mapped_allocations().erase(reinterpret_cast<uintptr_t>(p)) != 0) {
            lock.unlock();
            return cuMemFree_v2(reinterpret_cast<CUdeviceptr>(p));
        }
    }
    host_allocation h;
    if (!p || !state::get().find_host(reinterpret_cast<uintptr_t>(p), h) || h.registered ||
        h.base != reinterpret_cast<uintptr_t>(p))
        return CUDA_ERROR_INVALID_VALUE;
    settle_range(p, h.size);  // copies still under way into it land before it goes
    state::get().remove_host(h.base, h);
    drop_host_shadows(h.base);
    if (h.shared()) shared_host_free(h);
    munmap(p, h.size);
    return CUDA_SUCCESS;
}

VCUDA_API cuMemHostRegister_v2(void* p, size_t bytesize, unsigned int flags) noexcept {
    VCUDA_TRACE_HOOK(cuMemHostRegister_v2, p, bytesize, flags);
    VCUDA_REQUIRE_INIT();
    if (!p || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
    if (flags & ~(CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_IOMEMORY |
                  CU_MEMHOSTREGISTER_READ_ONLY))
        return CUDA_ERROR_INVALID_VALUE;
    if (flags &
        CU_MEMHOSTREGISTER_IOMEMORY)  // device memory of a third party (PCIe BARs): not this process's pages
        return static_cast<CUresult>(unsupported("cuMemHostRegister with CU_MEMHOSTREGISTER_IOMEMORY"));
    const auto a = reinterpret_cast<uintptr_t>(p);
    uintptr_t end = 0;
    if (__builtin_add_overflow(a, bytesize, &end)) return CUDA_ERROR_INVALID_VALUE;
    // DEVICEMAP moves whole pages (client/host_register.cpp): no other host memory of ours may share them.
    const bool mapped = flags & CU_MEMHOSTREGISTER_DEVICEMAP;
    const uintptr_t lo = mapped ? a & ~uintptr_t{4095} : a,
                    hi = mapped ? (end + 4095) & ~uintptr_t{4095} : end;
    if (state::get().host_overlaps(lo, hi)) return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    host_allocation r;
    r.base = a;
    r.size = bytesize;
    r.flags = flags;
    r.registered = true;
    // PORTABLE and READ_ONLY change nothing here: one context per device, and the GPU only reads what it is
    // given.
    if (mapped)
        if (CUresult rc = share_registered_range(p, bytesize, r); rc != CUDA_SUCCESS) return rc;
    state::get().add_host(r);
    return CUDA_SUCCESS;
}

VCUDA_API cuMemHostUnregister(void* p) noexcept {
    VCUDA_TRACE_HOOK(cuMemHostUnregister, p);
    VCUDA_REQUIRE_INIT();
    host_allocation h;
    if (!p || !state::get().find_host(reinterpret_cast<uintptr_t>(p), h) || !h.registered ||
        h.base != reinterpret_cast<uintptr_t>(p))
        return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
    settle_range(p, h.size);  // copies still under way into it land before it goes
    state::get().remove_host(h.base, h);
    drop_host_shadows(h.base);
    unshare_registered_range(h);
    return CUDA_SUCCESS;
}

VCUDA_API cuMemHostGetFlags(unsigned int* flags, void* p) noexcept {
    VCUDA_TRACE_HOOK(cuMemHostGetFlags, flags, p);
    VCUDA_REQUIRE_INIT();
    if (!flags) return CUDA_ERROR_INVALID_VALUE;
    if (find_mapped(reinterpret_cast<uintptr_t>(p), *flags)) return CUDA_SUCCESS;
    host_allocation h;
    if (!state::get().find_host(reinterpret_cast<uintptr_t>(p), h)) return CUDA_ERROR_INVALID_VALUE;
    *flags = h.flags;
    return CUDA_SUCCESS;
}

VCUDA_API cuMemHostGetDevicePointer_v2(CUdeviceptr* pdptr, void* p, unsigned int Flags) noexcept {
    VCUDA_TRACE_HOOK(cuMemHostGetDevicePointer_v2, pdptr, p, Flags);
    VCUDA_REQUIRE_INIT();
    if (!pdptr || Flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (unsigned flags = 0; find_mapped(reinterpret_cast<uintptr_t>(p), flags)) {
        *pdptr = reinterpret_cast<CUdeviceptr>(p);  // one address for both sides
        return CUDA_SUCCESS;
    }
    host_allocation h;
    if (!state::get().find_host(reinterpret_cast<uintptr_t>(p), h)) return CUDA_ERROR_INVALID_VALUE;
    if (!h.shared())  // the GPU is on another host: it cannot address this process's pages
        return static_cast<CUresult>(
            unsupported("cuMemHostGetDevicePointer (mapped host memory needs a server on this host, over a "
                        "Unix socket)"));
    *pdptr = h.device_ptr + (reinterpret_cast<uintptr_t>(p) - h.base);
    return CUDA_SUCCESS;
}

// ---------------------------------------------------------------- copies

VCUDA_API cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t n) noexcept {
    VCUDA_TRACE_HOOK(cuMemcpyHtoD_v2, dst, src, n);
    return copy_htod(dst, src, n, nullptr, mode::sync);
}
VCUDA_API cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, size_t n) noexcept {
    VCUDA_TRACE_HOOK(cuMemcpyDtoH_v2, dst, src, n);
    return copy_dtoh(dst, src, n, nullptr);
}
VCUDA_API cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n) noexcept {
    VCUDA_TRACE_HOOK(cuMemcpyDtoD_v2, dst, src, n);
    return copy_dtod(dst, src, n, nullptr, mode::sync);
}
VCUDA_API cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t n, CUstream s) noexcept {
    VCUDA_TRACE_HOOK(cuMemcpyHtoDAsync_v2, dst, src, n, s);
    if (check_stream(s) != CUDA_SUCCESS) return CUDA_ERROR_INVALID_HANDLE;
    return copy_htod(dst, src, n, s, mode::post);
}
VCUDA_API cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t n, CUstream s) noexcept {
    VCUDA_TRACE_HOOK(cuMemcpyDtoHAsync_v2, dst, src, n, s);
    if (check_stream(s) != CUDA_SUCCESS) return CUDA_ERROR_INVALID_HANDLE;
    return copy_dtoh(dst, src, n, s, mode::post);
}
VCUDA_API cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) noexcept {
    VCUDA_TRACE_HOOK(cuMemcpyDtoDAsync_v2, dst, src, n, s);
    if (check_stream(s) != CUDA_SUCCESS) return CUDA_ERROR_INVALID_HANDLE;
    return copy_dtod(dst, src, n, s, mode::post);
}
VCUDA_API cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n) noexcept {
    VCUDA_TRACE_HOOK(cuMemcpy, dst, src, n);
    VCUDA_REQUIRE_INIT();
    return copy_any(dst, src, n, nullptr, mode::sync);
}
VCUDA_API cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) noexcept {
    VCUDA_TRACE_HOOK(cuMemcpyAsync, dst, src, n, s);
    VCUDA_REQUIRE_INIT();
    if (check_stream(s) != CUDA_SUCCESS) return CUDA_ERROR_INVALID_HANDLE;
    return copy_any(dst, src, n, s, mode::post);
}
VCUDA_API cuMemcpy2D_v2(const CUDA_MEMCPY2D* p) noexcept {
    VCUDA_TRACE_HOOK(cuMemcpy2D_v2, p);
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    return copy_3d(from_2d(*p), nullptr, mode::sync);
}
VCUDA_API cuMemcpy2DUnaligned_v2(const CUDA_MEMCPY2D* p) noexcept {
    VCUDA_TRACE_HOOK(cuMemcpy2DUnaligned_v2, p);
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    return copy_3d(from_2d(*p), nullptr, mode::sync);
}
VCUDA_API cuMemcpy2DAsync_v2(const CUDA_MEMCPY2D* p, CUstream s) noexcept {
    VCUDA_TRACE_HOOK(cuMemcpy2DAsync_v2, p, s);
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    if (check_stream(s) != CUDA_SUCCESS) return CUDA_ERROR_INVALID_HANDLE;
    return copy_3d(from_2d(*p), s, mode::post);
}
VCUDA_API cuMemcpy3D_v2(const CUDA_MEMCPY3D* p) noexcept {
    VCUDA_TRACE_HOOK(cuMemcpy3D_v2, p);
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    return copy_3d(*p, nullptr, mode::sync);
}
VCUDA_API cuMemcpy3DAsync_v2(const CUDA_MEMCPY3D* p, CUstream s) noexcept {
    VCUDA_TRACE_HOOK(cuMemcpy3DAsync_v2, p, s);
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    if (check_stream(s) != CUDA_SUCCESS) return CUDA_ERROR_INVALID_HANDLE;
    return copy_3d(*p, s, mode::post);
}

// ---------------------------------------------------------------- batches of copies (CUDA 12.8)
// A batch runs as its copies, one after another on its stream: the driver promises no order within a batch,
// so this is one it may choose. A source the attributes say is read during the call
// (CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL: a stack buffer, say) must be read when the call returns;
// pinned memory shared with the server is read by the GPU in stream order, so a batch holding such a copy
// waits for its stream before it returns.

namespace {

bool valid_access_order(CUmemcpySrcAccessOrder o) {
    return o == CU_MEMCPY_SRC_ACCESS_ORDER_STREAM || o == CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL ||
           o == CU_MEMCPY_SRC_ACCESS_ORDER_ANY;
}

// A batch's stream: a live stream, never the legacy one (the driver refuses it).
CUresult batch_stream(CUstream s) {
    if (s == nullptr || s == CU_STREAM_LEGACY) return CUDA_ERROR_INVALID_VALUE;
    return check_stream(s);
}

// Waits for `s` when a copy of the batch read its source during the call.
CUresult batch_done(bool read_during_call, CUstream s) {
    if (!read_during_call) return CUDA_SUCCESS;
    return remote(op::cuStreamSynchronize, {reinterpret_cast<uint64_t>(s)}, mode::sync);
}

CUresult copy_batch(const CUdeviceptr* dsts, const CUdeviceptr* srcs, const size_t* sizes, size_t count,
                    const CUmemcpyAttributes* attrs, const size_t* attrs_idxs, size_t num_attrs, CUstream s,
                    size_t* fail_idx) {
    VCUDA_REQUIRE_INIT();
    if (fail_idx) *fail_idx = SIZE_MAX;
    if (!dsts || !srcs || !sizes || !attrs || !attrs_idxs || count == 0 || num_attrs == 0 ||
        num_attrs > count || attrs_idxs[0] != 0)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t k = 0; k < num_attrs; ++k)
        if (!valid_access_order(attrs[k].srcAccessOrder) ||
            (k > 0 && (attrs_idxs[k] <= attrs_idxs[k - 1] || attrs_idxs[k] >= count)))
            return CUDA_ERROR_INVALID_VALUE;
    if (CUresult rc = batch_stream(s); rc != CUDA_SUCCESS) return rc;
    bool read_during_call = false;
    for (size_t i = 0, k = 0; i < count; ++i) {
        while (k + 1 < num_attrs && attrs_idxs[k + 1] <= i) ++k;
        if (CUresult rc = copy_any(dsts[i], srcs[i], sizes[i], s, mode::post); rc != CUDA_SUCCESS) {
            if (fail_idx) *fail_idx = i;
            return rc;
        }
        read_during_call |= attrs[k].srcAccessOrder == CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL;
    }
    return batch_done(read_during_call, s);
}

// One side of a 3D batch copy as a CUDA_MEMCPY3D side: a pointer (rows of rowLength elements, layers of
// layerHeight rows; 0: packed) or an array at an offset in elements.
CUresult batch_side(const CUmemcpy3DOperand& o, const CUextent3D& e, uint64_t elem, CUmemorytype& type,
                    CUdeviceptr& ptr, CUarray& array, size_t& x_bytes, size_t& y, size_t& z, size_t& pitch,
                    size_t& height) {
    switch (o.type) {
        case CU_MEMCPY_OPERAND_TYPE_POINTER:
            if ((o.op.ptr.rowLength && o.op.ptr.rowLength < e.width) ||
                (o.op.ptr.layerHeight && o.op.ptr.layerHeight < e.height))
                return CUDA_ERROR_INVALID_VALUE;
            type = CU_MEMORYTYPE_UNIFIED;
            ptr = o.op.ptr.ptr;
            pitch = (o.op.ptr.rowLength ? o.op.ptr.rowLength : e.width) * elem;
            height = o.op.ptr.layerHeight ? o.op.ptr.layerHeight : e.height;
            return CUDA_SUCCESS;
        case CU_MEMCPY_OPERAND_TYPE_ARRAY:
            type = CU_MEMORYTYPE_ARRAY;
            array = o.op.array.array;
            x_bytes = o.op.array.offset.x * elem;
            y = o.op.array.offset.y;
            z = o.op.array.offset.z;
            return CUDA_SUCCESS;
        default:
            return CUDA_ERROR_INVALID_VALUE;
    }
}

// The element size of a 3D batch copy: 1 between pointers, else the array's (the same for two arrays).
CUresult batch_element(const CUDA_MEMCPY3D_BATCH_OP& op, uint64_t& elem) {
    elem = 1;
    uint64_t seen = 0;
    for (const CUmemcpy3DOperand* o : {&op.src, &op.dst}) {
        if (o->type != CU_MEMCPY_OPERAND_TYPE_ARRAY) continue;
        uint64_t e = array_element_bytes(reinterpret_cast<uint64_t>(o->op.array.array));
        if (e == 0) return CUDA_ERROR_INVALID_HANDLE;
        if (seen && e != seen) return CUDA_ERROR_INVALID_VALUE;
        seen = elem = e;
    }
    return CUDA_SUCCESS;
}

CUresult copy_batch_3d(size_t num_ops, const CUDA_MEMCPY3D_BATCH_OP* ops, unsigned long long flags,
                       CUstream s, size_t* fail_idx) {
    VCUDA_REQUIRE_INIT();
    if (fail_idx) *fail_idx = SIZE_MAX;
    if (num_ops == 0 || !ops || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < num_ops; ++i)
        if (!valid_access_order(ops[i].srcAccessOrder) || !ops[i].extent.width || !ops[i].extent.height ||
            !ops[i].extent.depth)
            return CUDA_ERROR_INVALID_VALUE;
    if (CUresult rc = batch_stream(s); rc != CUDA_SUCCESS) return rc;
    bool read_during_call = false;
    for (size_t i = 0; i < num_ops; ++i) {
        const auto& op = ops[i];
        CUDA_MEMCPY3D c{};
        uint64_t elem = 1;
        CUresult rc = batch_element(op, elem);
        if (rc == CUDA_SUCCESS)
            rc = batch_side(op.src, op.extent, elem, c.srcMemoryType, c.srcDevice, c.srcArray, c.srcXInBytes,
                            c.srcY, c.srcZ, c.srcPitch, c.srcHeight);
        if (rc == CUDA_SUCCESS)
            rc = batch_side(op.dst, op.extent, elem, c.dstMemoryType, c.dstDevice, c.dstArray, c.dstXInBytes,
                            c.dstY, c.dstZ, c.dstPitch, c.dstHeight);
        c.WidthInBytes = op.extent.width * elem;
        c.Height = op.extent.height;
        c.Depth = op.extent.depth;
        if (rc == CUDA_SUCCESS) rc = copy_3d(c, s, mode::post);
        if (rc != CUDA_SUCCESS) {
            if (fail_idx) *fail_idx = i;
            return rc;
        }
        read_during_call |= op.srcAccessOrder == CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL;
    }
    return batch_done(read_during_call, s);
}

}  // namespace

VCUDA_API cuMemcpyBatchAsync(CUdeviceptr* dsts, CUdeviceptr* srcs, size_t* sizes, size_t count,
                             CUmemcpyAttributes* attrs, size_t* attrsIdxs, size_t numAttrs, size_t* failIdx,
                             CUstream hStream) noexcept {
    VCUDA_TRACE_HOOK(cuMemcpyBatchAsync, dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs, failIdx,
                     hStream);
    return copy_batch(dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs, hStream, failIdx);
}

VCUDA_API cuMemcpyBatchAsync_v2(CUdeviceptr* dsts, CUdeviceptr* srcs, size_t* sizes, size_t count,
                                CUmemcpyAttributes* attrs, size_t* attrsIdxs, size_t numAttrs,
                                CUstream hStream) noexcept {
    VCUDA_TRACE_HOOK(cuMemcpyBatchAsync_v2, dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs, hStream);
    return copy_batch(dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs, hStream, nullptr);
}

VCUDA_API cuMemcpy3DBatchAsync(size_t numOps, CUDA_MEMCPY3D_BATCH_OP* opList, size_t* failIdx,
                               unsigned long long flags, CUstream hStream) noexcept {
    VCUDA_TRACE_HOOK(cuMemcpy3DBatchAsync, numOps, opList, failIdx, flags, hStream);
    return copy_batch_3d(numOps, opList, flags, hStream, failIdx);
}

VCUDA_API cuMemcpy3DBatchAsync_v2(size_t numOps, CUDA_MEMCPY3D_BATCH_OP* opList, unsigned long long flags,
                                  CUstream hStream) noexcept {
    VCUDA_TRACE_HOOK(cuMemcpy3DBatchAsync_v2, numOps, opList, flags, hStream);
    return copy_batch_3d(numOps, opList, flags, hStream, nullptr);
}

// ---------------------------------------------------------------- sets

VCUDA_API cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n) noexcept {
    VCUDA_TRACE_HOOK(cuMemsetD8_v2, d, v, n);
    return memset_2d(d, n, v, 1, n, 1, nullptr, mode::sync);
}
VCUDA_API cuMemsetD16_v2(CUdeviceptr d, unsigned short v, size_t n) noexcept {
    VCUDA_TRACE_HOOK(cuMemsetD16_v2, d, v, n);
    return memset_2d(d, n * 2, v, 2, n, 1, nullptr, mode::sync);
}
VCUDA_API cuMemsetD32_v2(CUdeviceptr d, unsigned int v, size_t n) noexcept {
    VCUDA_TRACE_HOOK(cuMemsetD32_v2, d, v, n);
    return memset_2d(d, n * 4, v, 4, n, 1, nullptr, mode::sync);
}
VCUDA_API cuMemsetD2D8_v2(CUdeviceptr d, size_t pitch, unsigned char v, size_t w, size_t h) noexcept {
    VCUDA_TRACE_HOOK(cuMemsetD2D8_v2, d, pitch, v, w, h);
    return memset_2d(d, pitch, v, 1, w, h, nullptr, mode::sync);
}
VCUDA_API cuMemsetD2D16_v2(CUdeviceptr d, size_t pitch, unsigned short v, size_t w, size_t h) noexcept {
    VCUDA_TRACE_HOOK(cuMemsetD2D16_v2, d, pitch, v, w, h);
    return memset_2d(d, pitch, v, 2, w, h, nullptr, mode::sync);
}
VCUDA_API cuMemsetD2D32_v2(CUdeviceptr d, size_t pitch, unsigned int v, size_t w, size_t h) noexcept {
    VCUDA_TRACE_HOOK(cuMemsetD2D32_v2, d, pitch, v, w, h);
    return memset_2d(d, pitch, v, 4, w, h, nullptr, mode::sync);
}
VCUDA_API cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, CUstream s) noexcept {
    VCUDA_TRACE_HOOK(cuMemsetD8Async, d, v, n, s);
    return memset_2d(d, n, v, 1, n, 1, s, mode::post);
}
VCUDA_API cuMemsetD16Async(CUdeviceptr d, unsigned short v, size_t n, CUstream s) noexcept {
    VCUDA_TRACE_HOOK(cuMemsetD16Async, d, v, n, s);
    return memset_2d(d, n * 2, v, 2, n, 1, s, mode::post);
}
VCUDA_API cuMemsetD32Async(CUdeviceptr d, unsigned int v, size_t n, CUstream s) noexcept {
    VCUDA_TRACE_HOOK(cuMemsetD32Async, d, v, n, s);
    return memset_2d(d, n * 4, v, 4, n, 1, s, mode::post);
}
VCUDA_API cuMemsetD2D8Async(CUdeviceptr d, size_t pitch, unsigned char v, size_t w, size_t h,
                            CUstream s) noexcept {
    VCUDA_TRACE_HOOK(cuMemsetD2D8Async, d, pitch, v, w, h, s);
    return memset_2d(d, pitch, v, 1, w, h, s, mode::post);
}
VCUDA_API cuMemsetD2D16Async(CUdeviceptr d, size_t pitch, unsigned short v, size_t w, size_t h,
                             CUstream s) noexcept {
    VCUDA_TRACE_HOOK(cuMemsetD2D16Async, d, pitch, v, w, h, s);
    return memset_2d(d, pitch, v, 2, w, h, s, mode::post);
}
VCUDA_API cuMemsetD2D32Async(CUdeviceptr d, size_t pitch, unsigned int v, size_t w, size_t h,
                             CUstream s) noexcept {
    VCUDA_TRACE_HOOK(cuMemsetD2D32Async, d, pitch, v, w, h, s);
    return memset_2d(d, pitch, v, 4, w, h, s, mode::post);
}
