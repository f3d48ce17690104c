// Unit tests of the software test driver: the library is dlopened, as vcuda-server does, and driven through
// the symbols it exports. Two devices of 256 MiB each (VCUDA_SOFT_DEVICES / VCUDA_SOFT_MEMORY, set before the
// library is loaded). Test kernels are registered through the library's exported registry.
#define CATCH_CONFIG_MAIN
#include <cuda.h>
#include <cudaProfiler.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <unistd.h>
#include <catch2/catch.hpp>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "soft_kernel.hpp"
#include "soft_tensor_map.hpp"

namespace {

constexpr size_t mib = size_t{1} << 20;
constexpr size_t quota = 256 * mib;

// Every driver function the tests call, by its exported (ABI) name.
// clang-format 14 reflows this list differently on each run: left as written.
// clang-format off
#define VCUDA_SOFT_TEST_FUNCTIONS(X)                                                                               \
    X(cuInit) X(cuDriverGetVersion) X(cuDeviceGet) X(cuDeviceGetCount) X(cuDeviceGetName) X(cuDeviceGetUuid_v2)    \
    X(cuDeviceTotalMem_v2) X(cuDeviceGetAttribute) X(cuDeviceGetPCIBusId) X(cuDeviceGetByPCIBusId)                 \
    X(cuDeviceCanAccessPeer) X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease_v2)                           \
    X(cuDevicePrimaryCtxGetState) X(cuCtxCreate_v4) X(cuCtxDestroy_v2) X(cuCtxSetCurrent) X(cuCtxGetCurrent)       \
    X(cuCtxPushCurrent_v2) X(cuCtxPopCurrent_v2) X(cuCtxGetDevice) X(cuCtxSynchronize)                             \
    X(cuCtxGetStreamPriorityRange) X(cuMemAlloc_v2) X(cuMemFree_v2) X(cuMemGetInfo_v2) X(cuMemGetAddressRange_v2)  \
    X(cuMemGetAllocationGranularity) X(cuMemCreate) X(cuMemRelease) X(cuMemAddressReserve) X(cuMemAddressFree)     \
    X(cuMemMap) X(cuMemUnmap) X(cuMemSetAccess) X(cuMemGetAccess) X(cuMemRetainAllocationHandle)                   \
    X(cuMemExportToShareableHandle) X(cuMemImportFromShareableHandle)                                               \
    X(cuMemAllocHost_v2) X(cuMemFreeHost) X(cuMemHostRegister_v2) X(cuMemHostUnregister)                           \
    X(cuMemHostGetDevicePointer_v2) X(cuPointerGetAttribute) X(cuMemcpyHtoD_v2) X(cuMemcpyDtoH_v2)                 \
    X(cuMemcpyDtoD_v2) X(cuMemcpyHtoDAsync_v2) X(cuMemcpy) X(cuMemcpy2D_v2) X(cuMemsetD8_v2) X(cuMemsetD32_v2)     \
    X(cuMemsetD16_v2) X(cuMemsetD2D8_v2) X(cuMemsetD32Async) X(cuStreamCreate) X(cuStreamCreateWithPriority)       \
    X(cuStreamDestroy_v2) X(cuStreamSynchronize) X(cuStreamGetPriority) X(cuStreamQuery) X(cuEventCreate)          \
    X(cuEventRecord) X(cuEventElapsedTime_v2) X(cuEventDestroy_v2) X(cuLaunchHostFunc) X(cuLibraryLoadData)        \
    X(cuLibraryUnload) X(cuLibraryGetKernel) X(cuLibraryGetGlobal) X(cuLibraryGetKernelCount)                      \
    X(cuKernelGetFunction) X(cuKernelGetParamInfo) X(cuKernelGetName) X(cuKernelSetAttribute) X(cuModuleLoadData)  \
    X(cuModuleUnload) X(cuModuleGetFunction) X(cuModuleGetGlobal_v2) X(cuFuncGetParamInfo) X(cuFuncGetAttribute)   \
    X(cuFuncSetAttribute) X(cuLaunchKernel) X(cuLaunchKernelEx) X(cuOccupancyMaxActiveBlocksPerMultiprocessor)     \
    X(cuGetProcAddress_v2) X(cuGetErrorName) X(cuGetErrorString)
// clang-format on

struct soft_driver {
    void* lib = nullptr;
    CUresult count_before_init = CUDA_SUCCESS;
    void (*register_kernel)(vcuda::soft::kernel_entry) = nullptr;
    void (*register_global)(vcuda::soft::global_entry) = nullptr;
#define VCUDA_SOFT_TEST_MEMBER(name) decltype(&::name) name = nullptr;
    VCUDA_SOFT_TEST_FUNCTIONS(VCUDA_SOFT_TEST_MEMBER)
#undef VCUDA_SOFT_TEST_MEMBER

    void* sym(const char* name) const { return dlsym(lib, name); }
};

