// device_props: everything the runtime reports about each device, one field per line, so that a native run
// and a run through vcuda can be diffed field by field — every scalar field of cudaDeviceProp in CUDA 13, the
// UUID and PCI ids, every cudaDeviceAttr (name = value, or the error), the PCI bus id string, the total
// memory, and the driver and runtime versions. Fields that legitimately vary (free memory; the LUID,
// undefined on Linux) are printed as info:. Checks: sane values, and the properties agree with the
// attributes.
#include <cuda_runtime.h>

#include <cstring>
#include <vector>

#include "common.cuh"

#define P(f) printf("  " #f " = %lld\n", static_cast<long long>(p.f))
#define P2(f) printf("  " #f " = %d %d\n", p.f[0], p.f[1])
#define P3(f) printf("  " #f " = %d %d %d\n", p.f[0], p.f[1], p.f[2])

// Every cudaDeviceAttr of CUDA 13.0 (driver_types.h), cudaDevAttrMax excluded.
#define VCUDA_DEVICE_ATTRS(A)                            \
    A(cudaDevAttrMaxThreadsPerBlock)                     \
    A(cudaDevAttrMaxBlockDimX)                           \
    A(cudaDevAttrMaxBlockDimY)                           \
    A(cudaDevAttrMaxBlockDimZ)                           \
    A(cudaDevAttrMaxGridDimX)                            \
    A(cudaDevAttrMaxGridDimY)                            \
    A(cudaDevAttrMaxGridDimZ)                            \
    A(cudaDevAttrMaxSharedMemoryPerBlock)                \
    A(cudaDevAttrTotalConstantMemory)                    \
    A(cudaDevAttrWarpSize)                               \
    A(cudaDevAttrMaxPitch)                               \
    A(cudaDevAttrMaxRegistersPerBlock)                   \
    A(cudaDevAttrClockRate)                              \
    A(cudaDevAttrTextureAlignment)                       \
    A(cudaDevAttrGpuOverlap)                             \
    A(cudaDevAttrMultiProcessorCount)                    \
    A(cudaDevAttrKernelExecTimeout)                      \
    A(cudaDevAttrIntegrated)                             \
    A(cudaDevAttrCanMapHostMemory)                       \
    A(cudaDevAttrComputeMode)                            \
    A(cudaDevAttrMaxTexture1DWidth)                      \
    A(cudaDevAttrMaxTexture2DWidth)                      \
    A(cudaDevAttrMaxTexture2DHeight)                     \
    A(cudaDevAttrMaxTexture3DWidth)                      \
    A(cudaDevAttrMaxTexture3DHeight)                     \
    A(cudaDevAttrMaxTexture3DDepth)                      \
    A(cudaDevAttrMaxTexture2DLayeredWidth)               \
    A(cudaDevAttrMaxTexture2DLayeredHeight)              \
    A(cudaDevAttrMaxTexture2DLayeredLayers)              \
    A(cudaDevAttrSurfaceAlignment)                       \
    A(cudaDevAttrConcurrentKernels)                      \
    A(cudaDevAttrEccEnabled)                             \
    A(cudaDevAttrPciBusId)                               \
    A(cudaDevAttrPciDeviceId)                            \
    A(cudaDevAttrTccDriver)                              \
    A(cudaDevAttrMemoryClockRate)                        \
    A(cudaDevAttrGlobalMemoryBusWidth)                   \
    A(cudaDevAttrL2CacheSize)                            \
    A(cudaDevAttrMaxThreadsPerMultiProcessor)            \
    A(cudaDevAttrAsyncEngineCount)                       \
    A(cudaDevAttrUnifiedAddressing)                      \
    A(cudaDevAttrMaxTexture1DLayeredWidth)               \
    A(cudaDevAttrMaxTexture1DLayeredLayers)              \
    A(cudaDevAttrMaxTexture2DGatherWidth)                \
    A(cudaDevAttrMaxTexture2DGatherHeight)               \
    A(cudaDevAttrMaxTexture3DWidthAlt)                   \
    A(cudaDevAttrMaxTexture3DHeightAlt)                  \
    A(cudaDevAttrMaxTexture3DDepthAlt)                   \
    A(cudaDevAttrPciDomainId)                            \
    A(cudaDevAttrTexturePitchAlignment)                  \
    A(cudaDevAttrMaxTextureCubemapWidth)                 \
    A(cudaDevAttrMaxTextureCubemapLayeredWidth)          \
    A(cudaDevAttrMaxTextureCubemapLayeredLayers)         \
    A(cudaDevAttrMaxSurface1DWidth)                      \
    A(cudaDevAttrMaxSurface2DWidth)                      \
    A(cudaDevAttrMaxSurface2DHeight)                     \
    A(cudaDevAttrMaxSurface3DWidth)                      \
    A(cudaDevAttrMaxSurface3DHeight)                     \
    A(cudaDevAttrMaxSurface3DDepth)                      \
    A(cudaDevAttrMaxSurface1DLayeredWidth)               \
    A(cudaDevAttrMaxSurface1DLayeredLayers)              \
    A(cudaDevAttrMaxSurface2DLayeredWidth)               \
    A(cudaDevAttrMaxSurface2DLayeredHeight)              \
    A(cudaDevAttrMaxSurface2DLayeredLayers)              \
    A(cudaDevAttrMaxSurfaceCubemapWidth)                 \
    A(cudaDevAttrMaxSurfaceCubemapLayeredWidth)          \
    A(cudaDevAttrMaxSurfaceCubemapLayeredLayers)         \
    A(cudaDevAttrMaxTexture1DLinearWidth)                \
    A(cudaDevAttrMaxTexture2DLinearWidth)                \
    A(cudaDevAttrMaxTexture2DLinearHeight)               \
    A(cudaDevAttrMaxTexture2DLinearPitch)                \
    A(cudaDevAttrMaxTexture2DMipmappedWidth)             \
    A(cudaDevAttrMaxTexture2DMipmappedHeight)            \
    A(cudaDevAttrComputeCapabilityMajor)                 \
    A(cudaDevAttrComputeCapabilityMinor)                 \
    A(cudaDevAttrMaxTexture1DMipmappedWidth)             \
    A(cudaDevAttrStreamPrioritiesSupported)              \
    A(cudaDevAttrGlobalL1CacheSupported)                 \
    A(cudaDevAttrLocalL1CacheSupported)                  \
    A(cudaDevAttrMaxSharedMemoryPerMultiprocessor)       \
    A(cudaDevAttrMaxRegistersPerMultiprocessor)          \
    A(cudaDevAttrManagedMemory)                          \
    A(cudaDevAttrIsMultiGpuBoard)                        \
    A(cudaDevAttrMultiGpuBoardGroupID)                   \
    A(cudaDevAttrHostNativeAtomicSupported)              \
    A(cudaDevAttrSingleToDoublePrecisionPerfRatio)       \
    A(cudaDevAttrPageableMemoryAccess)                   \
    A(cudaDevAttrConcurrentManagedAccess)                \
    A(cudaDevAttrComputePreemptionSupported)             \
    A(cudaDevAttrCanUseHostPointerForRegisteredMem)      \
    A(cudaDevAttrReserved92)                             \
    A(cudaDevAttrReserved93)                             \
    A(cudaDevAttrReserved94)                             \
    A(cudaDevAttrCooperativeLaunch)                      \
    A(cudaDevAttrReserved96)                             \
    A(cudaDevAttrMaxSharedMemoryPerBlockOptin)           \
    A(cudaDevAttrCanFlushRemoteWrites)                   \
    A(cudaDevAttrHostRegisterSupported)                  \
    A(cudaDevAttrPageableMemoryAccessUsesHostPageTables) \
    A(cudaDevAttrDirectManagedMemAccessFromHost)         \
    A(cudaDevAttrMaxBlocksPerMultiprocessor)             \
    A(cudaDevAttrMaxPersistingL2CacheSize)               \
    A(cudaDevAttrMaxAccessPolicyWindowSize)              \
    A(cudaDevAttrReservedSharedMemoryPerBlock)           \
    A(cudaDevAttrSparseCudaArraySupported)               \
    A(cudaDevAttrHostRegisterReadOnlySupported)          \
    A(cudaDevAttrTimelineSemaphoreInteropSupported)      \
    A(cudaDevAttrMemoryPoolsSupported)                   \
    A(cudaDevAttrGPUDirectRDMASupported)                 \
    A(cudaDevAttrGPUDirectRDMAFlushWritesOptions)        \
    A(cudaDevAttrGPUDirectRDMAWritesOrdering)            \
    A(cudaDevAttrMemoryPoolSupportedHandleTypes)         \
    A(cudaDevAttrClusterLaunch)                          \
    A(cudaDevAttrDeferredMappingCudaArraySupported)      \
    A(cudaDevAttrReserved122)                            \
    A(cudaDevAttrReserved123)                            \
    A(cudaDevAttrReserved124)                            \
    A(cudaDevAttrIpcEventSupport)                        \
    A(cudaDevAttrMemSyncDomainCount)                     \
    A(cudaDevAttrReserved127)                            \
    A(cudaDevAttrReserved128)                            \
    A(cudaDevAttrReserved129)                            \
    A(cudaDevAttrNumaConfig)                             \
    A(cudaDevAttrNumaId)                                 \
    A(cudaDevAttrReserved132)                            \
    A(cudaDevAttrMpsEnabled)                             \
    A(cudaDevAttrHostNumaId)                             \
    A(cudaDevAttrD3D12CigSupported)                      \
    A(cudaDevAttrVulkanCigSupported)                     \
    A(cudaDevAttrGpuPciDeviceId)                         \
    A(cudaDevAttrGpuPciSubsystemId)                      \
    A(cudaDevAttrReserved141)                            \
    A(cudaDevAttrHostNumaMemoryPoolsSupported)           \
    A(cudaDevAttrHostNumaMultinodeIpcSupported)          \
    A(cudaDevAttrHostMemoryPoolsSupported)               \
    A(cudaDevAttrReserved145)                            \
    A(cudaDevAttrOnlyPartialHostNativeAtomicSupported)

