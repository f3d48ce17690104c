// Managed memory's entry points: allocation, prefetch, advice, range attributes and stream attachment. The
// memory is a device allocation of the session; its CPU view and coherence are client/managed.cpp's.
#include <array>
#include <cstdint>

#include "client/copy_paths.hpp"
#include "client/entry_point.hpp"
#include "client/managed.hpp"
#include "client/state.hpp"
#include "client/trace.hpp"
#include "client_ops.hpp"

using namespace vcuda;
using namespace vcuda::client;

namespace {

// The server packs allocations of up to 1 MiB into shared 2 MiB mappings (server/device_memory.hpp); a
// managed allocation needs whole pages of its own for its CPU view, so it asks for whole 2 MiB granules.
constexpr size_t managed_granule = 2u << 20;

CUmemLocation device_location(CUdevice d) {
    CUmemLocation l{};
    if (d == CU_DEVICE_CPU) {
        l.type = CU_MEM_LOCATION_TYPE_HOST;
    } else {
        l.type = CU_MEM_LOCATION_TYPE_DEVICE;
        l.id = d;
    }
    return l;
}

}  // namespace

CUresult vcuda::client::managed_alloc(CUdeviceptr* dptr, size_t bytesize, unsigned flags) {
    const int d = current_device();
    if (d < 0) return CUDA_ERROR_INVALID_CONTEXT;
    if (!state::get().attribute(d, CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY)) return CUDA_ERROR_NOT_SUPPORTED;
    if (bytesize > SIZE_MAX - managed_granule) return CUDA_ERROR_OUT_OF_MEMORY;
    const size_t asked = (bytesize + managed_granule - 1) / managed_granule * managed_granule;
    mem_alloc_call c("cuMemAllocManaged", asked);
    if (CUresult rc = c.send_sync(); rc != CUDA_SUCCESS) return rc;
    const uint64_t p = c.address();
    if (!p) return CUDA_ERROR_UNKNOWN;
    state::get().add_allocation(p, bytesize, d, false, true);
    if (CUresult rc = managed_adopt(p, bytesize, d, current_context(), flags); rc != CUDA_SUCCESS) {
        device_allocation a;
        state::get().remove_allocation(p, a);
        (void)mem_free_call("cuMemFree", p).send_sync();
        return rc;
    }
    state::get().journal().made(op::mem_alloc, std::array<uint64_t, 1>{asked}, p);
    *dptr = p;
    return CUDA_SUCCESS;
}

VCUDA_API cuMemAllocManaged(CUdeviceptr* dptr, size_t bytesize, unsigned int flags) noexcept {
    VCUDA_TRACE_HOOK(cuMemAllocManaged, dptr, bytesize, flags);
    VCUDA_REQUIRE_INIT();
    if (!dptr || bytesize == 0 || (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST))
        return CUDA_ERROR_INVALID_VALUE;
    return managed_alloc(dptr, bytesize, flags);
}

VCUDA_API cuMemPrefetchAsync_v2(CUdeviceptr p, size_t n, CUmemLocation location, unsigned int flags,
                                CUstream stream) noexcept {
    VCUDA_TRACE_HOOK(cuMemPrefetchAsync_v2, p, n, location, flags, stream);
    VCUDA_REQUIRE_INIT();
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (check_stream(stream) != CUDA_SUCCESS) return CUDA_ERROR_INVALID_HANDLE;
    return managed_prefetch(p, n, location, stream);
}

VCUDA_API cuMemPrefetchAsync(CUdeviceptr p, size_t n, CUdevice device, CUstream stream) noexcept {
    VCUDA_TRACE_HOOK(cuMemPrefetchAsync, p, n, device, stream);
    return cuMemPrefetchAsync_v2(p, n, device_location(device), 0, stream);
}

VCUDA_API cuMemAdvise_v2(CUdeviceptr p, size_t n, CUmem_advise advice, CUmemLocation location) noexcept {
    VCUDA_TRACE_HOOK(cuMemAdvise_v2, p, n, advice, location);
    VCUDA_REQUIRE_INIT();
    return managed_advise(p, n, advice, location);
}

VCUDA_API cuMemAdvise(CUdeviceptr p, size_t n, CUmem_advise advice, CUdevice device) noexcept {
    VCUDA_TRACE_HOOK(cuMemAdvise, p, n, advice, device);
    return cuMemAdvise_v2(p, n, advice, device_location(device));
}

VCUDA_API cuMemRangeGetAttribute(void* data, size_t data_size, CUmem_range_attribute attribute, CUdeviceptr p,
                                 size_t n) noexcept {
    VCUDA_TRACE_HOOK(cuMemRangeGetAttribute, data, data_size, attribute, p, n);
    VCUDA_REQUIRE_INIT();
    return managed_range_attribute(data, data_size, attribute, p, n);
}

VCUDA_API cuMemRangeGetAttributes(void** data, size_t* data_sizes, CUmem_range_attribute* attributes,
                                  size_t count, CUdeviceptr p, size_t n) noexcept {
    VCUDA_TRACE_HOOK(cuMemRangeGetAttributes, data, data_sizes, attributes, count, p, n);
    VCUDA_REQUIRE_INIT();
    if (!data || !data_sizes || !attributes || count == 0) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < count; ++i)
        if (CUresult rc = managed_range_attribute(data[i], data_sizes[i], attributes[i], p, n);
            rc != CUDA_SUCCESS)
            return rc;
    return CUDA_SUCCESS;
}

VCUDA_API cuStreamAttachMemAsync(CUstream stream, CUdeviceptr p, size_t length, unsigned int flags) noexcept {
    VCUDA_TRACE_HOOK(cuStreamAttachMemAsync, stream, p, length, flags);
    VCUDA_REQUIRE_INIT();
    if (check_stream(stream) != CUDA_SUCCESS) return CUDA_ERROR_INVALID_HANDLE;
    return managed_attach(p, length, flags);
}