// Loaded once per process, before the first test that needs it.
soft_driver& drv() {
    static soft_driver* d = [] {
        setenv("VCUDA_SOFT_DEVICES", "2", 1);
        setenv("VCUDA_SOFT_MEMORY", std::to_string(quota).c_str(), 1);
        auto* s = new soft_driver;
        s->lib = dlopen(VCUDA_SOFTDRIVER_PATH, RTLD_NOW | RTLD_LOCAL);
        if (s->lib == nullptr) FAIL("dlopen " VCUDA_SOFTDRIVER_PATH ": " << dlerror());
#define VCUDA_SOFT_TEST_LOAD(name)                                       \
    s->name = reinterpret_cast<decltype(&::name)>(dlsym(s->lib, #name)); \
    if (s->name == nullptr) FAIL("the software driver does not export " #name);
        VCUDA_SOFT_TEST_FUNCTIONS(VCUDA_SOFT_TEST_LOAD)
#undef VCUDA_SOFT_TEST_LOAD
        // The registry is C++: vcuda::soft::register_kernel(kernel_entry), register_global(global_entry).
        s->register_kernel = reinterpret_cast<void (*)(vcuda::soft::kernel_entry)>(
            dlsym(s->lib, "_ZN5vcuda4soft15register_kernelENS0_12kernel_entryE"));
        s->register_global = reinterpret_cast<void (*)(vcuda::soft::global_entry)>(
            dlsym(s->lib, "_ZN5vcuda4soft15register_globalENS0_12global_entryE"));
        if (s->register_kernel == nullptr || s->register_global == nullptr)
            FAIL("the software driver does not export its kernel registry");
        int n = 0;
        s->count_before_init = s->cuDeviceGetCount(&n);
        if (s->cuInit(0) != CUDA_SUCCESS) FAIL("cuInit failed");
        return s;
    }();
    return *d;
}

// The primary context of device 0, current on this thread for the life of the object.
struct primary_context {
    CUcontext ctx = nullptr;
    primary_context() {
        REQUIRE(drv().cuDevicePrimaryCtxRetain(&ctx, 0) == CUDA_SUCCESS);
        REQUIRE(drv().cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
    }
    ~primary_context() {
        drv().cuCtxSetCurrent(nullptr);
        drv().cuDevicePrimaryCtxRelease_v2(0);
    }
};

size_t used_memory() {
    size_t free = 0, total = 0;
    REQUIRE(drv().cuMemGetInfo_v2(&free, &total) == CUDA_SUCCESS);
    return total - free;
}

// --- A test kernel: saxpy(float a, const float* x, float* y, int n), y[i] = a * x[i] + y[i].
void saxpy(const vcuda::soft::launch& l) {
    auto a = l.param<float>(0);
    auto x = l.param<const float*>(1);
    auto y = l.param<float*>(2);
    auto n = l.param<int>(3);
    for (size_t i = 0; i < l.threads() && i < static_cast<size_t>(n); ++i) y[i] = a * x[i] + y[i];
}
void nothing(const vcuda::soft::launch&) {}

void register_test_kernels() {
    static bool done = [] {
        drv().register_kernel({"soft_test_saxpy", {4, 8, 8, 4}, saxpy});
        drv().register_kernel({"soft_test_layout", {1, 2, 4, 8, 12, 16, 3}, nothing});
        drv().register_global({"soft_test_global", 16});
        return true;
    }();
    (void)done;
}

const unsigned char fake_image[16] = {0x50, 0xed, 0x55, 0xba};  // never parsed

}  // namespace

TEST_CASE("the software driver describes itself and its devices", "[unit]") {
    soft_driver& d = drv();
    CHECK(d.count_before_init == CUDA_ERROR_NOT_INITIALIZED);
    int version = 0;
    REQUIRE(d.cuDriverGetVersion(&version) == CUDA_SUCCESS);
    CHECK(version == 13000);
    int count = 0;
    REQUIRE(d.cuDeviceGetCount(&count) == CUDA_SUCCESS);
    CHECK(count == 2);
    CHECK(d.cuDeviceGetCount(nullptr) == CUDA_ERROR_INVALID_VALUE);
    CUdevice dev = -1;
    CHECK(d.cuDeviceGet(&dev, 2) == CUDA_ERROR_INVALID_DEVICE);
    REQUIRE(d.cuDeviceGet(&dev, 1) == CUDA_SUCCESS);
    CHECK(dev == 1);

    char name[128] = {};
    REQUIRE(d.cuDeviceGetName(name, sizeof name, 0) == CUDA_SUCCESS);
    CHECK(std::string(name) == "vcuda software test driver (CPU)");
    size_t total = 0;
    REQUIRE(d.cuDeviceTotalMem_v2(&total, 0) == CUDA_SUCCESS);
    CHECK(total == quota);

    auto attr = [&](CUdevice_attribute a, CUdevice dv = 0) {
        int v = -12345;
        REQUIRE(d.cuDeviceGetAttribute(&v, a, dv) == CUDA_SUCCESS);
        return v;
    };
    CHECK(attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR) == 9);
    CHECK(attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR) == 0);
    CHECK(attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT) == 132);
    CHECK(attr(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK) == 1024);
    CHECK(attr(CU_DEVICE_ATTRIBUTE_WARP_SIZE) == 32);
    CHECK(attr(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X) == 2147483647);
    CHECK(attr(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN) == 232448);
    CHECK(attr(CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING) == 1);
    CHECK(attr(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED) == 1);
    CHECK(attr(CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED) == 1);
    CHECK(attr(CU_DEVICE_ATTRIBUTE_INTEGRATED) == 0);
    CHECK(attr(CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, 0) != attr(CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, 1));
    for (int a = 1; a < CU_DEVICE_ATTRIBUTE_MAX; ++a) {
        int v = 0;
        INFO("attribute " << a);
        CHECK(d.cuDeviceGetAttribute(&v, static_cast<CUdevice_attribute>(a), 0) == CUDA_SUCCESS);
    }
    int v = 0;
    CHECK(d.cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MAX, 0) == CUDA_ERROR_INVALID_VALUE);
    CHECK(d.cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_WARP_SIZE, 7) == CUDA_ERROR_INVALID_DEVICE);

    CUuuid u0{}, u1{}, again{};
    REQUIRE(d.cuDeviceGetUuid_v2(&u0, 0) == CUDA_SUCCESS);
    REQUIRE(d.cuDeviceGetUuid_v2(&u1, 1) == CUDA_SUCCESS);
    REQUIRE(d.cuDeviceGetUuid_v2(&again, 0) == CUDA_SUCCESS);
    CHECK(std::memcmp(u0.bytes, u1.bytes, 16) != 0);
    CHECK(std::memcmp(u0.bytes, again.bytes, 16) == 0);

    char bus[32] = {};
    REQUIRE(d.cuDeviceGetPCIBusId(bus, sizeof bus, 1) == CUDA_SUCCESS);
    CUdevice found = -1;
    REQUIRE(d.cuDeviceGetByPCIBusId(&found, bus) == CUDA_SUCCESS);
    CHECK(found == 1);
    CHECK(d.cuDeviceGetByPCIBusId(&found, "0000:ff:00.0") == CUDA_ERROR_INVALID_DEVICE);
    int peer = -1;
    REQUIRE(d.cuDeviceCanAccessPeer(&peer, 0, 1) == CUDA_SUCCESS);
    CHECK(peer == 1);

    const char* text = nullptr;
    REQUIRE(d.cuGetErrorName(CUDA_ERROR_INVALID_HANDLE, &text) == CUDA_SUCCESS);
    CHECK(std::string(text) == "CUDA_ERROR_INVALID_HANDLE");
    REQUIRE(d.cuGetErrorString(CUDA_ERROR_OUT_OF_MEMORY, &text) == CUDA_SUCCESS);
    CHECK(std::string(text) == "out of memory");
    CHECK(d.cuGetErrorName(static_cast<CUresult>(12345), &text) == CUDA_ERROR_INVALID_VALUE);
}

