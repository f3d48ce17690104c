// The software test driver: initialisation, version, devices and their attributes, error strings.
// Devices: VCUDA_SOFT_DEVICES of them (default 1, at most 8; 0 makes cuInit answer CUDA_ERROR_NO_DEVICE),
// each with VCUDA_SOFT_MEMORY bytes (default 8 GiB) of memory that allocations are counted against. They
// describe an sm_90 (H100-like) part and name themselves "vcuda software test driver (CPU)": this library is
// a CI stand-in for libcuda, never a feature.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "soft_state.hpp"

namespace vcuda::soft {

void create_primary_contexts(state& s);  // soft_context.cpp

namespace {

size_t env_size(const char* name, size_t fallback) {
    const char* v = std::getenv(name);
    if (v == nullptr || *v == '\0') return fallback;
    char* end = nullptr;
    unsigned long long n = std::strtoull(v, &end, 0);
    if (end == v || *end != '\0') {
        std::fprintf(stderr, "vcuda softdriver: ignoring %s='%s' (not a number)\n", name, v);
        return fallback;
    }
    return static_cast<size_t>(n);
}

constexpr int pci_bus_base = 0x10;

// Values of an H100 SXM (sm_90) where they are fixed; per-device ones are filled in by attribute().
constexpr int attribute_table_size = CU_DEVICE_ATTRIBUTE_MAX;
constexpr std::array<int, attribute_table_size> make_attributes() {
    std::array<int, attribute_table_size> a{};
    a[CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK] = max_threads_per_block;
    a[CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X] = max_block_x;
    a[CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y] = max_block_y;
    a[CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z] = max_block_z;
    a[CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X] = static_cast<int>(max_grid_x);
    a[CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y] = max_grid_y;
    a[CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z] = max_grid_z;
    a[CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK] = shared_per_block;
    a[CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY] = 65536;
    a[CU_DEVICE_ATTRIBUTE_WARP_SIZE] = 32;
    a[CU_DEVICE_ATTRIBUTE_MAX_PITCH] = 2147483647;
    a[CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK] = 65536;
    a[CU_DEVICE_ATTRIBUTE_CLOCK_RATE] = 1980000;
    a[CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT] = 512;
    a[CU_DEVICE_ATTRIBUTE_GPU_OVERLAP] = 1;
    a[CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT] = sm_count;
    a[CU_DEVICE_ATTRIBUTE_KERNEL_EXEC_TIMEOUT] = 0;
    a[CU_DEVICE_ATTRIBUTE_INTEGRATED] = 0;
    a[CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY] = 1;
    a[CU_DEVICE_ATTRIBUTE_COMPUTE_MODE] = CU_COMPUTEMODE_DEFAULT;
    a[CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_WIDTH] = 131072;
    a[CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_WIDTH] = 131072;
    a[CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_HEIGHT] = 65536;
    a[CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_WIDTH] = 16384;
    a[CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_HEIGHT] = 16384;
    a[CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_DEPTH] = 16384;
    a[CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_LAYERED_WIDTH] = 32768;
    a[CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_LAYERED_HEIGHT] = 32768;
    a[CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_LAYERED_LAYERS] = 2048;
    a[CU_DEVICE_ATTRIBUTE_SURFACE_ALIGNMENT] = 512;
    a[CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS] = 1;
    a[CU_DEVICE_ATTRIBUTE_ECC_ENABLED] = 1;
    a[CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID] = 0;
    a[CU_DEVICE_ATTRIBUTE_TCC_DRIVER] = 0;
    a[CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE] = 2619000;
    a[CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH] = 5120;
    a[CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE] = 52428800;
    a[CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR] = max_threads_per_sm;
    a[CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT] = 3;
    a[CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING] = 1;
    a[CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_LAYERED_WIDTH] = 32768;
    a[CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_LAYERED_LAYERS] = 2048;
    a[CU_DEVICE_ATTRIBUTE_CAN_TEX2D_GATHER] = 1;
    a[CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_GATHER_WIDTH] = 32768;
    a[CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_GATHER_HEIGHT] = 32768;
    a[CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_WIDTH_ALTERNATE] = 8192;
    a[CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_HEIGHT_ALTERNATE] = 8192;
    a[CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_DEPTH_ALTERNATE] = 32768;
    a[CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID] = 0;
    a[CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT] = 32;
    a[CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURECUBEMAP_WIDTH] = 32768;
    a[CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURECUBEMAP_LAYERED_WIDTH] = 32768;
    a[CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURECUBEMAP_LAYERED_LAYERS] = 2046;
    a[CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE1D_WIDTH] = 32768;
    a[CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE2D_WIDTH] = 131072;
    a[CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE2D_HEIGHT] = 65536;
    a[CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE3D_WIDTH] = 16384;
    a[CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE3D_HEIGHT] = 16384;
    a[CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE3D_DEPTH] = 16384;
    a[CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE1D_LAYERED_WIDTH] = 32768;
    a[CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE1D_LAYERED_LAYERS] = 2048;
    a[CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE2D_LAYERED_WIDTH] = 32768;
    a[CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE2D_LAYERED_HEIGHT] = 32768;
    a[CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE2D_LAYERED_LAYERS] = 2048;
    a[CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACECUBEMAP_WIDTH] = 32768;
    a[CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACECUBEMAP_LAYERED_WIDTH] = 32768;
    a[CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACECUBEMAP_LAYERED_LAYERS] = 2046;
    a[CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_LINEAR_WIDTH] = 268435456;
    a[CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_LINEAR_WIDTH] = 131072;
    a[CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_LINEAR_HEIGHT] = 65000;
    a[CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_LINEAR_PITCH] = 2097120;
    a[CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_MIPMAPPED_WIDTH] = 32768;
    a[CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_MIPMAPPED_HEIGHT] = 32768;
    a[CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR] = 9;
    a[CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR] = 0;
    a[CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_MIPMAPPED_WIDTH] = 32768;
    a[CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED] = 1;
    a[CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED] = 1;
    a[CU_DEVICE_ATTRIBUTE_LOCAL_L1_CACHE_SUPPORTED] = 1;
    a[CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR] = shared_per_sm;
    a[CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR] = regs_per_sm;
    a[CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY] = 1;
    a[CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD] = 0;
    a[CU_DEVICE_ATTRIBUTE_HOST_NATIVE_ATOMIC_SUPPORTED] = 0;
    a[CU_DEVICE_ATTRIBUTE_SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO] = 2;
    a[CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS] = 0;
    a[CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS] = 1;
    a[CU_DEVICE_ATTRIBUTE_COMPUTE_PREEMPTION_SUPPORTED] = 1;
    a[CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM] = 1;
    a[CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH] = 1;
    a[CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN] = shared_per_block_optin;
    a[CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES] = 0;
    a[CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED] = 1;
    a[CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES] = 0;
    a[CU_DEVICE_ATTRIBUTE_DIRECT_MANAGED_MEM_ACCESS_FROM_HOST] = 0;
    a[CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED] = 1;
    a[CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED] = 1;
    a[CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR] = max_blocks_per_sm;
    a[CU_DEVICE_ATTRIBUTE_GENERIC_COMPRESSION_SUPPORTED] = 0;
    a[CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE] = 39321600;
    a[CU_DEVICE_ATTRIBUTE_MAX_ACCESS_POLICY_WINDOW_SIZE] = static_cast<int>(max_access_policy_window);
    a[CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED] = 1;
    a[CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK] = reserved_shared_per_block;
    a[CU_DEVICE_ATTRIBUTE_SPARSE_CUDA_ARRAY_SUPPORTED] = 1;
    a[CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED] = 1;
    a[CU_DEVICE_ATTRIBUTE_TIMELINE_SEMAPHORE_INTEROP_SUPPORTED] = 1;
    a[CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED] = 1;
    a[CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED] = 1;
    a[CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS] = CU_FLUSH_GPU_DIRECT_RDMA_WRITES_OPTION_HOST;
    a[CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING] = CU_GPU_DIRECT_RDMA_WRITES_ORDERING_OWNER;
    a[CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES] = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    a[CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH] = 1;
    a[CU_DEVICE_ATTRIBUTE_DEFERRED_MAPPING_CUDA_ARRAY_SUPPORTED] = 1;
    a[CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS] = 1;
    a[CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR] = 1;
    a[CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED] = 1;
    a[CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED] = 1;
    a[CU_DEVICE_ATTRIBUTE_MEM_SYNC_DOMAIN_COUNT] = 4;
    a[CU_DEVICE_ATTRIBUTE_TENSOR_MAP_ACCESS_SUPPORTED] = 1;
    a[CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED] = 0;
    a[CU_DEVICE_ATTRIBUTE_UNIFIED_FUNCTION_POINTERS] = 0;
    a[CU_DEVICE_ATTRIBUTE_NUMA_CONFIG] = CU_DEVICE_NUMA_CONFIG_NONE;
    a[CU_DEVICE_ATTRIBUTE_NUMA_ID] = -1;
    a[CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED] = 0;
    a[CU_DEVICE_ATTRIBUTE_MPS_ENABLED] = 0;
    a[CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID] = -1;
    a[CU_DEVICE_ATTRIBUTE_GPU_PCI_DEVICE_ID] = static_cast<int>(0x233010deu);  // device 0x2330, vendor 0x10de
    a[CU_DEVICE_ATTRIBUTE_GPU_PCI_SUBSYSTEM_ID] = static_cast<int>(0x16c110deu);
    return a;
}
constexpr std::array<int, attribute_table_size> attribute_table = make_attributes();

int attribute(CUdevice dev, int attr) {
    switch (attr) {
        case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID:
            return pci_bus_base + dev;
        case CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD_GROUP_ID:
            return dev;
        default:
            return attribute_table[static_cast<size_t>(attr)];
    }
}

CUuuid device_uuid(CUdevice dev) {
    // Deterministic per ordinal, and recognisably not a real GPU's. VCUDA_SOFT_HOST_ID (0-255) tells apart
    // the GPUs of several software-driver servers in one test (the manager keys GPUs by UUID).
    static constexpr char prefix[] = "vcuda-soft-gp";
    CUuuid u{};
    std::memcpy(u.bytes, prefix, sizeof(prefix) - 1);
    u.bytes[14] = static_cast<char>(env_size("VCUDA_SOFT_HOST_ID", 0) & 0xff);
    u.bytes[15] = static_cast<char>(dev);
    return u;
}

struct error_text {
    CUresult code;
    const char* name;
    const char* text;
};
#define VCUDA_SOFT_ERR(code, text) \
    { code, #code, text }
constexpr error_text error_table[] = {
    VCUDA_SOFT_ERR(CUDA_SUCCESS, "no error"),
    VCUDA_SOFT_ERR(CUDA_ERROR_INVALID_VALUE, "invalid argument"),
    VCUDA_SOFT_ERR(CUDA_ERROR_OUT_OF_MEMORY, "out of memory"),
    VCUDA_SOFT_ERR(CUDA_ERROR_NOT_INITIALIZED, "initialization error"),
    VCUDA_SOFT_ERR(CUDA_ERROR_DEINITIALIZED, "driver shutting down"),
    VCUDA_SOFT_ERR(CUDA_ERROR_PROFILER_DISABLED, "profiler disabled while using external profiling tool"),
    VCUDA_SOFT_ERR(CUDA_ERROR_PROFILER_NOT_INITIALIZED,
                   "profiler not initialized: call cudaProfilerInitialize()"),
    VCUDA_SOFT_ERR(CUDA_ERROR_PROFILER_ALREADY_STARTED, "profiler already started"),
    VCUDA_SOFT_ERR(CUDA_ERROR_PROFILER_ALREADY_STOPPED, "profiler already stopped"),
    VCUDA_SOFT_ERR(CUDA_ERROR_STUB_LIBRARY, "CUDA driver is a stub library"),
    VCUDA_SOFT_ERR(CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER, "the API call requires a newer CUDA driver"),
    VCUDA_SOFT_ERR(CUDA_ERROR_DEVICE_UNAVAILABLE, "CUDA-capable device(s) is/are busy or unavailable"),
    VCUDA_SOFT_ERR(CUDA_ERROR_NO_DEVICE, "no CUDA-capable device is detected"),
    VCUDA_SOFT_ERR(CUDA_ERROR_INVALID_DEVICE, "invalid device ordinal"),
    VCUDA_SOFT_ERR(CUDA_ERROR_DEVICE_NOT_LICENSED, "device doesn't have valid Grid license"),
    VCUDA_SOFT_ERR(CUDA_ERROR_INVALID_IMAGE, "device kernel image is invalid"),
    VCUDA_SOFT_ERR(CUDA_ERROR_INVALID_CONTEXT, "invalid device context"),
    VCUDA_SOFT_ERR(CUDA_ERROR_CONTEXT_ALREADY_CURRENT, "context already current"),
    VCUDA_SOFT_ERR(CUDA_ERROR_MAP_FAILED, "mapping of buffer object failed"),
    VCUDA_SOFT_ERR(CUDA_ERROR_UNMAP_FAILED, "unmapping of buffer object failed"),
    VCUDA_SOFT_ERR(CUDA_ERROR_ARRAY_IS_MAPPED, "array is mapped"),
    VCUDA_SOFT_ERR(CUDA_ERROR_ALREADY_MAPPED, "resource already mapped"),
    VCUDA_SOFT_ERR(CUDA_ERROR_NO_BINARY_FOR_GPU, "no kernel image is available for execution on the device"),
    VCUDA_SOFT_ERR(CUDA_ERROR_ALREADY_ACQUIRED, "resource already acquired"),
    VCUDA_SOFT_ERR(CUDA_ERROR_NOT_MAPPED, "resource not mapped"),
    VCUDA_SOFT_ERR(CUDA_ERROR_NOT_MAPPED_AS_ARRAY, "resource not mapped as array"),
    VCUDA_SOFT_ERR(CUDA_ERROR_NOT_MAPPED_AS_POINTER, "resource not mapped as pointer"),
    VCUDA_SOFT_ERR(CUDA_ERROR_ECC_UNCORRECTABLE, "uncorrectable ECC error encountered"),
    VCUDA_SOFT_ERR(CUDA_ERROR_UNSUPPORTED_LIMIT, "limit is not supported on this architecture"),
    VCUDA_SOFT_ERR(CUDA_ERROR_CONTEXT_ALREADY_IN_USE,
                   "exclusive-thread device already in use by a different thread"),
    VCUDA_SOFT_ERR(CUDA_ERROR_PEER_ACCESS_UNSUPPORTED,
                   "peer access is not supported between these two devices"),
    VCUDA_SOFT_ERR(CUDA_ERROR_INVALID_PTX, "a PTX JIT compilation failed"),
    VCUDA_SOFT_ERR(CUDA_ERROR_INVALID_GRAPHICS_CONTEXT, "invalid OpenGL or DirectX context"),
    VCUDA_SOFT_ERR(CUDA_ERROR_NVLINK_UNCORRECTABLE,
                   "uncorrectable NVLink error detected during the execution"),
    VCUDA_SOFT_ERR(CUDA_ERROR_JIT_COMPILER_NOT_FOUND, "PTX JIT compiler library not found"),
    VCUDA_SOFT_ERR(CUDA_ERROR_UNSUPPORTED_PTX_VERSION,
                   "the provided PTX was compiled with an unsupported toolchain."),
    VCUDA_SOFT_ERR(CUDA_ERROR_JIT_COMPILATION_DISABLED, "PTX JIT compilation was disabled"),
    VCUDA_SOFT_ERR(CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY, "the provided execution affinity is not supported"),
    VCUDA_SOFT_ERR(CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC,
                   "the provided PTX contains unsupported call to cudaDeviceSynchronize"),
    VCUDA_SOFT_ERR(CUDA_ERROR_CONTAINED, "an exception occurred on the device that is now contained"),
    VCUDA_SOFT_ERR(CUDA_ERROR_INVALID_SOURCE, "device kernel image is invalid"),
    VCUDA_SOFT_ERR(CUDA_ERROR_FILE_NOT_FOUND, "file not found"),
    VCUDA_SOFT_ERR(CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND, "shared object symbol not found"),
    VCUDA_SOFT_ERR(CUDA_ERROR_SHARED_OBJECT_INIT_FAILED, "shared object initialization failed"),
    VCUDA_SOFT_ERR(CUDA_ERROR_OPERATING_SYSTEM, "OS call failed or operation not supported on this OS"),
    VCUDA_SOFT_ERR(CUDA_ERROR_INVALID_HANDLE, "invalid resource handle"),
    VCUDA_SOFT_ERR(CUDA_ERROR_ILLEGAL_STATE, "the operation cannot be performed in the present state"),
    VCUDA_SOFT_ERR(CUDA_ERROR_LOSSY_QUERY, "attempted introspection would be semantically lossy"),
    VCUDA_SOFT_ERR(CUDA_ERROR_NOT_FOUND, "named symbol not found"),
    VCUDA_SOFT_ERR(CUDA_ERROR_NOT_READY, "device not ready"),
    VCUDA_SOFT_ERR(CUDA_ERROR_ILLEGAL_ADDRESS, "an illegal memory access was encountered"),
    VCUDA_SOFT_ERR(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "too many resources requested for launch"),
    VCUDA_SOFT_ERR(CUDA_ERROR_LAUNCH_TIMEOUT, "the launch timed out and was terminated"),
    VCUDA_SOFT_ERR(CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING, "launch uses incompatible texturing mode"),
    VCUDA_SOFT_ERR(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, "peer access is already enabled"),
    VCUDA_SOFT_ERR(CUDA_ERROR_PEER_ACCESS_NOT_ENABLED, "peer access has not been enabled"),
    VCUDA_SOFT_ERR(CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE, "cannot set while device is active in this process"),
    VCUDA_SOFT_ERR(CUDA_ERROR_CONTEXT_IS_DESTROYED, "context is destroyed"),
    VCUDA_SOFT_ERR(CUDA_ERROR_ASSERT, "device-side assert triggered"),
    VCUDA_SOFT_ERR(CUDA_ERROR_TOO_MANY_PEERS, "peer mapping resources exhausted"),
    VCUDA_SOFT_ERR(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,
                   "part or all of the requested memory range is already mapped"),
    VCUDA_SOFT_ERR(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED,
                   "pointer does not correspond to a registered memory region"),
    VCUDA_SOFT_ERR(CUDA_ERROR_HARDWARE_STACK_ERROR, "hardware stack error"),
    VCUDA_SOFT_ERR(CUDA_ERROR_ILLEGAL_INSTRUCTION, "an illegal instruction was encountered"),
    VCUDA_SOFT_ERR(CUDA_ERROR_MISALIGNED_ADDRESS, "misaligned address"),
    VCUDA_SOFT_ERR(CUDA_ERROR_INVALID_ADDRESS_SPACE,
                   "operation not supported on global/shared address space"),
    VCUDA_SOFT_ERR(CUDA_ERROR_INVALID_PC, "invalid program counter"),
    VCUDA_SOFT_ERR(CUDA_ERROR_LAUNCH_FAILED, "unspecified launch failure"),
    VCUDA_SOFT_ERR(CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE, "too many blocks in cooperative launch"),
    VCUDA_SOFT_ERR(CUDA_ERROR_TENSOR_MEMORY_LEAK, "tensor memory not completely freed"),
    VCUDA_SOFT_ERR(CUDA_ERROR_NOT_PERMITTED, "operation not permitted"),
    VCUDA_SOFT_ERR(CUDA_ERROR_NOT_SUPPORTED, "operation not supported"),
    VCUDA_SOFT_ERR(CUDA_ERROR_SYSTEM_NOT_READY, "system not yet initialized"),
    VCUDA_SOFT_ERR(CUDA_ERROR_SYSTEM_DRIVER_MISMATCH,
                   "system has unsupported display driver / cuda driver combination"),
    VCUDA_SOFT_ERR(CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE,
                   "forward compatibility was attempted on non supported HW"),
    VCUDA_SOFT_ERR(CUDA_ERROR_MPS_CONNECTION_FAILED,
                   "MPS client failed to connect to the MPS control daemon or the MPS server"),
    VCUDA_SOFT_ERR(CUDA_ERROR_MPS_RPC_FAILURE,
                   "the remote procedural call between the MPS server and the MPS client failed"),
    VCUDA_SOFT_ERR(CUDA_ERROR_MPS_SERVER_NOT_READY,
                   "MPS server is not ready to accept new MPS client requests"),
    VCUDA_SOFT_ERR(CUDA_ERROR_MPS_MAX_CLIENTS_REACHED,
                   "the hardware resources required to create MPS client have been exhausted"),
    VCUDA_SOFT_ERR(CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED,
                   "the hardware resources required to support device connections have been exhausted"),
    VCUDA_SOFT_ERR(CUDA_ERROR_MPS_CLIENT_TERMINATED, "the MPS client has been terminated by the server"),
    VCUDA_SOFT_ERR(
        CUDA_ERROR_CDP_NOT_SUPPORTED,
        "the module is using CUDA Dynamic Parallelism, but the current configuration does not support it"),
    VCUDA_SOFT_ERR(CUDA_ERROR_CDP_VERSION_MISMATCH,
                   "the module contains an unsupported interaction between different versions of CUDA "
                   "Dynamic Parallelism"),
    VCUDA_SOFT_ERR(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "operation not permitted when stream is capturing"),
    VCUDA_SOFT_ERR(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
                   "operation failed due to a previous error during capture"),
    VCUDA_SOFT_ERR(CUDA_ERROR_STREAM_CAPTURE_MERGE,
                   "operation would result in a merge of separate capture sequences"),
    VCUDA_SOFT_ERR(CUDA_ERROR_STREAM_CAPTURE_UNMATCHED,
                   "capture was not ended in the same stream as it began"),
    VCUDA_SOFT_ERR(CUDA_ERROR_STREAM_CAPTURE_UNJOINED, "capturing stream has unjoined work"),
    VCUDA_SOFT_ERR(CUDA_ERROR_STREAM_CAPTURE_ISOLATION,
                   "dependency created on uncaptured work in another stream"),
    VCUDA_SOFT_ERR(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,
                   "operation would make the legacy stream depend on a capturing blocking stream"),
    VCUDA_SOFT_ERR(CUDA_ERROR_CAPTURED_EVENT,
                   "operation not permitted on an event last recorded in a capturing stream"),
    VCUDA_SOFT_ERR(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD,
                   "attempt to terminate a thread-local capture sequence from another thread"),
    VCUDA_SOFT_ERR(CUDA_ERROR_TIMEOUT, "wait operation timed out"),
    VCUDA_SOFT_ERR(CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE,
                   "the graph update was not performed because it included changes which violated "
                   "constraints specific to instantiated graph update"),
    VCUDA_SOFT_ERR(CUDA_ERROR_EXTERNAL_DEVICE,
                   "an async error has occured in external entity outside of CUDA"),
    VCUDA_SOFT_ERR(CUDA_ERROR_INVALID_CLUSTER_SIZE,
                   "a kernel launch error has occurred due to cluster misconfiguration"),
    VCUDA_SOFT_ERR(CUDA_ERROR_FUNCTION_NOT_LOADED,
                   "the function handle is not loaded when calling an API that requires a loaded function"),
    VCUDA_SOFT_ERR(CUDA_ERROR_INVALID_RESOURCE_TYPE,
                   "one or more resources passed in are not valid resource types for the operation"),
    VCUDA_SOFT_ERR(CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION,
                   "one or more resources are insufficient or non-applicable for the operation"),
    VCUDA_SOFT_ERR(CUDA_ERROR_KEY_ROTATION, "an error happened during the key rotation sequence"),
    VCUDA_SOFT_ERR(CUDA_ERROR_UNKNOWN, "unknown error"),
};
#undef VCUDA_SOFT_ERR

const error_text* find_error(CUresult e) {
    for (const auto& t : error_table)
        if (t.code == e) return &t;
    return nullptr;
}

// Device queries: cuInit must have run and the ordinal must exist.
template <class F>
CUresult device_entry(CUdevice dev, F&& f) noexcept {
    return entry([&](state& s) -> CUresult {
        if (!s.valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
        return f(s);
    });
}

}  // namespace

state& global_state() {
    static state* s = new state();  // never destroyed: driver calls may come from threads during exit
    return *s;
}

}  // namespace vcuda::soft

using namespace vcuda::soft;

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuInit(unsigned int Flags) {
    return guarded([&]() -> CUresult {
        if (Flags != 0) return CUDA_ERROR_INVALID_VALUE;
        state& s = global_state();
        std::lock_guard lk(s.mu);
        if (s.initialized) return CUDA_SUCCESS;
        size_t count = env_size("VCUDA_SOFT_DEVICES", 1);
        if (count > static_cast<size_t>(max_devices)) count = max_devices;
        if (count == 0) return CUDA_ERROR_NO_DEVICE;
        size_t memory = env_size("VCUDA_SOFT_MEMORY", default_memory);
        s.devices.assign(count, device_info{});
        for (auto& d : s.devices) d.total_memory = memory;
        create_primary_contexts(s);
        s.initialized = true;
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuDriverGetVersion(int* driverVersion) {
    if (driverVersion == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *driverVersion = driver_version;
    return CUDA_SUCCESS;
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuDeviceGet(CUdevice* device, int ordinal) {
    return entry([&](state& s) -> CUresult {
        if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
        if (!s.valid_device(ordinal)) return CUDA_ERROR_INVALID_DEVICE;
        *device = ordinal;
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuDeviceGetCount(int* count) {
    return entry([&](state& s) -> CUresult {
        if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
        *count = static_cast<int>(s.devices.size());
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuDeviceGetName(char* name, int len, CUdevice dev) {
    return device_entry(dev, [&](state&) -> CUresult {
        if (name == nullptr || len <= 0) return CUDA_ERROR_INVALID_VALUE;
        std::snprintf(name, static_cast<size_t>(len), "%s", device_name);
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuDeviceGetUuid_v2(CUuuid* uuid, CUdevice dev) {
    return device_entry(dev, [&](state&) -> CUresult {
        if (uuid == nullptr) return CUDA_ERROR_INVALID_VALUE;
        *uuid = device_uuid(dev);
        return CUDA_SUCCESS;
    });
}

// cuDeviceGetUuid (CUDA 9.2) has the same signature; cuda.h maps the name to _v2, so declare it here.
#undef cuDeviceGetUuid
VCUDA_SOFT_EXPORT CUresult CUDAAPI cuDeviceGetUuid(CUuuid* uuid, CUdevice dev);
CUresult CUDAAPI cuDeviceGetUuid(CUuuid* uuid, CUdevice dev) { return cuDeviceGetUuid_v2(uuid, dev); }

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev) {
    return device_entry(dev, [&](state& s) -> CUresult {
        if (bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
        *bytes = s.devices[static_cast<size_t>(dev)].total_memory;
        return CUDA_SUCCESS;
    });
}

// The software GPU's own limit: 2^29 bytes over the element's size, at most 2^28 elements.
VCUDA_SOFT_EXPORT CUresult CUDAAPI cuDeviceGetTexture1DLinearMaxWidth(size_t* width, CUarray_format format,
                                                                      unsigned channels, CUdevice dev) {
    return device_entry(dev, [&](state&) -> CUresult {
        size_t bytes = 0;
        switch (format) {
            case CU_AD_FORMAT_UNSIGNED_INT8:
            case CU_AD_FORMAT_SIGNED_INT8:
                bytes = 1;
                break;
            case CU_AD_FORMAT_UNSIGNED_INT16:
            case CU_AD_FORMAT_SIGNED_INT16:
            case CU_AD_FORMAT_HALF:
                bytes = 2;
                break;
            case CU_AD_FORMAT_UNSIGNED_INT32:
            case CU_AD_FORMAT_SIGNED_INT32:
            case CU_AD_FORMAT_FLOAT:
                bytes = 4;
                break;
            default:
                return CUDA_ERROR_INVALID_VALUE;
        }
        if (!width || (channels != 1 && channels != 2 && channels != 4)) return CUDA_ERROR_INVALID_VALUE;
        *width = std::min<size_t>(size_t{1} << 28, (size_t{1} << 29) / (bytes * channels));
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuDeviceGetAttribute(int* pi, CUdevice_attribute attrib, CUdevice dev) {
    return device_entry(dev, [&](state&) -> CUresult {
        if (pi == nullptr) return CUDA_ERROR_INVALID_VALUE;
        int a = static_cast<int>(attrib);
        if (a <= 0 || a >= CU_DEVICE_ATTRIBUTE_MAX) return CUDA_ERROR_INVALID_VALUE;
        *pi = attribute(dev, a);
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuDeviceComputeCapability(int* major, int* minor, CUdevice dev) {
    return device_entry(dev, [&](state&) -> CUresult {
        if (major == nullptr || minor == nullptr) return CUDA_ERROR_INVALID_VALUE;
        *major = 9;
        *minor = 0;
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuDeviceGetPCIBusId(char* pciBusId, int len, CUdevice dev) {
    return device_entry(dev, [&](state&) -> CUresult {
        if (pciBusId == nullptr || len <= 0) return CUDA_ERROR_INVALID_VALUE;
        std::snprintf(pciBusId, static_cast<size_t>(len), "%04x:%02x:%02x.0",
                      attribute(dev, CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID),
                      attribute(dev, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID),
                      attribute(dev, CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID));
        return CUDA_SUCCESS;
    });
}

// Accepts domain:bus:device.function, domain:bus:device and bus:device.function (hexadecimal).
VCUDA_SOFT_EXPORT CUresult CUDAAPI cuDeviceGetByPCIBusId(CUdevice* dev, const char* pciBusId) {
    return entry([&](state& s) -> CUresult {
        if (dev == nullptr || pciBusId == nullptr) return CUDA_ERROR_INVALID_VALUE;
        unsigned domain = 0, bus = 0, device = 0, function = 0;
        char tail = 0;
        if (std::sscanf(pciBusId, "%x:%x:%x.%x%c", &domain, &bus, &device, &function, &tail) == 4 ||
            std::sscanf(pciBusId, "%x:%x:%x%c", &domain, &bus, &device, &tail) == 3) {
        } else if (std::sscanf(pciBusId, "%x:%x.%x%c", &bus, &device, &function, &tail) == 3) {
            domain = 0;
        } else {
            return CUDA_ERROR_INVALID_VALUE;
        }
        for (size_t i = 0; i < s.devices.size(); ++i) {
            CUdevice d = static_cast<CUdevice>(i);
            if (domain == static_cast<unsigned>(attribute(d, CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID)) &&
                bus == static_cast<unsigned>(attribute(d, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID)) &&
                device == static_cast<unsigned>(attribute(d, CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID)) &&
                function == 0) {
                *dev = d;
                return CUDA_SUCCESS;
            }
        }
        return CUDA_ERROR_INVALID_DEVICE;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuDeviceCanAccessPeer(int* canAccessPeer, CUdevice dev, CUdevice peerDev) {
    return entry([&](state& s) -> CUresult {
        if (canAccessPeer == nullptr) return CUDA_ERROR_INVALID_VALUE;
        if (!s.valid_device(dev) || !s.valid_device(peerDev)) return CUDA_ERROR_INVALID_DEVICE;
        *canAccessPeer = dev != peerDev ? 1 : 0;
        return CUDA_SUCCESS;
    });
}

namespace {

// The software device's native atomics: none with its host (CU_DEVICE_ATTRIBUTE_HOST_NATIVE_ATOMIC_SUPPORTED
// is 0), with a peer (whose native atomic attribute is 1) integer ones signed and unsigned on 32 and 64 bits,
// float ones on 32 and 64 bits.
CUresult soft_atomic_capabilities(unsigned* caps, const CUatomicOperation* ops, unsigned count, bool native) {
    if (caps == nullptr || ops == nullptr || count == 0) return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < count; ++i) {
        if (ops[i] < 0 || ops[i] >= CU_ATOMIC_OPERATION_MAX) return CUDA_ERROR_INVALID_VALUE;
        const unsigned sizes = CU_ATOMIC_CAPABILITY_SCALAR_32 | CU_ATOMIC_CAPABILITY_SCALAR_64;
        caps[i] = !native ? 0u
                  : ops[i] >= CU_ATOMIC_OPERATION_FLOAT_ADD
                      ? sizes
                      : sizes | CU_ATOMIC_CAPABILITY_SIGNED | CU_ATOMIC_CAPABILITY_UNSIGNED;
    }
    return CUDA_SUCCESS;
}

}  // namespace

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuDeviceGetHostAtomicCapabilities(unsigned int* capabilities,
                                                                     const CUatomicOperation* operations,
                                                                     unsigned int count, CUdevice dev) {
    return entry([&](state& s) -> CUresult {
        if (!s.valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
        return soft_atomic_capabilities(capabilities, operations, count, false);
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuDeviceGetP2PAtomicCapabilities(unsigned int* capabilities,
                                                                    const CUatomicOperation* operations,
                                                                    unsigned int count, CUdevice srcDevice,
                                                                    CUdevice dstDevice) {
    return entry([&](state& s) -> CUresult {
        if (!s.valid_device(srcDevice) || !s.valid_device(dstDevice) || srcDevice == dstDevice)
            return CUDA_ERROR_INVALID_DEVICE;
        return soft_atomic_capabilities(capabilities, operations, count, true);
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuDeviceGetP2PAttribute(int* value, CUdevice_P2PAttribute attrib,
                                                           CUdevice srcDevice, CUdevice dstDevice) {
    return entry([&](state& s) -> CUresult {
        if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
        if (!s.valid_device(srcDevice) || !s.valid_device(dstDevice) || srcDevice == dstDevice)
            return CUDA_ERROR_INVALID_DEVICE;
        switch (attrib) {
            case CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK:
                *value = 0;
                break;
            case CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED:
                *value = 1;
                break;
            case CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED:
                *value = 1;
                break;
            case CU_DEVICE_P2P_ATTRIBUTE_CUDA_ARRAY_ACCESS_SUPPORTED:
                *value = 1;
                break;
            case CU_DEVICE_P2P_ATTRIBUTE_ONLY_PARTIAL_NATIVE_ATOMIC_SUPPORTED:
                *value = 0;
                break;
            default:
                return CUDA_ERROR_INVALID_VALUE;
        }
        return CUDA_SUCCESS;
    });
}

// Like the real driver, these answer before cuInit too.
VCUDA_SOFT_EXPORT CUresult CUDAAPI cuGetErrorName(CUresult error, const char** pStr) {
    if (pStr == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const error_text* t = find_error(error);
    *pStr = t != nullptr ? t->name : nullptr;
    return t != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuGetErrorString(CUresult error, const char** pStr) {
    if (pStr == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const error_text* t = find_error(error);
    *pStr = t != nullptr ? t->text : nullptr;
    return t != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