struct attr_name {
    cudaDeviceAttr attr;
    const char* name;
};
#define A(x) {x, #x},
static const attr_name all_attrs[] = {VCUDA_DEVICE_ATTRS(A)};
#undef A

int main() {
    int drv = 0, rt = 0, count = 0;
    CHECK(cudaDriverGetVersion(&drv));
    CHECK(cudaRuntimeGetVersion(&rt));
    CHECK(cudaGetDeviceCount(&count));
    printf("driver version %d, runtime version %d\n", drv, rt);
    printf("device count %d\n", count);
    EXPECT(count > 0, "no device");
    EXPECT(drv >= 13000, "driver version %d is older than the runtime (13.0)", drv);

    for (int dev = 0; dev < count; ++dev) {
        cudaDeviceProp p;
        memset(&p, 0, sizeof p);
        CHECK(cudaGetDeviceProperties(&p, dev));
        printf("device %d:\n", dev);
        printf("  name = %s\n", p.name);
        printf("  uuid = GPU-");
        for (int i = 0; i < 16; ++i) {
            printf("%02x", static_cast<unsigned char>(p.uuid.bytes[i]));
            if (i == 3 || i == 5 || i == 7 || i == 9) printf("-");
        }
        printf("\n");
        printf("info:   luid = ");
        for (int i = 0; i < 8; ++i) printf("%02x", static_cast<unsigned char>(p.luid[i]));
        printf(", luidDeviceNodeMask = %u\n", p.luidDeviceNodeMask);
        printf("  pci = %04x:%02x:%02x\n", p.pciDomainID, p.pciBusID, p.pciDeviceID);
        P(totalGlobalMem);
        P(sharedMemPerBlock);
        P(regsPerBlock);
        P(warpSize);
        P(memPitch);
        P(maxThreadsPerBlock);
        P3(maxThreadsDim);
        P3(maxGridSize);
        P(totalConstMem);
        P(major);
        P(minor);
        P(textureAlignment);
        P(texturePitchAlignment);
        P(multiProcessorCount);
        P(integrated);
        P(canMapHostMemory);
        P(maxTexture1D);
        P(maxTexture1DMipmap);
        P2(maxTexture2D);
        P2(maxTexture2DMipmap);
        P3(maxTexture2DLinear);
        P2(maxTexture2DGather);
        P3(maxTexture3D);
        P3(maxTexture3DAlt);
        P(maxTextureCubemap);
        P2(maxTexture1DLayered);
        P3(maxTexture2DLayered);
        P2(maxTextureCubemapLayered);
        P(maxSurface1D);
        P2(maxSurface2D);
        P3(maxSurface3D);
        P2(maxSurface1DLayered);
        P3(maxSurface2DLayered);
        P(maxSurfaceCubemap);
        P2(maxSurfaceCubemapLayered);
        P(surfaceAlignment);
        P(concurrentKernels);
        P(ECCEnabled);
        P(pciBusID);
        P(pciDeviceID);
        P(pciDomainID);
        P(tccDriver);
        P(asyncEngineCount);
        P(unifiedAddressing);
        P(memoryBusWidth);
        P(l2CacheSize);
        P(persistingL2CacheMaxSize);
        P(maxThreadsPerMultiProcessor);
        P(streamPrioritiesSupported);
        P(globalL1CacheSupported);
        P(localL1CacheSupported);
        P(sharedMemPerMultiprocessor);
        P(regsPerMultiprocessor);
        P(managedMemory);
        P(isMultiGpuBoard);
        P(multiGpuBoardGroupID);
        P(hostNativeAtomicSupported);
        P(pageableMemoryAccess);
        printf("info:   concurrentManagedAccess = %d\n",
               p.concurrentManagedAccess);  // see the attribute below
        P(computePreemptionSupported);
        P(canUseHostPointerForRegisteredMem);
        P(cooperativeLaunch);
        P(sharedMemPerBlockOptin);
        P(pageableMemoryAccessUsesHostPageTables);
        P(directManagedMemAccessFromHost);
        P(maxBlocksPerMultiProcessor);
        P(accessPolicyMaxWindowSize);
        P(reservedSharedMemPerBlock);
        P(hostRegisterSupported);
        P(sparseCudaArraySupported);
        P(hostRegisterReadOnlySupported);
        P(timelineSemaphoreInteropSupported);
        P(memoryPoolsSupported);
        P(gpuDirectRDMASupported);
        P(gpuDirectRDMAFlushWritesOptions);
        P(gpuDirectRDMAWritesOrdering);
        P(memoryPoolSupportedHandleTypes);
        P(deferredMappingCudaArraySupported);
        P(ipcEventSupported);
        P(clusterLaunch);
        P(unifiedFunctionPointers);
        P(deviceNumaConfig);
        P(deviceNumaId);
        P(mpsEnabled);
        P(hostNumaId);
        P(gpuPciDeviceID);
        P(gpuPciSubsystemID);
        P(hostNumaMultinodeIpcSupported);

        EXPECT(p.name[0] != 0, "empty device name");
        EXPECT(p.warpSize == 32, "warpSize %d", p.warpSize);
        EXPECT(p.major >= 1, "major %d", p.major);
        EXPECT(p.maxThreadsPerBlock >= 64, "maxThreadsPerBlock %d", p.maxThreadsPerBlock);
        EXPECT(p.totalGlobalMem > 0, "totalGlobalMem 0");
        EXPECT(p.multiProcessorCount > 0, "multiProcessorCount 0");

        // Every attribute, by name.
        CHECK(cudaSetDevice(dev));
        int errors = 0;
        for (const auto& a : all_attrs) {
            int v = 0;
            cudaError_t e = cudaDeviceGetAttribute(&v, a.attr, dev);
            if (e == cudaSuccess) {
                // vcuda reports concurrent managed access as 0 on purpose (client/managed.hpp: the CPU's view
                // is kept coherent by faults, as on a GPU without it): an info line, not compared.
                const bool by_design = a.attr == cudaDevAttrConcurrentManagedAccess;
                printf("%s  %s = %d\n", by_design ? "info:" : "", a.name, v);
            } else {
                printf("  %s: %s\n", a.name, cudaGetErrorName(e));
                ++errors;
                (void)cudaGetLastError();
            }
        }
        printf("  attributes: %zu queried, %d errors\n", sizeof all_attrs / sizeof all_attrs[0], errors);

        // The properties and the attributes tell the same story.
        const struct {
            cudaDeviceAttr attr;
            long long prop;
            const char* name;
        } same[] = {
            {cudaDevAttrMaxThreadsPerBlock, p.maxThreadsPerBlock, "maxThreadsPerBlock"},
            {cudaDevAttrWarpSize, p.warpSize, "warpSize"},
            {cudaDevAttrMultiProcessorCount, p.multiProcessorCount, "multiProcessorCount"},
            {cudaDevAttrComputeCapabilityMajor, p.major, "major"},
            {cudaDevAttrComputeCapabilityMinor, p.minor, "minor"},
            {cudaDevAttrMaxBlockDimX, p.maxThreadsDim[0], "maxThreadsDim[0]"},
            {cudaDevAttrMaxGridDimX, p.maxGridSize[0], "maxGridSize[0]"},
            {cudaDevAttrMaxSharedMemoryPerBlock, static_cast<long long>(p.sharedMemPerBlock),
             "sharedMemPerBlock"},
            {cudaDevAttrMaxRegistersPerBlock, p.regsPerBlock, "regsPerBlock"},
            {cudaDevAttrL2CacheSize, p.l2CacheSize, "l2CacheSize"},
            {cudaDevAttrPciBusId, p.pciBusID, "pciBusID"},
            {cudaDevAttrPciDeviceId, p.pciDeviceID, "pciDeviceID"},
            {cudaDevAttrPciDomainId, p.pciDomainID, "pciDomainID"},
            {cudaDevAttrGlobalMemoryBusWidth, p.memoryBusWidth, "memoryBusWidth"},
            {cudaDevAttrUnifiedAddressing, p.unifiedAddressing, "unifiedAddressing"},
        };
        for (const auto& s : same) {
            int v = -1;
            CHECK(cudaDeviceGetAttribute(&v, s.attr, dev));
            EXPECT(v == s.prop, "attribute for %s = %d, property = %lld", s.name, v, s.prop);
        }
        printf("  properties agree with attributes: yes\n");

        char bus[64] = {};
        CHECK(cudaDeviceGetPCIBusId(bus, sizeof bus, dev));
        printf("  cudaDeviceGetPCIBusId = %s\n", bus);

        // The widest 1D linear texture, per element type (cuDeviceGetTexture1DLinearMaxWidth).
        const cudaChannelFormatDesc kinds[] = {cudaCreateChannelDesc<unsigned char>(),
                                               cudaCreateChannelDesc<short2>(),
                                               cudaCreateChannelDesc<float4>()};
        for (const auto& k : kinds) {
            size_t w = 0;
            CHECK(cudaDeviceGetTexture1DLinearMaxWidth(&w, &k, dev));
            printf("  cudaDeviceGetTexture1DLinearMaxWidth(%d-bit x %d) = %zu\n", k.x,
                   (k.y != 0) + (k.z != 0) + (k.w != 0) + 1, w);
        }

        // The native atomic capabilities of the device's link to its host (CUDA 13), every operation at once.
        std::vector<cudaAtomicOperation> ops;
        for (int o = 0; o < static_cast<int>(cudaAtomicOperationFloatMax) + 1; ++o)
            ops.push_back(static_cast<cudaAtomicOperation>(o));
        std::vector<unsigned> caps(ops.size(), 0xdeadu);
        CHECK(cudaDeviceGetHostAtomicCapabilities(caps.data(), ops.data(), static_cast<unsigned>(ops.size()),
                                                  dev));
        printf("  cudaDeviceGetHostAtomicCapabilities =");
        for (unsigned c : caps) printf(" %#x", c);
        printf("\n");
        const cudaAtomicOperation bad = static_cast<cudaAtomicOperation>(1000);
        cudaError_t e = cudaDeviceGetHostAtomicCapabilities(caps.data(), &bad, 1, dev);
        printf("  cudaDeviceGetHostAtomicCapabilities of an unknown operation: %s\n", cudaGetErrorName(e));
        (void)cudaGetLastError();

        size_t free_b = 0, total_b = 0;
        CHECK(cudaMemGetInfo(&free_b, &total_b));
        printf("  cudaMemGetInfo total = %zu\n", total_b);
        printf("info:   cudaMemGetInfo free = %zu\n", free_b);
        EXPECT(total_b == p.totalGlobalMem, "cudaMemGetInfo total %zu != totalGlobalMem %zu", total_b,
               p.totalGlobalMem);
        EXPECT(free_b <= total_b, "free > total");
    }
    return pass();
}