TEST_CASE("contexts: primary, created, per thread", "[unit]") {
    soft_driver& d = drv();
    CUcontext none = reinterpret_cast<CUcontext>(0x1234);
    REQUIRE(d.cuCtxGetCurrent(&none) == CUDA_SUCCESS);
    CHECK(none == nullptr);
    CHECK(d.cuCtxSynchronize() == CUDA_ERROR_INVALID_CONTEXT);
    CUdeviceptr p = 0;
    CHECK(d.cuMemAlloc_v2(&p, 64) == CUDA_ERROR_INVALID_CONTEXT);

    {
        primary_context pc;
        unsigned flags = 0;
        int active = 0;
        REQUIRE(d.cuDevicePrimaryCtxGetState(0, &flags, &active) == CUDA_SUCCESS);
        CHECK(active == 1);
        CUcontext again = nullptr;
        REQUIRE(d.cuDevicePrimaryCtxRetain(&again, 0) == CUDA_SUCCESS);
        CHECK(again == pc.ctx);
        REQUIRE(d.cuDevicePrimaryCtxRelease_v2(0) == CUDA_SUCCESS);

        // The current context belongs to this thread only.
        std::atomic<CUresult> other{CUDA_SUCCESS};
        std::thread([&] {
            CUcontext c = pc.ctx;
            d.cuCtxGetCurrent(&c);
            other = c == nullptr ? d.cuCtxSynchronize() : CUDA_SUCCESS;
        }).join();
        CHECK(other.load() == CUDA_ERROR_INVALID_CONTEXT);

        // A created context is pushed; destroying it frees what it allocated.
        size_t before = used_memory();
        CUcontext created = nullptr;
        REQUIRE(d.cuCtxCreate_v4(&created, nullptr, 0, 1) == CUDA_SUCCESS);
        CUcontext cur = nullptr;
        REQUIRE(d.cuCtxGetCurrent(&cur) == CUDA_SUCCESS);
        CHECK(cur == created);
        CUdevice dev = -1;
        REQUIRE(d.cuCtxGetDevice(&dev) == CUDA_SUCCESS);
        CHECK(dev == 1);
        REQUIRE(d.cuMemAlloc_v2(&p, 3 * mib) == CUDA_SUCCESS);
        CHECK(used_memory() >= 3 * mib);
        REQUIRE(d.cuCtxDestroy_v2(created) == CUDA_SUCCESS);
        CHECK(d.cuCtxDestroy_v2(created) == CUDA_ERROR_INVALID_CONTEXT);
        REQUIRE(d.cuCtxGetCurrent(&cur) == CUDA_SUCCESS);
        CHECK(cur == pc.ctx);
        CHECK(used_memory() == before);
        CHECK(d.cuMemFree_v2(p) == CUDA_ERROR_INVALID_VALUE);

        REQUIRE(d.cuCtxPushCurrent_v2(pc.ctx) == CUDA_SUCCESS);
        CUcontext popped = nullptr;
        REQUIRE(d.cuCtxPopCurrent_v2(&popped) == CUDA_SUCCESS);
        CHECK(popped == pc.ctx);

        int least = 1, greatest = 1;
        REQUIRE(d.cuCtxGetStreamPriorityRange(&least, &greatest) == CUDA_SUCCESS);
        CHECK(least == 0);
        CHECK(greatest == -5);
    }
    unsigned flags = 0;
    int active = 1;
    REQUIRE(d.cuDevicePrimaryCtxGetState(0, &flags, &active) == CUDA_SUCCESS);
    CHECK(active == 0);
    CHECK(d.cuDevicePrimaryCtxRelease_v2(0) == CUDA_ERROR_INVALID_CONTEXT);
}

TEST_CASE("VMM: reserve at a hint, map, set access, memset and copy round trip", "[unit]") {
    soft_driver& d = drv();
    primary_context pc;

    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    size_t gran = 0;
    REQUIRE(d.cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) == CUDA_SUCCESS);
    REQUIRE(gran == 2 * mib);

    const size_t size = 4 * mib;
    const size_t used0 = used_memory();
    CUmemGenericAllocationHandle handle = 0;
    CHECK(d.cuMemCreate(&handle, size + 1, &prop, 0) == CUDA_ERROR_INVALID_VALUE);
    REQUIRE(d.cuMemCreate(&handle, size, &prop, 0) == CUDA_SUCCESS);
    CHECK(used_memory() == used0 + size);

    // Find a free range, give it back, then ask for exactly that address.
    CUdeviceptr probe = 0;
    REQUIRE(d.cuMemAddressReserve(&probe, 2 * size, 0, 0, 0) == CUDA_SUCCESS);
    REQUIRE(d.cuMemAddressFree(probe, 2 * size) == CUDA_SUCCESS);
    CUdeviceptr va = 0;
    REQUIRE(d.cuMemAddressReserve(&va, 2 * size, 0, probe, 0) == CUDA_SUCCESS);
    CHECK(va == probe);
    CHECK(va % gran == 0);
    // The same hint again is taken: the reservation lands elsewhere.
    CUdeviceptr elsewhere = 0;
    REQUIRE(d.cuMemAddressReserve(&elsewhere, size, 0, va, 0) == CUDA_SUCCESS);
    CHECK(elsewhere != va);
    REQUIRE(d.cuMemAddressFree(elsewhere, size) == CUDA_SUCCESS);

    REQUIRE(d.cuMemMap(va, size, 0, handle, 0) == CUDA_SUCCESS);
    CHECK(d.cuMemMap(va, size, 0, handle, 0) == CUDA_ERROR_INVALID_VALUE);  // already mapped
    // Mapped but no access granted yet: a GPU would fault.
    CHECK(d.cuMemsetD8_v2(va, 1, 16) == CUDA_ERROR_ILLEGAL_ADDRESS);

    CUmemAccessDesc access{};
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    REQUIRE(d.cuMemSetAccess(va, size, &access, 1) == CUDA_SUCCESS);
    unsigned long long granted = 0;
    REQUIRE(d.cuMemGetAccess(&granted, &prop.location, va + 100) == CUDA_SUCCESS);
    CHECK(granted == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);

    REQUIRE(d.cuMemsetD32_v2(va, 0xdeadbeef, size / 4) == CUDA_SUCCESS);
    std::vector<uint32_t> host(size / 4);
    REQUIRE(d.cuMemcpyDtoH_v2(host.data(), va, size) == CUDA_SUCCESS);
    CHECK(host.front() == 0xdeadbeef);
    CHECK(host.back() == 0xdeadbeef);

    for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<uint32_t>(i * 2654435761u);
    REQUIRE(d.cuMemcpyHtoD_v2(va, host.data(), size) == CUDA_SUCCESS);
    std::vector<uint32_t> back(host.size());
    REQUIRE(d.cuMemcpyDtoH_v2(back.data(), va, size) == CUDA_SUCCESS);
    CHECK(back == host);
    // The mapping is a plain host mapping of the same memory.
    CHECK(reinterpret_cast<const uint32_t*>(va)[7] == host[7]);

    // The second half of the reservation is not mapped.
    CHECK(d.cuMemcpyDtoH_v2(back.data(), va + size - 8, 16) == CUDA_ERROR_ILLEGAL_ADDRESS);
    CHECK(d.cuMemsetD8_v2(va + size, 0, 1) == CUDA_ERROR_ILLEGAL_ADDRESS);

    CUdeviceptr base = 0;
    size_t range = 0;
    REQUIRE(d.cuMemGetAddressRange_v2(&base, &range, va + 12345) == CUDA_SUCCESS);
    CHECK(base == va);
    CHECK(range == size);
    CUdeviceptr start = 0;
    REQUIRE(d.cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, va + 4096) ==
            CUDA_SUCCESS);
    CHECK(start == va);

    CUmemGenericAllocationHandle retained = 0;
    REQUIRE(d.cuMemRetainAllocationHandle(&retained, reinterpret_cast<void*>(va + 64)) == CUDA_SUCCESS);
    CHECK(retained == handle);
    REQUIRE(d.cuMemRelease(retained) == CUDA_SUCCESS);

    // Released while mapped: the memory stays until it is unmapped.
    REQUIRE(d.cuMemRelease(handle) == CUDA_SUCCESS);
    CHECK(d.cuMemRelease(handle) == CUDA_ERROR_INVALID_VALUE);
    CHECK(used_memory() == used0 + size);
    CHECK(d.cuMemUnmap(va, size / 2) == CUDA_ERROR_INVALID_VALUE);  // part of a mapping
    REQUIRE(d.cuMemUnmap(va, size) == CUDA_SUCCESS);
    CHECK(used_memory() == used0);
    CHECK(d.cuMemsetD8_v2(va, 0, 1) == CUDA_ERROR_ILLEGAL_ADDRESS);
    CHECK(d.cuMemAddressFree(va, size) == CUDA_ERROR_INVALID_VALUE);  // not the reserved size
    REQUIRE(d.cuMemAddressFree(va, 2 * size) == CUDA_SUCCESS);
}

