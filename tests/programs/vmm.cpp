// vmm: the virtual memory management API as PyTorch's expandable segments uses it: one large reservation,
// physical chunks created and mapped one after another at its start so that the mapped part grows without
// moving, access set, memsets and copies across chunk boundaries, a chunk unmapped and released, and the
// reservation freed. Plus a refusal: a map outside any reservation. (A bogus handle is not tried: the real
// driver crashes on one.) Also an allocation of two chunks mapped whole (a mapping at an offset into it is
// refused), and a chunk released while still mapped (its memory stays until the unmap).
//   vmm [PAUSE_MS]: idles PAUSE_MS with all of it mapped (a server may suspend the session meanwhile), then
//   checks every byte again.
// Linked with -lcuda, no runtime.
#include <cuda.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "common.cuh"
#include "cu_check.h"

int main(int argc, char** argv) {
    const int pause_ms = argc > 1 ? std::atoi(argv[1]) : 0;
    CUcontext ctx;
    CUdevice dev = init_device0(&ctx);

    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    size_t gran = 0;
    CU_CHECK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    std::printf("granularity %zu KiB\n", gran >> 10);
    // NCCL's probe for host-located cuMem memory starts with this query and fails hard if it fails.
    CUmemAllocationProp host_prop = prop;
    host_prop.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
    host_prop.location.id = 0;
    size_t host_gran = 0;
    CU_CHECK(cuMemGetAllocationGranularity(&host_gran, &host_prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    std::printf("host NUMA granularity %zu KiB\n", host_gran >> 10);

    const size_t reserve = size_t(64) << 30;  // 64 GiB of addresses, almost none of it backed
    CUdeviceptr base = 0;
    CU_CHECK(cuMemAddressReserve(&base, reserve, 0, 0, 0));

    const int chunks = 3;
    CUmemGenericAllocationHandle h[chunks];
    CUmemAccessDesc access{};
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    for (int i = 0; i < chunks; ++i) {
        CU_CHECK(cuMemCreate(&h[i], gran, &prop, 0));
        CU_CHECK(cuMemMap(base + i * gran, gran, 0, h[i], 0));
        CU_CHECK(cuMemSetAccess(base + i * gran, gran, &access, 1));
    }
    unsigned long long granted = 0;
    CU_CHECK(cuMemGetAccess(&granted, &access.location, base + gran + 64));
    std::printf("cuMemGetAccess of a mapped chunk: %s\n",
                granted == CU_MEM_ACCESS_FLAGS_PROT_READWRITE ? "read-write" : "other");
    if (cuMemGetAccess(&granted, &access.location, 0x1000) == CUDA_SUCCESS)
        fail("cuMemGetAccess of an address nobody reserved succeeded");
    CUmemAllocationProp back{};
    CU_CHECK(cuMemGetAllocationPropertiesFromHandle(&back, h[1]));
    std::printf("properties from handle: type %d, location %d/%d\n", back.type, back.location.type,
                back.location.id == dev ? 0 : -1);

    // One value per chunk, then a copy that spans all of them.
    const size_t words = gran / 4;
    for (int i = 0; i < chunks; ++i) CU_CHECK(cuMemsetD32(base + i * gran, 0x1000u + i, words));
    std::vector<unsigned> host(words * chunks);
    CU_CHECK(cuMemcpyDtoH(host.data(), base, host.size() * 4));
    for (size_t k = 0; k < host.size(); ++k)
        if (host[k] != 0x1000u + k / words) fail("word %zu = %#x", k, host[k]);
    for (size_t k = 0; k < host.size(); ++k) host[k] = static_cast<unsigned>(k * 2654435761u);
    CU_CHECK(cuMemcpyHtoD(base + 100, host.data(), host.size() * 4 - 200));
    std::vector<unsigned> again(host.size());
    CU_CHECK(cuMemcpyDtoH(again.data(), base + 100, host.size() * 4 - 200));
    if (std::memcmp(again.data(), host.data(), host.size() * 4 - 200) != 0)
        fail("copy across chunks differs");
    std::printf("%d chunks mapped contiguously: memsets and copies across them ok\n", chunks);

    // A two-chunk allocation mapped after the others; the middle chunk released while mapped. (A mapping at
    // an offset into an allocation is refused by the H200's driver, 801: cuMemMap's offset must be 0.)
    CUmemGenericAllocationHandle pair;
    CU_CHECK(cuMemCreate(&pair, 2 * gran, &prop, 0));
    const CUdeviceptr half = base + 4 * gran;
    CU_CHECK(cuMemMap(half, 2 * gran, 0, pair, 0));
    CU_CHECK(cuMemSetAccess(half, 2 * gran, &access, 1));
    CU_CHECK(cuMemsetD32(half, 0x2000u, 2 * words));
    if (cuMemMap(base + 8 * gran, gran, gran, pair, 0) == CUDA_SUCCESS)
        fail("a mapping at an offset into its allocation was accepted");
    CU_CHECK(cuMemRelease(h[1]));
    // cuMemRetainAllocationHandle, as NCCL frees its buffers: the handle of the allocation mapped at an
    // address inside it, one more reference, held across the pause (a suspend or a move keeps the count);
    // released once after it, the allocation and its mapping stay.
    CUmemGenericAllocationHandle retained = 0;
    CU_CHECK(cuMemRetainAllocationHandle(&retained, reinterpret_cast<void*>(half + gran + 8)));
    std::printf("retained handle: %s\n", retained == pair ? "the one created" : "another");
    if (pause_ms > 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
        std::printf("idled %d ms\n", pause_ms);
    }
    CU_CHECK(cuMemcpyDtoH(again.data(), base + 100, host.size() * 4 - 200));
    if (std::memcmp(again.data(), host.data(), host.size() * 4 - 200) != 0)
        fail("the chunks' contents changed");
    std::vector<unsigned> second(2 * words);
    CU_CHECK(cuMemcpyDtoH(second.data(), half, 2 * gran));
    for (size_t k = 0; k < second.size(); ++k)
        if (second[k] != 0x2000u) fail("two-chunk mapping word %zu = %#x", k, second[k]);
    std::printf("contents intact: the chunks (one released while mapped) and a two-chunk allocation\n");
    CU_CHECK(cuMemRelease(retained));
    CU_CHECK(cuMemGetAllocationPropertiesFromHandle(&back, pair));
    CU_CHECK(cuMemsetD32(half + gran, 0x3000u, words));
    CU_CHECK(cuMemcpyDtoH(second.data(), half, 2 * gran));
    for (size_t k = 0; k < second.size(); ++k)
        if (second[k] != (k < words ? 0x2000u : 0x3000u)) fail("after a retain and release: word %zu", k);
    // Memory that cuMemAlloc gave is not the application's VMM allocation: refused.
    CUdeviceptr plain = 0;
    CU_CHECK(cuMemAlloc(&plain, 1 << 20));
    CUmemGenericAllocationHandle none = 0;
    std::printf("retain of cuMemAlloc memory: %s\n",
                cuMemRetainAllocationHandle(&none, reinterpret_cast<void*>(plain)) == CUDA_SUCCESS
                    ? "accepted"
                    : "refused");
    CU_CHECK(cuMemFree(plain));
    std::printf("retained and released once: the allocation stays mapped and usable\n");

    // Refusals leave everything as it was.
    CUdeviceptr outside = base + reserve + (size_t(1) << 30);
    CUresult r = cuMemMap(outside, gran, 0, h[0], 0);
    std::printf("map outside the reservation: %s\n", r == CUDA_SUCCESS ? "accepted (wrong)" : "refused");
    if (r == CUDA_SUCCESS) fail("a map outside every reservation was accepted");

    // Shrink from the end, then tear everything down.
    CU_CHECK(cuMemUnmap(base + 2 * gran, gran));
    CU_CHECK(cuMemRelease(h[2]));
    CU_CHECK(cuMemcpyDtoH(again.data(), base, 2 * gran));
    CU_CHECK(cuMemUnmap(half, 2 * gran));
    CU_CHECK(cuMemRelease(pair));
    for (int i = 0; i < 2; ++i) CU_CHECK(cuMemUnmap(base + i * gran, gran));
    CU_CHECK(cuMemRelease(h[0]));  // h[1] was released while mapped: its memory went with the unmap
    CU_CHECK(cuMemAddressFree(base, reserve));
    CU_CHECK(cuDevicePrimaryCtxRelease(dev));
    std::printf("PASS vmm\n");
    return 0;
}
