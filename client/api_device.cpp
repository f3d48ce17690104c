// Entry points answered from the mirror: initialization, versions, cuGetProcAddress, error strings, devices.
#include <algorithm>
#include <cstdio>
#include <cstring>

#include "client/entry_point.hpp"
#include "client/error_names.hpp"
#include "client/plain_call.hpp"
#include "client/procaddress.hpp"
#include "client/state.hpp"
#include "client/trace.hpp"
#include "client_ops.hpp"

using namespace vcuda;
using namespace vcuda::client;

namespace {

bool valid_device(CUdevice d) {
    auto& st = state::get();
    return d >= 0 && d < st.device_count();
}

}  // namespace

VCUDA_API cuInit(unsigned int flags) noexcept {
    VCUDA_TRACE_HOOK(cuInit, flags);
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    return state::get().initialize(flags);
}

VCUDA_API cuDriverGetVersion(int* version) noexcept {
    VCUDA_TRACE_HOOK(cuDriverGetVersion, version);
    if (!version) return CUDA_ERROR_INVALID_VALUE;
    *version = driver_version;
    return CUDA_SUCCESS;
}

VCUDA_API cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,
                              CUdriverProcAddressQueryResult* status) noexcept {
    VCUDA_TRACE_HOOK(cuGetProcAddress_v2, symbol, pfn, cudaVersion, flags, status);
    int s = 0;
    int rc = get_proc_address(symbol, pfn, cudaVersion, flags, &s);
    if (rc == 0 && status) *status = static_cast<CUdriverProcAddressQueryResult>(s);
    return static_cast<CUresult>(rc);
}

VCUDA_API cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags) noexcept {
    VCUDA_TRACE_HOOK(cuGetProcAddress, symbol, pfn, cudaVersion, flags);
    return static_cast<CUresult>(get_proc_address(symbol, pfn, cudaVersion, flags, nullptr));
}

VCUDA_API cuGetErrorName(CUresult error, const char** str) noexcept {
    VCUDA_TRACE_HOOK(cuGetErrorName, error, str);
    if (!str) return CUDA_ERROR_INVALID_VALUE;
    auto* e = find_error_name(error);
    if (!e) {
        *str = nullptr;
        return CUDA_ERROR_INVALID_VALUE;
    }
    *str = e->name;
    return CUDA_SUCCESS;
}

VCUDA_API cuGetErrorString(CUresult error, const char** str) noexcept {
    VCUDA_TRACE_HOOK(cuGetErrorString, error, str);
    if (!str) return CUDA_ERROR_INVALID_VALUE;
    auto* e = find_error_name(error);
    if (!e) {
        *str = nullptr;
        return CUDA_ERROR_INVALID_VALUE;
    }
    *str = e->text;
    return CUDA_SUCCESS;
}

VCUDA_API cuDeviceGetCount(int* count) noexcept {
    VCUDA_TRACE_HOOK(cuDeviceGetCount, count);
    VCUDA_REQUIRE_INIT();
    if (!count) return CUDA_ERROR_INVALID_VALUE;
    *count = state::get().device_count();
    return CUDA_SUCCESS;
}

VCUDA_API cuDeviceGet(CUdevice* device, int ordinal) noexcept {
    VCUDA_TRACE_HOOK(cuDeviceGet, device, ordinal);
    VCUDA_REQUIRE_INIT();
    if (!device) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(ordinal)) return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

VCUDA_API cuDeviceGetName(char* name, int len, CUdevice dev) noexcept {
    VCUDA_TRACE_HOOK(cuDeviceGetName, name, len, dev);
    VCUDA_REQUIRE_INIT();
    if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
    std::snprintf(name, static_cast<size_t>(len), "%s", state::get().device(dev).name.c_str());
    return CUDA_SUCCESS;
}