TEST_CASE("VMM: an allocation exported as a descriptor and imported is the same memory", "[unit]") {
    soft_driver& d = drv();
    primary_context pc;
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    const size_t size = 2 * mib;
    CUmemGenericAllocationHandle plain = 0, h = 0, imported = 0;
    int fd = -1;
    // Only an allocation made exportable exports.
    REQUIRE(d.cuMemCreate(&plain, size, &prop, 0) == CUDA_SUCCESS);
    CHECK(d.cuMemExportToShareableHandle(&fd, plain, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) ==
          CUDA_ERROR_INVALID_VALUE);
    REQUIRE(d.cuMemRelease(plain) == CUDA_SUCCESS);
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    REQUIRE(d.cuMemCreate(&h, size, &prop, 0) == CUDA_SUCCESS);
    REQUIRE(d.cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) ==
            CUDA_SUCCESS);
    CHECK(fd >= 0);
    CUdeviceptr va = 0;
    REQUIRE(d.cuMemAddressReserve(&va, 2 * size, 0, 0, 0) == CUDA_SUCCESS);
    CUmemAccessDesc access{};
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    REQUIRE(d.cuMemMap(va, size, 0, h, 0) == CUDA_SUCCESS);
    REQUIRE(d.cuMemSetAccess(va, size, &access, 1) == CUDA_SUCCESS);
    REQUIRE(d.cuMemsetD32_v2(va, 0x5eed, size / 4) == CUDA_SUCCESS);
    // Given up here (released and unmapped), the memory lives on in its descriptor.
    REQUIRE(d.cuMemUnmap(va, size) == CUDA_SUCCESS);
    REQUIRE(d.cuMemRelease(h) == CUDA_SUCCESS);
    REQUIRE(d.cuMemImportFromShareableHandle(&imported, reinterpret_cast<void*>(static_cast<uintptr_t>(fd)),
                                             CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) == CUDA_SUCCESS);
    close(fd);
    REQUIRE(d.cuMemMap(va + size, size, 0, imported, 0) == CUDA_SUCCESS);
    REQUIRE(d.cuMemSetAccess(va + size, size, &access, 1) == CUDA_SUCCESS);
    std::vector<uint32_t> back(size / 4);
    REQUIRE(d.cuMemcpyDtoH_v2(back.data(), va + size, size) == CUDA_SUCCESS);
    CHECK(back.front() == 0x5eed);
    CHECK(back.back() == 0x5eed);
    REQUIRE(d.cuMemUnmap(va + size, size) == CUDA_SUCCESS);
    REQUIRE(d.cuMemRelease(imported) == CUDA_SUCCESS);
    REQUIRE(d.cuMemAddressFree(va, 2 * size) == CUDA_SUCCESS);
    // A descriptor that is not one of this driver's allocations is refused.
    int other = open("/dev/null", O_RDONLY);
    CHECK(d.cuMemImportFromShareableHandle(&imported, reinterpret_cast<void*>(static_cast<uintptr_t>(other)),
                                           CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) ==
          CUDA_ERROR_INVALID_VALUE);
    close(other);
}

TEST_CASE("memory quota: allocations past VCUDA_SOFT_MEMORY fail with CUDA_ERROR_OUT_OF_MEMORY", "[unit]") {
    soft_driver& d = drv();
    primary_context pc;
    size_t free = 0, total = 0;
    REQUIRE(d.cuMemGetInfo_v2(&free, &total) == CUDA_SUCCESS);
    CHECK(total == quota);

    CUdeviceptr p = 0, q = 0;
    CHECK(d.cuMemAlloc_v2(&p, quota + 1) == CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(d.cuMemAlloc_v2(&p, 0) == CUDA_ERROR_INVALID_VALUE);
    REQUIRE(d.cuMemAlloc_v2(&p, 200 * mib) == CUDA_SUCCESS);
    size_t after = 0;
    REQUIRE(d.cuMemGetInfo_v2(&after, &total) == CUDA_SUCCESS);
    CHECK(after == free - 200 * mib);
    CHECK(d.cuMemAlloc_v2(&q, 100 * mib) == CUDA_ERROR_OUT_OF_MEMORY);

    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    CUmemGenericAllocationHandle h = 0;
    CHECK(d.cuMemCreate(&h, 64 * mib, &prop, 0) == CUDA_ERROR_OUT_OF_MEMORY);
    // Another device has its own quota.
    prop.location.id = 1;
    REQUIRE(d.cuMemCreate(&h, 64 * mib, &prop, 0) == CUDA_SUCCESS);
    REQUIRE(d.cuMemRelease(h) == CUDA_SUCCESS);

    REQUIRE(d.cuMemFree_v2(p) == CUDA_SUCCESS);
    CHECK(d.cuMemFree_v2(p) == CUDA_ERROR_INVALID_VALUE);
    REQUIRE(d.cuMemAlloc_v2(&q, 100 * mib) == CUDA_SUCCESS);
    REQUIRE(d.cuMemFree_v2(q) == CUDA_SUCCESS);
    REQUIRE(d.cuMemGetInfo_v2(&after, &total) == CUDA_SUCCESS);
    CHECK(after == free);
}

TEST_CASE("copies and memsets are checked against the allocations", "[unit]") {
    soft_driver& d = drv();
    primary_context pc;
    CUdeviceptr a = 0, b = 0;
    REQUIRE(d.cuMemAlloc_v2(&a, 4096) == CUDA_SUCCESS);
    REQUIRE(d.cuMemAlloc_v2(&b, 4096) == CUDA_SUCCESS);
    std::vector<unsigned char> host(4096, 7);
    CHECK(d.cuMemcpyHtoD_v2(a, host.data(), 4097) == CUDA_ERROR_INVALID_VALUE);  // past the end
    CHECK(d.cuMemcpyHtoD_v2(a + 1, host.data(), 4096) == CUDA_ERROR_INVALID_VALUE);
    CHECK(d.cuMemcpyHtoD_v2(0x10, host.data(), 4) == CUDA_ERROR_INVALID_VALUE);  // not device memory
    CHECK(d.cuMemsetD32_v2(a + 2, 0, 1) == CUDA_ERROR_INVALID_VALUE);            // misaligned
    CHECK(d.cuMemsetD16_v2(a + 1, 0, 1) == CUDA_ERROR_INVALID_VALUE);
    REQUIRE(d.cuMemsetD8_v2(a, 0x5a, 4096) == CUDA_SUCCESS);
    REQUIRE(d.cuMemcpyDtoD_v2(b, a, 4096) == CUDA_SUCCESS);
    REQUIRE(d.cuMemcpy(reinterpret_cast<CUdeviceptr>(host.data()), b, 4096) == CUDA_SUCCESS);  // unified
    CHECK(host[4095] == 0x5a);

    // 2D: a 16 x 8 block out of a pitched 64-byte-row buffer.
    REQUIRE(d.cuMemsetD2D8_v2(a, 64, 1, 16, 8) == CUDA_SUCCESS);
    CHECK(d.cuMemsetD2D8_v2(a, 8, 1, 16, 8) == CUDA_ERROR_INVALID_VALUE);  // pitch below the width
    std::vector<unsigned char> tile(16 * 8, 0);
    CUDA_MEMCPY2D c{};
    c.srcMemoryType = CU_MEMORYTYPE_DEVICE;
    c.srcDevice = a;
    c.srcPitch = 64;
    c.dstMemoryType = CU_MEMORYTYPE_HOST;
    c.dstHost = tile.data();
    c.dstPitch = 16;
    c.WidthInBytes = 16;
    c.Height = 8;
    REQUIRE(d.cuMemcpy2D_v2(&c) == CUDA_SUCCESS);
    CHECK(tile[0] == 1);
    CHECK(tile[16 * 8 - 1] == 1);
    c.Height = 65;  // 65 rows of 64 bytes run past the 4096-byte allocation
    CHECK(d.cuMemcpy2D_v2(&c) == CUDA_ERROR_INVALID_VALUE);
    c.Height = 8;
    c.srcMemoryType = CU_MEMORYTYPE_ARRAY;  // no array handle
    CHECK(d.cuMemcpy2D_v2(&c) == CUDA_ERROR_INVALID_HANDLE);

    // Pinned and registered host memory are their own device pointers.
    void* pinned = nullptr;
    REQUIRE(d.cuMemAllocHost_v2(&pinned, 4096) == CUDA_SUCCESS);
    CUdeviceptr dp = 0;
    REQUIRE(d.cuMemHostGetDevicePointer_v2(&dp, pinned, 0) == CUDA_SUCCESS);
    CHECK(dp == reinterpret_cast<CUdeviceptr>(pinned));
    REQUIRE(d.cuMemsetD8_v2(dp, 3, 4096) == CUDA_SUCCESS);
    CHECK(static_cast<unsigned char*>(pinned)[100] == 3);
    unsigned type = 0;
    REQUIRE(d.cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, dp) == CUDA_SUCCESS);
    CHECK(type == CU_MEMORYTYPE_HOST);
    REQUIRE(d.cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, a) == CUDA_SUCCESS);
    CHECK(type == CU_MEMORYTYPE_DEVICE);
    REQUIRE(d.cuMemFreeHost(pinned) == CUDA_SUCCESS);

    std::vector<unsigned char> user(8192, 0);
    REQUIRE(d.cuMemHostRegister_v2(user.data(), user.size(), 0) == CUDA_SUCCESS);
    CHECK(d.cuMemHostRegister_v2(user.data() + 16, 16, 0) == CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
    REQUIRE(d.cuMemHostGetDevicePointer_v2(&dp, user.data() + 10, 0) == CUDA_SUCCESS);
    CHECK(dp == reinterpret_cast<CUdeviceptr>(user.data() + 10));
    REQUIRE(d.cuMemsetD8_v2(dp, 9, 1) == CUDA_SUCCESS);
    CHECK(user[10] == 9);
    REQUIRE(d.cuMemHostUnregister(user.data()) == CUDA_SUCCESS);
    CHECK(d.cuMemHostUnregister(user.data()) == CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);

    REQUIRE(d.cuMemFree_v2(a) == CUDA_SUCCESS);
    REQUIRE(d.cuMemFree_v2(b) == CUDA_SUCCESS);
}

