// Stream queries answered from the mirror, capture-mode bookkeeping, and occupancy helpers built on the
// forwarded per-block-size query.
#include "client/plain_call.hpp"
#include "client/state.hpp"
#include "client/trace.hpp"

#define VCUDA_API extern "C" __attribute__((visibility("default"))) CUresult

using namespace vcuda;
using namespace vcuda::client;

namespace {
bool stream_info(CUstream s, handle_info& info) {
    uint64_t id = reinterpret_cast<uint64_t>(s);
    if (id == stream_null || id == stream_legacy || id == stream_per_thread) {
        info.ctx = current_context();
        info.device = current_device();
        return info.ctx != 0;
    }
    return state::get().lookup(id, info) && info.kind == handle_kind::stream;
}
}  // namespace

VCUDA_API cuStreamGetCtx(CUstream s, CUcontext* pctx) noexcept {
    VCUDA_TRACE_HOOK(cuStreamGetCtx, s, pctx);
    VCUDA_REQUIRE_INIT();
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    handle_info info;
    if (!stream_info(s, info)) return CUDA_ERROR_INVALID_HANDLE;
    *pctx = reinterpret_cast<CUcontext>(info.ctx);
    return CUDA_SUCCESS;
}

VCUDA_API cuStreamGetDevice(CUstream s, CUdevice* dev) noexcept {
    VCUDA_TRACE_HOOK(cuStreamGetDevice, s, dev);
    VCUDA_REQUIRE_INIT();
    if (!dev) return CUDA_ERROR_INVALID_VALUE;
    handle_info info;
    if (!stream_info(s, info)) return CUDA_ERROR_INVALID_HANDLE;
    *dev = info.device;
    return CUDA_SUCCESS;
}

VCUDA_API cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus* status) noexcept {
    VCUDA_TRACE_HOOK(cuStreamIsCapturing, s, status);
    VCUDA_REQUIRE_INIT();
    if (!status) return CUDA_ERROR_INVALID_VALUE;
    handle_info info;
    if (!stream_info(s, info)) return CUDA_ERROR_INVALID_HANDLE;
    *status = CU_STREAM_CAPTURE_STATUS_NONE;  // graph capture is not forwarded yet
    return CUDA_SUCCESS;
}

VCUDA_API cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode* mode) noexcept {
    VCUDA_TRACE_HOOK(cuThreadExchangeStreamCaptureMode, mode);
    if (!mode) return CUDA_ERROR_INVALID_VALUE;
    thread_local CUstreamCaptureMode current = CU_STREAM_CAPTURE_MODE_GLOBAL;
    std::swap(current, *mode);
    return CUDA_SUCCESS;
}

namespace {
CUresult max_potential_block_size(int* min_grid, int* block_size, CUfunction f, CUoccupancyB2DSize smem_of,
                                  size_t smem, int limit, unsigned flags) {
    VCUDA_REQUIRE_INIT();
    if (!min_grid || !block_size) return CUDA_ERROR_INVALID_VALUE;
    int device = current_device();
    if (device < 0) return CUDA_ERROR_INVALID_CONTEXT;
    auto& st = state::get();
    int max_threads = 0;
    if (CUresult rc = cuFuncGetAttribute(&max_threads, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, f); rc != CUDA_SUCCESS) return rc;
    int warp = st.attribute(device, CU_DEVICE_ATTRIBUTE_WARP_SIZE);
    int sms = st.attribute(device, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
    if (limit > 0 && limit < max_threads) max_threads = limit;
    int best_threads = 0, best_block = 0;
    for (int b = max_threads - max_threads % warp; b > 0; b -= warp) {
        size_t s = smem_of ? smem_of(b) : smem;
        int blocks = 0;
        if (CUresult rc = cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(&blocks, f, b, s, flags); rc != CUDA_SUCCESS)
            return rc;
        if (blocks * b > best_threads) {
            best_threads = blocks * b;
            best_block = b;
        }
    }
    *block_size = best_block;
    *min_grid = best_block ? (best_threads / best_block) * sms : 0;
    return CUDA_SUCCESS;
}
}  // namespace

VCUDA_API cuOccupancyMaxPotentialBlockSize(int* min_grid, int* block, CUfunction f, CUoccupancyB2DSize smem_of, size_t smem,
                                           int limit) noexcept {
    VCUDA_TRACE_HOOK(cuOccupancyMaxPotentialBlockSize, min_grid, block, f, smem_of, smem, limit);
    return max_potential_block_size(min_grid, block, f, smem_of, smem, limit, 0);
}

VCUDA_API cuOccupancyMaxPotentialBlockSizeWithFlags(int* min_grid, int* block, CUfunction f, CUoccupancyB2DSize smem_of,
                                                    size_t smem, int limit, unsigned int flags) noexcept {
    VCUDA_TRACE_HOOK(cuOccupancyMaxPotentialBlockSizeWithFlags, min_grid, block, f, smem_of, smem, limit,
                     flags);
    return max_potential_block_size(min_grid, block, f, smem_of, smem, limit, flags);
}