VCUDA_API cuDeviceGetUuid_v2(CUuuid* uuid, CUdevice dev) noexcept {
    VCUDA_TRACE_HOOK(cuDeviceGetUuid_v2, uuid, dev);
    VCUDA_REQUIRE_INIT();
    if (!uuid) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
    std::memcpy(uuid->bytes, state::get().device(dev).uuid.data(), 16);
    return CUDA_SUCCESS;
}

VCUDA_API cuDeviceGetUuid(CUuuid* uuid, CUdevice dev) noexcept {
    VCUDA_TRACE_HOOK(cuDeviceGetUuid, uuid, dev);
    return cuDeviceGetUuid_v2(uuid, dev);
}

VCUDA_API cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev) noexcept {
    VCUDA_TRACE_HOOK(cuDeviceTotalMem_v2, bytes, dev);
    VCUDA_REQUIRE_INIT();
    if (!bytes) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
    *bytes = state::get().device(dev).total_memory;
    return CUDA_SUCCESS;
}

VCUDA_API cuDeviceTotalMem(unsigned int* bytes, CUdevice dev) noexcept {
    VCUDA_TRACE_HOOK(cuDeviceTotalMem, bytes, dev);
    size_t b = 0;
    CUresult rc = cuDeviceTotalMem_v2(&b, dev);
    if (rc == CUDA_SUCCESS) *bytes = b > 0xffffffffu ? 0xffffffffu : static_cast<unsigned>(b);
    return rc;
}

VCUDA_API cuDeviceGetAttribute(int* pi, CUdevice_attribute attrib, CUdevice dev) noexcept {
    VCUDA_TRACE_HOOK(cuDeviceGetAttribute, pi, attrib, dev);
    VCUDA_REQUIRE_INIT();
    if (!pi) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
    if (attrib <= 0 || attrib >= CU_DEVICE_ATTRIBUTE_MAX) return CUDA_ERROR_INVALID_VALUE;
    *pi = state::get().attribute(dev, attrib);
    return CUDA_SUCCESS;
}