TEST_CASE("streams, events and host functions run at once", "[unit]") {
    soft_driver& d = drv();
    primary_context pc;
    CUstream s = nullptr;
    REQUIRE(d.cuStreamCreateWithPriority(&s, 0, -10) == CUDA_SUCCESS);
    int prio = 0;
    REQUIRE(d.cuStreamGetPriority(s, &prio) == CUDA_SUCCESS);
    CHECK(prio == -5);  // clamped to the greatest priority
    CHECK(d.cuStreamCreate(&s, 8) == CUDA_ERROR_INVALID_VALUE);
    for (CUstream special : {static_cast<CUstream>(nullptr), CU_STREAM_LEGACY, CU_STREAM_PER_THREAD})
        CHECK(d.cuStreamSynchronize(special) == CUDA_SUCCESS);

    CUdeviceptr p = 0;
    REQUIRE(d.cuMemAlloc_v2(&p, 256) == CUDA_SUCCESS);
    REQUIRE(d.cuMemsetD32Async(p, 42, 64, s) == CUDA_SUCCESS);
    uint32_t first = 0;
    REQUIRE(d.cuMemcpyDtoH_v2(&first, p, 4) == CUDA_SUCCESS);
    CHECK(first == 42);

    int calls = 0;
    REQUIRE(d.cuLaunchHostFunc(
                s, [](void* c) { ++*static_cast<int*>(c); }, &calls) == CUDA_SUCCESS);
    CHECK(calls == 1);

    CUevent start = nullptr, stop = nullptr, untimed = nullptr;
    REQUIRE(d.cuEventCreate(&start, CU_EVENT_DEFAULT) == CUDA_SUCCESS);
    REQUIRE(d.cuEventCreate(&stop, CU_EVENT_DEFAULT) == CUDA_SUCCESS);
    REQUIRE(d.cuEventCreate(&untimed, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS);
    float ms = -1;
    CHECK(d.cuEventElapsedTime_v2(&ms, start, stop) == CUDA_ERROR_INVALID_HANDLE);  // not recorded yet
    REQUIRE(d.cuEventRecord(start, s) == CUDA_SUCCESS);
    REQUIRE(d.cuEventRecord(stop, s) == CUDA_SUCCESS);
    REQUIRE(d.cuEventRecord(untimed, nullptr) == CUDA_SUCCESS);
    REQUIRE(d.cuEventElapsedTime_v2(&ms, start, stop) == CUDA_SUCCESS);
    CHECK(ms >= 0.0f);
    CHECK(d.cuEventElapsedTime_v2(&ms, start, untimed) == CUDA_ERROR_INVALID_HANDLE);

    REQUIRE(d.cuStreamQuery(s) == CUDA_SUCCESS);
    REQUIRE(d.cuStreamDestroy_v2(s) == CUDA_SUCCESS);
    CHECK(d.cuStreamQuery(s) == CUDA_ERROR_INVALID_HANDLE);
    CHECK(d.cuStreamDestroy_v2(s) == CUDA_ERROR_INVALID_HANDLE);
    CHECK(d.cuMemsetD32Async(p, 1, 1, s) == CUDA_ERROR_INVALID_HANDLE);
    CHECK(d.cuEventRecord(reinterpret_cast<CUevent>(0x1234), nullptr) == CUDA_ERROR_INVALID_HANDLE);
    for (CUevent e : {start, stop, untimed}) REQUIRE(d.cuEventDestroy_v2(e) == CUDA_SUCCESS);
    REQUIRE(d.cuMemFree_v2(p) == CUDA_SUCCESS);
}

TEST_CASE("libraries, modules and kernels come from the registry, parameter layouts follow it", "[unit]") {
    soft_driver& d = drv();
    register_test_kernels();
    primary_context pc;

    CUlibrary lib = nullptr;
    CHECK(d.cuLibraryLoadData(&lib, nullptr, nullptr, nullptr, 0, nullptr, nullptr, 0) ==
          CUDA_ERROR_INVALID_VALUE);
    REQUIRE(d.cuLibraryLoadData(&lib, fake_image, nullptr, nullptr, 0, nullptr, nullptr, 0) == CUDA_SUCCESS);
    unsigned count = 0;
    REQUIRE(d.cuLibraryGetKernelCount(&count, lib) == CUDA_SUCCESS);
    CHECK(count >= 2);

    CUkernel k = nullptr;
    CHECK(d.cuLibraryGetKernel(&k, lib, "no_such_kernel") == CUDA_ERROR_NOT_FOUND);
    REQUIRE(d.cuLibraryGetKernel(&k, lib, "soft_test_layout") == CUDA_SUCCESS);
    const char* name = nullptr;
    REQUIRE(d.cuKernelGetName(&name, k) == CUDA_SUCCESS);
    CHECK(std::string(name) == "soft_test_layout");

    // Sizes {1, 2, 4, 8, 12, 16, 3}: each aligned to min(size, 8) rounded down to a power of two.
    const size_t offsets[] = {0, 2, 4, 8, 16, 32, 48};
    const size_t sizes[] = {1, 2, 4, 8, 12, 16, 3};
    for (size_t i = 0; i < 7; ++i) {
        size_t off = 99, size = 99;
        INFO("parameter " << i);
        REQUIRE(d.cuKernelGetParamInfo(k, i, &off, &size) == CUDA_SUCCESS);
        CHECK(off == offsets[i]);
        CHECK(size == sizes[i]);
    }
    size_t off = 0, size = 0;
    CHECK(d.cuKernelGetParamInfo(k, 7, &off, &size) == CUDA_ERROR_INVALID_VALUE);
    CHECK(d.cuKernelGetParamInfo(k, 0, nullptr, &size) == CUDA_ERROR_INVALID_VALUE);
    REQUIRE(d.cuKernelGetParamInfo(k, 6, &off, nullptr) == CUDA_SUCCESS);
    // As the real driver: a thread with no current context gets no layout (the library and kernel need none).
    CUresult other_thread = CUDA_SUCCESS;
    std::thread([&] { other_thread = d.cuKernelGetParamInfo(k, 0, &off, &size); }).join();
    CHECK(other_thread == CUDA_ERROR_INVALID_CONTEXT);

    // As the real driver: cuFuncGetParamInfo refuses a CUkernel cast to CUfunction, answers for a CUfunction.
    CHECK(d.cuFuncGetParamInfo(reinterpret_cast<CUfunction>(k), 0, &off, &size) == CUDA_ERROR_INVALID_HANDLE);
    CUfunction f = nullptr;
    REQUIRE(d.cuKernelGetFunction(&f, k) == CUDA_SUCCESS);
    REQUIRE(d.cuFuncGetParamInfo(f, 5, &off, &size) == CUDA_SUCCESS);
    CHECK(off == 32);
    CHECK(size == 16);
    int regs = 0;
    REQUIRE(d.cuFuncGetAttribute(&regs, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
                                 reinterpret_cast<CUfunction>(k)) == CUDA_SUCCESS);
    CHECK(regs == 1024);

    // Globals: one zeroed copy per library and per module.
    CUdeviceptr g1 = 0, g2 = 0;
    size_t gsize = 0;
    CHECK(d.cuLibraryGetGlobal(&g1, &gsize, lib, "no_such_global") == CUDA_ERROR_NOT_FOUND);
    REQUIRE(d.cuLibraryGetGlobal(&g1, &gsize, lib, "soft_test_global") == CUDA_SUCCESS);
    CHECK(gsize == 16);
    CHECK(reinterpret_cast<const uint32_t*>(g1)[3] == 0);
    REQUIRE(d.cuMemsetD32_v2(g1, 7, 4) == CUDA_SUCCESS);
    CUmodule mod = nullptr;
    REQUIRE(d.cuModuleLoadData(&mod, fake_image) == CUDA_SUCCESS);
    REQUIRE(d.cuModuleGetGlobal_v2(&g2, &gsize, mod, "soft_test_global") == CUDA_SUCCESS);
    CHECK(g2 != g1);
    CHECK(reinterpret_cast<const uint32_t*>(g2)[0] == 0);
    CUfunction mf = nullptr;
    CHECK(d.cuModuleGetFunction(&mf, mod, "no_such_kernel") == CUDA_ERROR_NOT_FOUND);
    REQUIRE(d.cuModuleGetFunction(&mf, mod, "soft_test_saxpy") == CUDA_SUCCESS);
    REQUIRE(d.cuFuncGetParamInfo(mf, 3, &off, &size) == CUDA_SUCCESS);
    CHECK(off == 24);
    CHECK(size == 4);

    REQUIRE(d.cuModuleUnload(mod) == CUDA_SUCCESS);
    CHECK(d.cuModuleGetFunction(&mf, mod, "soft_test_saxpy") == CUDA_ERROR_INVALID_HANDLE);
    CHECK(d.cuFuncGetParamInfo(mf, 0, &off, &size) == CUDA_ERROR_INVALID_HANDLE);
    REQUIRE(d.cuLibraryUnload(lib) == CUDA_SUCCESS);
    CHECK(d.cuKernelGetParamInfo(k, 0, &off, &size) == CUDA_ERROR_INVALID_HANDLE);
    CHECK(d.cuFuncGetParamInfo(f, 0, &off, &size) == CUDA_ERROR_INVALID_HANDLE);
}

TEST_CASE("launches run the host kernel, checked like the real driver", "[unit]") {
    soft_driver& d = drv();
    register_test_kernels();
    primary_context pc;
    CUlibrary lib = nullptr;
    REQUIRE(d.cuLibraryLoadData(&lib, fake_image, nullptr, nullptr, 0, nullptr, nullptr, 0) == CUDA_SUCCESS);
    CUkernel k = nullptr;
    REQUIRE(d.cuLibraryGetKernel(&k, lib, "soft_test_saxpy") == CUDA_SUCCESS);
    auto kf = reinterpret_cast<CUfunction>(k);  // cudart launches CUkernels cast to CUfunction

    const int n = 1000;
    std::vector<float> x(n), y(n, 1.0f);
    for (int i = 0; i < n; ++i) x[i] = static_cast<float>(i);
    CUdeviceptr dx = 0, dy = 0;
    REQUIRE(d.cuMemAlloc_v2(&dx, n * sizeof(float)) == CUDA_SUCCESS);
    REQUIRE(d.cuMemAlloc_v2(&dy, n * sizeof(float)) == CUDA_SUCCESS);
    REQUIRE(d.cuMemcpyHtoD_v2(dx, x.data(), n * sizeof(float)) == CUDA_SUCCESS);
    REQUIRE(d.cuMemcpyHtoD_v2(dy, y.data(), n * sizeof(float)) == CUDA_SUCCESS);

    float a = 2.0f;
    int count = n;
    void* params[] = {&a, &dx, &dy, &count};
    REQUIRE(d.cuLaunchKernel(kf, 4, 1, 1, 256, 1, 1, 0, nullptr, params, nullptr) == CUDA_SUCCESS);
    REQUIRE(d.cuMemcpyDtoH_v2(y.data(), dy, n * sizeof(float)) == CUDA_SUCCESS);
    CHECK(y[0] == 1.0f);
    CHECK(y[999] == 2.0f * 999 + 1.0f);

    // The `extra` form: one buffer laid out by the parameter offsets (0, 8, 16, 24).
    unsigned char buffer[28] = {};
    float b = 1.0f;
    std::memcpy(buffer + 0, &b, 4);
    std::memcpy(buffer + 8, &dx, 8);
    std::memcpy(buffer + 16, &dy, 8);
    std::memcpy(buffer + 24, &count, 4);
    size_t buffer_size = sizeof buffer;
    void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, buffer, CU_LAUNCH_PARAM_BUFFER_SIZE, &buffer_size,
                     CU_LAUNCH_PARAM_END};
    CUfunction f = nullptr;
    REQUIRE(d.cuKernelGetFunction(&f, k) == CUDA_SUCCESS);
    REQUIRE(d.cuLaunchKernel(f, 4, 1, 1, 256, 1, 1, 0, CU_STREAM_LEGACY, nullptr, extra) == CUDA_SUCCESS);
    REQUIRE(d.cuMemcpyDtoH_v2(y.data(), dy, n * sizeof(float)) == CUDA_SUCCESS);
    CHECK(y[10] == 2.0f * 10 + 1.0f + 10.0f);
    // A shorter buffer is taken, as by the real driver: the parameters past it read as zeros (the count here:
    // the kernel does nothing).
    buffer_size = 20;
    CHECK(d.cuLaunchKernel(f, 4, 1, 1, 256, 1, 1, 0, nullptr, nullptr, extra) == CUDA_SUCCESS);
    REQUIRE(d.cuMemcpyDtoH_v2(y.data(), dy, n * sizeof(float)) == CUDA_SUCCESS);
    CHECK(y[10] == 2.0f * 10 + 1.0f + 10.0f);

    // Shapes and shared memory as the real driver checks them at call time.
    CHECK(d.cuLaunchKernel(kf, 0, 1, 1, 256, 1, 1, 0, nullptr, params, nullptr) == CUDA_ERROR_INVALID_VALUE);
    CHECK(d.cuLaunchKernel(kf, 1, 1, 1, 1025, 1, 1, 0, nullptr, params, nullptr) == CUDA_ERROR_INVALID_VALUE);
    CHECK(d.cuLaunchKernel(kf, 1, 1, 1, 32, 32, 2, 0, nullptr, params, nullptr) == CUDA_ERROR_INVALID_VALUE);
    CHECK(d.cuLaunchKernel(kf, 1, 1, 1, 1, 1, 65, 0, nullptr, params, nullptr) == CUDA_ERROR_INVALID_VALUE);
    CHECK(d.cuLaunchKernel(kf, 1, 65536, 1, 1, 1, 1, 0, nullptr, params, nullptr) ==
          CUDA_ERROR_INVALID_VALUE);
    CHECK(d.cuLaunchKernel(kf, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, nullptr) == CUDA_ERROR_INVALID_VALUE);
    CHECK(d.cuLaunchKernel(kf, 1, 1, 1, 1, 1, 1, 0, nullptr, params, extra) == CUDA_ERROR_INVALID_VALUE);
    CHECK(d.cuLaunchKernel(reinterpret_cast<CUfunction>(0x99), 1, 1, 1, 1, 1, 1, 0, nullptr, params,
                           nullptr) == CUDA_ERROR_INVALID_HANDLE);
    count = 0;  // the kernel does nothing from here on
    CHECK(d.cuLaunchKernel(kf, 1, 1, 1, 32, 1, 1, 64 * 1024, nullptr, params, nullptr) ==
          CUDA_ERROR_INVALID_VALUE);
    REQUIRE(d.cuKernelSetAttribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 64 * 1024, k, 0) ==
            CUDA_SUCCESS);
    CHECK(d.cuLaunchKernel(kf, 1, 1, 1, 32, 1, 1, 64 * 1024, nullptr, params, nullptr) == CUDA_SUCCESS);
    CHECK(d.cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 300000) ==
          CUDA_ERROR_INVALID_VALUE);

    // cuLaunchKernelEx: clusters must divide the grid and stay portable.
    CUlaunchAttribute cluster{};
    cluster.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    cluster.value.clusterDim.x = 2;
    cluster.value.clusterDim.y = 1;
    cluster.value.clusterDim.z = 1;
    CUlaunchConfig cfg{};
    cfg.gridDimX = 4;
    cfg.gridDimY = cfg.gridDimZ = 1;
    cfg.blockDimX = 128;
    cfg.blockDimY = cfg.blockDimZ = 1;
    cfg.attrs = &cluster;
    cfg.numAttrs = 1;
    CHECK(d.cuLaunchKernelEx(&cfg, f, params, nullptr) == CUDA_SUCCESS);
    cfg.gridDimX = 3;
    CHECK(d.cuLaunchKernelEx(&cfg, f, params, nullptr) == CUDA_ERROR_INVALID_CLUSTER_SIZE);

    int blocks = 0;
    REQUIRE(d.cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, f, 256, 0) == CUDA_SUCCESS);
    CHECK(blocks == 8);

    REQUIRE(d.cuMemFree_v2(dx) == CUDA_SUCCESS);
    REQUIRE(d.cuMemFree_v2(dy) == CUDA_SUCCESS);
    REQUIRE(d.cuLibraryUnload(lib) == CUDA_SUCCESS);
}

TEST_CASE("threads allocate, copy and launch at the same time", "[unit]") {
    soft_driver& d = drv();
    register_test_kernels();
    primary_context pc;
    CUlibrary lib = nullptr;
    REQUIRE(d.cuLibraryLoadData(&lib, fake_image, nullptr, nullptr, 0, nullptr, nullptr, 0) == CUDA_SUCCESS);
    CUkernel k = nullptr;
    REQUIRE(d.cuLibraryGetKernel(&k, lib, "soft_test_saxpy") == CUDA_SUCCESS);

    std::atomic<int> failures{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
        threads.emplace_back([&, t] {
            if (d.cuCtxSetCurrent(pc.ctx) != CUDA_SUCCESS) ++failures;
            CUstream s = nullptr;
            if (d.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) ++failures;
            for (int i = 0; i < 50; ++i) {
                const int n = 256;
                std::vector<float> x(n, static_cast<float>(t)), y(n, 1.0f);
                CUdeviceptr dx = 0, dy = 0;
                bool ok = d.cuMemAlloc_v2(&dx, n * sizeof(float)) == CUDA_SUCCESS &&
                          d.cuMemAlloc_v2(&dy, n * sizeof(float)) == CUDA_SUCCESS &&
                          d.cuMemcpyHtoDAsync_v2(dx, x.data(), n * sizeof(float), s) == CUDA_SUCCESS &&
                          d.cuMemcpyHtoDAsync_v2(dy, y.data(), n * sizeof(float), s) == CUDA_SUCCESS;
                float a = 1.0f;
                int count = n;
                void* params[] = {&a, &dx, &dy, &count};
                ok = ok && d.cuLaunchKernel(reinterpret_cast<CUfunction>(k), 1, 1, 1, n, 1, 1, 0, s, params,
                                            nullptr) == CUDA_SUCCESS;
                ok = ok && d.cuStreamSynchronize(s) == CUDA_SUCCESS &&
                     d.cuMemcpyDtoH_v2(y.data(), dy, n * sizeof(float)) == CUDA_SUCCESS;
                ok = ok && y[n - 1] == static_cast<float>(t) + 1.0f;
                ok = ok && d.cuMemFree_v2(dx) == CUDA_SUCCESS && d.cuMemFree_v2(dy) == CUDA_SUCCESS;
                if (!ok) ++failures;
            }
            if (d.cuStreamDestroy_v2(s) != CUDA_SUCCESS) ++failures;
            d.cuCtxSetCurrent(nullptr);
        });
    }
    for (auto& th : threads) th.join();
    CHECK(failures.load() == 0);
    REQUIRE(d.cuLibraryUnload(lib) == CUDA_SUCCESS);
}