VCUDA_API cuDeviceGetPCIBusId(char* pciBusId, int len, CUdevice dev) noexcept {
    VCUDA_TRACE_HOOK(cuDeviceGetPCIBusId, pciBusId, len, dev);
    VCUDA_REQUIRE_INIT();
    if (!pciBusId || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
    auto& st = state::get();
    std::snprintf(pciBusId, static_cast<size_t>(len), "%04x:%02x:%02x.0",
                  st.attribute(dev, CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID),
                  st.attribute(dev, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID),
                  st.attribute(dev, CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID));
    return CUDA_SUCCESS;
}

VCUDA_API cuDeviceGetByPCIBusId(CUdevice* dev, const char* pciBusId) noexcept {
    VCUDA_TRACE_HOOK(cuDeviceGetByPCIBusId, dev, pciBusId);
    VCUDA_REQUIRE_INIT();
    if (!dev || !pciBusId) return CUDA_ERROR_INVALID_VALUE;
    unsigned domain = 0, bus = 0, device = 0;
    if (std::sscanf(pciBusId, "%x:%x:%x", &domain, &bus, &device) != 3) {
        domain = 0;
        if (std::sscanf(pciBusId, "%x:%x", &bus, &device) != 2) return CUDA_ERROR_INVALID_VALUE;
    }
    auto& st = state::get();
    for (int d = 0; d < st.device_count(); ++d) {
        if (static_cast<unsigned>(st.attribute(d, CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID)) == domain &&
            static_cast<unsigned>(st.attribute(d, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID)) == bus &&
            static_cast<unsigned>(st.attribute(d, CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID)) == device) {
            *dev = d;
            return CUDA_SUCCESS;
        }
    }
    return CUDA_ERROR_INVALID_DEVICE;
}

VCUDA_API cuDeviceComputeCapability(int* major, int* minor, CUdevice dev) noexcept {
    VCUDA_TRACE_HOOK(cuDeviceComputeCapability, major, minor, dev);
    VCUDA_REQUIRE_INIT();
    if (!major || !minor) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
    *major = state::get().attribute(dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
    *minor = state::get().attribute(dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
    return CUDA_SUCCESS;
}

VCUDA_API cuDeviceGetProperties(CUdevprop* p, CUdevice dev) noexcept {
    VCUDA_TRACE_HOOK(cuDeviceGetProperties, p, dev);
    VCUDA_REQUIRE_INIT();
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
    auto a = [&](CUdevice_attribute x) { return state::get().attribute(dev, x); };
    p->maxThreadsPerBlock = a(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK);
    p->maxThreadsDim[0] = a(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X);
    p->maxThreadsDim[1] = a(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y);
    p->maxThreadsDim[2] = a(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z);
    p->maxGridSize[0] = a(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X);
    p->maxGridSize[1] = a(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y);
    p->maxGridSize[2] = a(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z);
    p->sharedMemPerBlock = a(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK);
    p->totalConstantMemory = a(CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY);
    p->SIMDWidth = a(CU_DEVICE_ATTRIBUTE_WARP_SIZE);
    p->memPitch = a(CU_DEVICE_ATTRIBUTE_MAX_PITCH);
    p->regsPerBlock = a(CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK);
    p->clockRate = a(CU_DEVICE_ATTRIBUTE_CLOCK_RATE);
    p->textureAlign = a(CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT);
    return CUDA_SUCCESS;
}

namespace {

// At most this many operations in one question (the driver takes any number; a bound keeps the frame small).
constexpr unsigned max_atomic_operations = 1024;

// The native atomic capabilities of `dev`'s link to its host (no `peer`), or to device `peer`, asked of the
// server's driver: the host is the server's, whose memory is the only host memory the GPU reaches. Devices of
// two sessions (servers) have no link between them: every capability 0.
CUresult atomic_capabilities(unsigned* caps, const CUatomicOperation* ops, unsigned count, CUdevice dev,
                             const CUdevice* peer, const char* name) {
    VCUDA_REQUIRE_INIT();
    if (!caps || !ops || count == 0 || count > max_atomic_operations) return CUDA_ERROR_INVALID_VALUE;
    device_atomic_caps_call c(name, dev,
                              {reinterpret_cast<const std::byte*>(ops), count * sizeof(CUatomicOperation)},
                              peer ? std::optional(*peer) : std::nullopt);
    if (c.devices_of_two_sessions()) {
        for (unsigned i = 0; i < count; ++i)
            if (ops[i] < 0 || ops[i] >= CU_ATOMIC_OPERATION_MAX) return CUDA_ERROR_INVALID_VALUE;
        std::fill(caps, caps + count, 0u);
        return CUDA_SUCCESS;
    }
    if (CUresult rc = c.send_sync(); rc != CUDA_SUCCESS) return rc;
    const auto& blobs = c.reply().blobs;
    if (blobs.size() != 1 || blobs[0].size() != count * sizeof(unsigned)) return CUDA_ERROR_UNKNOWN;
    std::memcpy(caps, blobs[0].data(), blobs[0].size());
    return CUDA_SUCCESS;
}

}  // namespace

VCUDA_API cuDeviceGetHostAtomicCapabilities(unsigned int* capabilities, const CUatomicOperation* operations,
                                            unsigned int count, CUdevice dev) noexcept {
    VCUDA_TRACE_HOOK(cuDeviceGetHostAtomicCapabilities, capabilities, operations, count, dev);
    return atomic_capabilities(capabilities, operations, count, dev, nullptr,
                               "cuDeviceGetHostAtomicCapabilities");
}

VCUDA_API cuDeviceGetP2PAtomicCapabilities(unsigned int* capabilities, const CUatomicOperation* operations,
                                           unsigned int count, CUdevice srcDevice,
                                           CUdevice dstDevice) noexcept {
    VCUDA_TRACE_HOOK(cuDeviceGetP2PAtomicCapabilities, capabilities, operations, count, srcDevice, dstDevice);
    return atomic_capabilities(capabilities, operations, count, srcDevice, &dstDevice,
                               "cuDeviceGetP2PAtomicCapabilities");
}