TEST_CASE("cuGetProcAddress_v2 answers as the real driver's table says", "[unit]") {
    soft_driver& d = drv();
    void* fn = nullptr;
    CUdriverProcAddressQueryResult status{};
    REQUIRE(d.cuGetProcAddress_v2("cuMemAlloc", &fn, 13000, 0, &status) == CUDA_SUCCESS);
    CHECK(status == CU_GET_PROC_ADDRESS_SUCCESS);
    CHECK(fn == d.sym("cuMemAlloc_v2"));
    REQUIRE(d.cuGetProcAddress_v2("cuCtxCreate", &fn, 11040, 0, &status) == CUDA_SUCCESS);
    CHECK(fn == d.sym("cuCtxCreate_v3"));
    REQUIRE(d.cuGetProcAddress_v2("cuEventElapsedTime", &fn, 12000, 0, &status) == CUDA_SUCCESS);
    CHECK(fn == d.sym("cuEventElapsedTime"));
    REQUIRE(d.cuGetProcAddress_v2("cuMemcpy", &fn, 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
                                  &status) == CUDA_SUCCESS);
    CHECK(fn == d.sym("cuMemcpy"));
    REQUIRE(d.cuGetProcAddress_v2("cuMemAlloc_v2", &fn, 13000, 0, &status) == CUDA_SUCCESS);
    CHECK(fn == nullptr);
    CHECK(status == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    REQUIRE(d.cuGetProcAddress_v2("", &fn, 13000, 0, &status) == CUDA_SUCCESS);
    CHECK(status == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    REQUIRE(d.cuGetProcAddress_v2("cuLibraryLoadData", &fn, 11000, 0, &status) == CUDA_SUCCESS);
    CHECK(fn == nullptr);
    CHECK(status == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
    fn = &status;
    CHECK(d.cuGetProcAddress_v2("cuMemAlloc", &fn, 13010, 0, &status) == CUDA_ERROR_INVALID_VALUE);
    CHECK(fn == &status);  // left alone
}

TEST_CASE("tensor maps are written in the documented format, moved, and checked", "[unit]") {
    primary_context pc;
    auto tiled = reinterpret_cast<decltype(&::cuTensorMapEncodeTiled)>(drv().sym("cuTensorMapEncodeTiled"));
    auto replace =
        reinterpret_cast<decltype(&::cuTensorMapReplaceAddress)>(drv().sym("cuTensorMapReplaceAddress"));
    auto start = reinterpret_cast<decltype(&::cuProfilerStart)>(drv().sym("cuProfilerStart"));
    auto stop = reinterpret_cast<decltype(&::cuProfilerStop)>(drv().sym("cuProfilerStop"));
    REQUIRE(tiled);
    REQUIRE(replace);
    REQUIRE(start);
    REQUIRE(stop);
    CUdeviceptr a = 0, b = 0;
    REQUIRE(drv().cuMemAlloc_v2(&a, 64 * 64 * 4) == CUDA_SUCCESS);
    REQUIRE(drv().cuMemAlloc_v2(&b, 64 * 64 * 4) == CUDA_SUCCESS);
    const cuuint64_t dims[2] = {64, 48};
    const cuuint64_t strides[1] = {256};
    const cuuint32_t box[2] = {16, 8};
    const cuuint32_t es[2] = {1, 1};
    CUtensorMap m{};
    REQUIRE(tiled(&m, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, reinterpret_cast<void*>(a), dims, strides, box, es,
                  CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS);
    vcuda::soft::tensor_map_desc d;
    REQUIRE(vcuda::soft::decode_tensor_map(&m, d));
    CHECK(d.kind == 0);
    CHECK(d.rank == 2);
    CHECK(d.element_bytes == 4);
    CHECK(d.address == a);
    CHECK(d.dims[0] == 64);
    CHECK(d.dims[1] == 48);
    CHECK(d.strides[0] == 256);
    CHECK(d.box(0) == 16);
    CHECK(d.box(1) == 8);
    REQUIRE(replace(&m, reinterpret_cast<void*>(b)) == CUDA_SUCCESS);
    REQUIRE(vcuda::soft::decode_tensor_map(&m, d));
    CHECK(d.address == b);
    CHECK(replace(&m, reinterpret_cast<void*>(b + 4)) == CUDA_ERROR_INVALID_VALUE);
    CUtensorMap junk{};
    CHECK(replace(&junk, reinterpret_cast<void*>(b)) == CUDA_ERROR_INVALID_VALUE);
    // Refused: rank 0 and 6, a misaligned address, a stride not a multiple of 16, a box row not a multiple of
    // 16 bytes.
    CHECK(tiled(&m, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 0, reinterpret_cast<void*>(a), dims, strides, box, es,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_ERROR_INVALID_VALUE);
    CHECK(tiled(&m, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 6, reinterpret_cast<void*>(a), dims, strides, box, es,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_ERROR_INVALID_VALUE);
    CHECK(tiled(&m, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, reinterpret_cast<void*>(a + 8), dims, strides, box,
                es, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                CU_TENSOR_MAP_L2_PROMOTION_NONE,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_ERROR_INVALID_VALUE);
    const cuuint64_t odd_stride[1] = {260};
    CHECK(tiled(&m, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, reinterpret_cast<void*>(a), dims, odd_stride, box, es,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_ERROR_INVALID_VALUE);
    const cuuint32_t narrow_box[2] = {2, 8};
    CHECK(tiled(&m, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, reinterpret_cast<void*>(a), dims, strides, narrow_box,
                es, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                CU_TENSOR_MAP_L2_PROMOTION_NONE,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_ERROR_INVALID_VALUE);
    CHECK(start() == CUDA_SUCCESS);
    CHECK(stop() == CUDA_SUCCESS);
    CHECK(drv().cuMemFree_v2(a) == CUDA_SUCCESS);
    CHECK(drv().cuMemFree_v2(b) == CUDA_SUCCESS);
}
