// The software test driver: copies and memsets. Every call is checked under the lock like the real driver
// checks it at call time (device ranges must lie in recorded memory, pitches must hold a row), then runs at
// once in the calling thread with the lock released. The Async forms check their stream and are just as
// synchronous: when they return, the bytes are there (on a capturing stream they are recorded into the
// capture's graph instead). A CUDA array end (soft_array.cpp) is its memory, checked against its extent.
#include <algorithm>
#include <cstring>

#include "soft_state.hpp"

namespace vcuda::soft {
namespace {

enum class side { host, device, unified, array };

// Resolves one end of a copy: host memory is taken as given (non-null), device memory must be recorded.
CUresult resolve(state& s, side k, uintptr_t p, size_t n, bool write) {
    if (k == side::unified) k = find_range(s, p) != nullptr ? side::device : side::host;
    if (k == side::host || k == side::array) return p != 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    return check_device_range(s, p, n, write);
}

CUresult copy_linear(state& s, work& w, uintptr_t dst, side dk, uintptr_t src, side sk, size_t n) {
    if (n == 0) return CUDA_SUCCESS;
    if (CUresult r = resolve(s, dk, dst, n, true); r != CUDA_SUCCESS) return r;
    if (CUresult r = resolve(s, sk, src, n, false); r != CUDA_SUCCESS) return r;
    w = [dst, src, n]() -> CUresult {
        std::memmove(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), n);
        return CUDA_SUCCESS;
    };
    return CUDA_SUCCESS;
}

// Synchronous calls need a current context; asynchronous ones take it from their stream.
CUresult sync_context(state& s) {
    context_obj* c = nullptr;
    return require_context(s, c);
}

// One end of a 2D/3D copy.
struct copy_end {
    side k = side::host;
    uintptr_t base = 0;
    size_t x = 0, y = 0, z = 0, pitch = 0, height = 0;
    uintptr_t start = 0;  // first byte copied
    size_t depth = 0;     // arrays: their slices
};

CUresult end_from(state& s, CUmemorytype type, const void* host, CUdeviceptr device, CUarray array,
                  copy_end& e) {
    switch (type) {
        case CU_MEMORYTYPE_HOST:
            e.k = side::host;
            e.base = reinterpret_cast<uintptr_t>(host);
            return CUDA_SUCCESS;
        case CU_MEMORYTYPE_DEVICE:
            e.k = side::device;
            e.base = static_cast<uintptr_t>(device);
            return CUDA_SUCCESS;
        case CU_MEMORYTYPE_UNIFIED:
            e.k = side::unified;
            e.base = static_cast<uintptr_t>(device);
            return CUDA_SUCCESS;
        case CU_MEMORYTYPE_ARRAY: {
            auto* a = s.find<array_obj>(array);
            if (a == nullptr) return CUDA_ERROR_INVALID_HANDLE;
            e.k = side::array;
            e.base = reinterpret_cast<uintptr_t>(a->data.data());
            e.depth = a->desc.Depth ? a->desc.Depth : 1;
            return CUDA_SUCCESS;
        }
        default:
            return CUDA_ERROR_INVALID_VALUE;
    }
}

// Checks one end of a width x height x depth copy and computes where it starts.
CUresult check_end(state& s, copy_end& e, size_t width, size_t height, size_t depth, bool write) {
    if (e.k == side::array) {  // the box must lie inside the array's width, height and depth
        size_t xe = 0, ye = 0, ze = 0;
        if (__builtin_add_overflow(e.x, width, &xe) || xe > e.pitch ||
            __builtin_add_overflow(e.y, height, &ye) || ye > e.height ||
            __builtin_add_overflow(e.z, depth, &ze) || ze > e.depth)
            return CUDA_ERROR_INVALID_VALUE;
    }
    const bool rows = height > 1 || depth > 1;
    size_t row_end = 0;
    if (__builtin_add_overflow(e.x, width, &row_end)) return CUDA_ERROR_INVALID_VALUE;
    if (rows && e.pitch < row_end) return CUDA_ERROR_INVALID_VALUE;
    size_t slice = e.height;
    if (depth > 1) {
        size_t rows_end = 0;
        if (__builtin_add_overflow(e.y, height, &rows_end) || slice < rows_end)
            return CUDA_ERROR_INVALID_VALUE;
    }
    // start = base + (z * slice + y) * pitch + x; extent = ((depth-1) * slice + (height-1)) * pitch + width.
    size_t first_row = 0, offset = 0, last_row = 0, extent = 0;
    if (__builtin_mul_overflow(e.z, slice, &first_row) ||
        __builtin_add_overflow(first_row, e.y, &first_row) ||
        __builtin_mul_overflow(first_row, e.pitch, &offset) || __builtin_add_overflow(offset, e.x, &offset) ||
        __builtin_add_overflow(e.base, offset, &e.start))
        return CUDA_ERROR_INVALID_VALUE;
    if (__builtin_mul_overflow(depth - 1, slice, &last_row) ||
        __builtin_add_overflow(last_row, height - 1, &last_row) ||
        __builtin_mul_overflow(last_row, e.pitch, &extent) || __builtin_add_overflow(extent, width, &extent))
        return CUDA_ERROR_INVALID_VALUE;
    if (e.base == 0) return CUDA_ERROR_INVALID_VALUE;
    return resolve(s, e.k, e.start, extent, write);
}

// An array end's pitch and slice height are the array's own, whatever the descriptor says.
void array_layout(state& s, CUarray array, copy_end& e) {
    if (e.k != side::array) return;
    auto* a = s.find<array_obj>(array);
    e.pitch = a->row_bytes();
    e.height = a->rows();
}

CUresult copy_3d(state& s, work& w, copy_end src, copy_end dst, size_t width, size_t height, size_t depth) {
    if (width == 0 || height == 0 || depth == 0) return CUDA_SUCCESS;
    if (CUresult r = check_end(s, src, width, height, depth, false); r != CUDA_SUCCESS) return r;
    if (CUresult r = check_end(s, dst, width, height, depth, true); r != CUDA_SUCCESS) return r;
    w = [src, dst, width, height, depth]() -> CUresult {
        for (size_t z = 0; z < depth; ++z) {
            for (size_t y = 0; y < height; ++y) {
                auto* d = reinterpret_cast<char*>(dst.start + (z * dst.height + y) * dst.pitch);
                auto* from = reinterpret_cast<const char*>(src.start + (z * src.height + y) * src.pitch);
                std::memmove(d, from, width);
            }
        }
        return CUDA_SUCCESS;
    };
    return CUDA_SUCCESS;
}

CUresult copy_2d_desc(state& s, work& w, const CUDA_MEMCPY2D* p) {
    if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
    copy_end src, dst;
    if (CUresult r = end_from(s, p->srcMemoryType, p->srcHost, p->srcDevice, p->srcArray, src);
        r != CUDA_SUCCESS)
        return r;
    if (CUresult r = end_from(s, p->dstMemoryType, p->dstHost, p->dstDevice, p->dstArray, dst);
        r != CUDA_SUCCESS)
        return r;
    src.x = p->srcXInBytes;
    src.y = p->srcY;
    src.pitch = p->srcPitch;
    dst.x = p->dstXInBytes;
    dst.y = p->dstY;
    dst.pitch = p->dstPitch;
    array_layout(s, p->srcArray, src);
    array_layout(s, p->dstArray, dst);
    return copy_3d(s, w, src, dst, p->WidthInBytes, p->Height, 1);
}

// `recorded`: the memset goes into a graph (captured, or a memset node). The real driver takes any address
// then (cuDNN records placeholders and sets the real ones before the graph runs); one that is still no memory
// when the node runs fails there, with CUDA_ERROR_ILLEGAL_ADDRESS.
template <class T>
CUresult memset_2d(state& s, work& w, CUdeviceptr dst, size_t pitch, T value, size_t width, size_t height,
                   bool recorded = false) {
    constexpr size_t es = sizeof(T);
    uintptr_t base = static_cast<uintptr_t>(dst);
    if (base % es != 0) return CUDA_ERROR_INVALID_VALUE;
    if (width == 0 || height == 0) return CUDA_SUCCESS;
    size_t row = 0, extent = 0;
    if (__builtin_mul_overflow(width, es, &row)) return CUDA_ERROR_INVALID_VALUE;
    if (height > 1) {
        if (pitch < row || pitch % es != 0) return CUDA_ERROR_INVALID_VALUE;
        if (__builtin_mul_overflow(height - 1, pitch, &extent) ||
            __builtin_add_overflow(extent, row, &extent))
            return CUDA_ERROR_INVALID_VALUE;
    } else {
        extent = row;
    }
    if (CUresult r = check_device_range(s, base, extent, true); r != CUDA_SUCCESS) {
        if (!recorded) return r;
        w = [] { return CUDA_ERROR_ILLEGAL_ADDRESS; };
        return CUDA_SUCCESS;
    }
    w = [base, pitch, value, width, height]() -> CUresult {
        for (size_t y = 0; y < height; ++y) {
            T* p = reinterpret_cast<T*>(base + y * pitch);
            if constexpr (sizeof(T) == 1)
                std::memset(p, value, width);
            else
                std::fill_n(p, width, value);
        }
        return CUDA_SUCCESS;
    };
    return CUDA_SUCCESS;
}

template <class T>
CUresult memset_1d(state& s, work& w, CUdeviceptr dst, T value, size_t n, bool recorded = false) {
    return memset_2d<T>(s, w, dst, 0, value, n, 1, recorded);
}

}  // namespace

CUresult copy_3d_desc(state& s, work& w, const CUDA_MEMCPY3D* p) {
    if (p == nullptr || p->srcLOD != 0 || p->dstLOD != 0 || p->reserved0 != nullptr ||
        p->reserved1 != nullptr)
        return CUDA_ERROR_INVALID_VALUE;
    copy_end src, dst;
    if (CUresult r = end_from(s, p->srcMemoryType, p->srcHost, p->srcDevice, p->srcArray, src);
        r != CUDA_SUCCESS)
        return r;
    if (CUresult r = end_from(s, p->dstMemoryType, p->dstHost, p->dstDevice, p->dstArray, dst);
        r != CUDA_SUCCESS)
        return r;
    src.x = p->srcXInBytes;
    src.y = p->srcY;
    src.z = p->srcZ;
    src.pitch = p->srcPitch;
    src.height = p->srcHeight;
    dst.x = p->dstXInBytes;
    dst.y = p->dstY;
    dst.z = p->dstZ;
    dst.pitch = p->dstPitch;
    dst.height = p->dstHeight;
    array_layout(s, p->srcArray, src);
    array_layout(s, p->dstArray, dst);
    return copy_3d(s, w, src, dst, p->WidthInBytes, p->Height, p->Depth);
}

CUresult memset_node_work(state& s, const CUDA_MEMSET_NODE_PARAMS& p, work& w, bool recorded) {
    switch (p.elementSize) {
        case 1:
            return memset_2d<unsigned char>(s, w, p.dst, p.pitch, static_cast<unsigned char>(p.value),
                                            p.width, p.height, recorded);
        case 2:
            return memset_2d<unsigned short>(s, w, p.dst, p.pitch, static_cast<unsigned short>(p.value),
                                             p.width, p.height, recorded);
        case 4:
            return memset_2d<unsigned int>(s, w, p.dst, p.pitch, p.value, p.width, p.height, recorded);
        default:
            return CUDA_ERROR_INVALID_VALUE;
    }
}
}  // namespace vcuda::soft

using namespace vcuda::soft;

namespace {

uintptr_t addr(CUdeviceptr p) { return static_cast<uintptr_t>(p); }
uintptr_t addr(const void* p) { return reinterpret_cast<uintptr_t>(p); }

// A synchronous operation (a copy or a memset, `type` for the capture): needs a current context. It uses the
// legacy stream, off limits while a blocking stream captures.
template <class F>
CUresult sync_op(CUgraphNodeType type, F&& f) noexcept {
    return entry_then([&](state& s, work& w) -> CUresult {
        if (CUresult r = sync_context(s); r != CUDA_SUCCESS) return r;
        if (CUresult r = f(s, w); r != CUDA_SUCCESS) return r;
        return capture_or_run(s, CU_STREAM_LEGACY, w, type);
    });
}

// An asynchronous operation: its stream must be valid. On a capturing stream it is recorded, not run.
template <class F>
CUresult async_op(CUstream stream, CUgraphNodeType type, F&& f) noexcept {
    return entry_then([&](state& s, work& w) -> CUresult {
        if (CUresult r = check_stream(s, stream); r != CUDA_SUCCESS) return r;
        if (CUresult r = f(s, w); r != CUDA_SUCCESS) return r;
        return capture_or_run(s, stream, w, type);
    });
}

}  // namespace

// --- Linear copies.

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void* srcHost,
                                                   size_t ByteCount) {
    return sync_op(CU_GRAPH_NODE_TYPE_MEMCPY, [&](state& s, work& w) {
        return copy_linear(s, w, addr(dstDevice), side::device, addr(srcHost), side::host, ByteCount);
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuMemcpyDtoH_v2(void* dstHost, CUdeviceptr srcDevice, size_t ByteCount) {
    return sync_op(CU_GRAPH_NODE_TYPE_MEMCPY, [&](state& s, work& w) {
        return copy_linear(s, w, addr(dstHost), side::host, addr(srcDevice), side::device, ByteCount);
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuMemcpyDtoD_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice,
                                                   size_t ByteCount) {
    return sync_op(CU_GRAPH_NODE_TYPE_MEMCPY, [&](state& s, work& w) {
        return copy_linear(s, w, addr(dstDevice), side::device, addr(srcDevice), side::device, ByteCount);
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void* srcHost,
                                                        size_t ByteCount, CUstream hStream) {
    return async_op(hStream, CU_GRAPH_NODE_TYPE_MEMCPY, [&](state& s, work& w) {
        return copy_linear(s, w, addr(dstDevice), side::device, addr(srcHost), side::host, ByteCount);
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuMemcpyDtoHAsync_v2(void* dstHost, CUdeviceptr srcDevice,
                                                        size_t ByteCount, CUstream hStream) {
    return async_op(hStream, CU_GRAPH_NODE_TYPE_MEMCPY, [&](state& s, work& w) {
        return copy_linear(s, w, addr(dstHost), side::host, addr(srcDevice), side::device, ByteCount);
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuMemcpyDtoDAsync_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice,
                                                        size_t ByteCount, CUstream hStream) {
    return async_op(hStream, CU_GRAPH_NODE_TYPE_MEMCPY, [&](state& s, work& w) {
        return copy_linear(s, w, addr(dstDevice), side::device, addr(srcDevice), side::device, ByteCount);
    });
}

// Unified addressing: a pointer in a recorded range is device memory, anything else host memory.
VCUDA_SOFT_EXPORT CUresult CUDAAPI cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount) {
    return sync_op(CU_GRAPH_NODE_TYPE_MEMCPY, [&](state& s, work& w) {
        return copy_linear(s, w, addr(dst), side::unified, addr(src), side::unified, ByteCount);
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount,
                                                 CUstream hStream) {
    return async_op(hStream, CU_GRAPH_NODE_TYPE_MEMCPY, [&](state& s, work& w) {
        return copy_linear(s, w, addr(dst), side::unified, addr(src), side::unified, ByteCount);
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuMemcpyPeer(CUdeviceptr dstDevice, CUcontext dstContext,
                                                CUdeviceptr srcDevice, CUcontext srcContext,
                                                size_t ByteCount) {
    return sync_op(CU_GRAPH_NODE_TYPE_MEMCPY, [&](state& s, work& w) -> CUresult {
        if (usable_context(s, from_handle(dstContext)) == nullptr ||
            usable_context(s, from_handle(srcContext)) == nullptr)
            return CUDA_ERROR_INVALID_CONTEXT;
        return copy_linear(s, w, addr(dstDevice), side::device, addr(srcDevice), side::device, ByteCount);
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuMemcpyPeerAsync(CUdeviceptr dstDevice, CUcontext dstContext,
                                                     CUdeviceptr srcDevice, CUcontext srcContext,
                                                     size_t ByteCount, CUstream hStream) {
    return async_op(hStream, CU_GRAPH_NODE_TYPE_MEMCPY, [&](state& s, work& w) -> CUresult {
        if (usable_context(s, from_handle(dstContext)) == nullptr ||
            usable_context(s, from_handle(srcContext)) == nullptr)
            return CUDA_ERROR_INVALID_CONTEXT;
        return copy_linear(s, w, addr(dstDevice), side::device, addr(srcDevice), side::device, ByteCount);
    });
}

// --- 2D and 3D copies.

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuMemcpy2D_v2(const CUDA_MEMCPY2D* pCopy) {
    return sync_op(CU_GRAPH_NODE_TYPE_MEMCPY, [&](state& s, work& w) { return copy_2d_desc(s, w, pCopy); });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuMemcpy2DUnaligned_v2(const CUDA_MEMCPY2D* pCopy) {
    return sync_op(CU_GRAPH_NODE_TYPE_MEMCPY, [&](state& s, work& w) { return copy_2d_desc(s, w, pCopy); });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuMemcpy2DAsync_v2(const CUDA_MEMCPY2D* pCopy, CUstream hStream) {
    return async_op(hStream, CU_GRAPH_NODE_TYPE_MEMCPY,
                    [&](state& s, work& w) { return copy_2d_desc(s, w, pCopy); });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuMemcpy3D_v2(const CUDA_MEMCPY3D* pCopy) {
    return sync_op(CU_GRAPH_NODE_TYPE_MEMCPY, [&](state& s, work& w) { return copy_3d_desc(s, w, pCopy); });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuMemcpy3DAsync_v2(const CUDA_MEMCPY3D* pCopy, CUstream hStream) {
    return async_op(hStream, CU_GRAPH_NODE_TYPE_MEMCPY,
                    [&](state& s, work& w) { return copy_3d_desc(s, w, pCopy); });
}

// --- Memsets.

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuMemsetD8_v2(CUdeviceptr dstDevice, unsigned char uc, size_t N) {
    return sync_op(CU_GRAPH_NODE_TYPE_MEMSET,
                   [&](state& s, work& w) { return memset_1d<unsigned char>(s, w, dstDevice, uc, N); });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuMemsetD16_v2(CUdeviceptr dstDevice, unsigned short us, size_t N) {
    return sync_op(CU_GRAPH_NODE_TYPE_MEMSET,
                   [&](state& s, work& w) { return memset_1d<unsigned short>(s, w, dstDevice, us, N); });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuMemsetD32_v2(CUdeviceptr dstDevice, unsigned int ui, size_t N) {
    return sync_op(CU_GRAPH_NODE_TYPE_MEMSET,
                   [&](state& s, work& w) { return memset_1d<unsigned int>(s, w, dstDevice, ui, N); });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuMemsetD2D8_v2(CUdeviceptr dstDevice, size_t dstPitch, unsigned char uc,
                                                   size_t Width, size_t Height) {
    return sync_op(CU_GRAPH_NODE_TYPE_MEMSET, [&](state& s, work& w) {
        return memset_2d<unsigned char>(s, w, dstDevice, dstPitch, uc, Width, Height);
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuMemsetD2D16_v2(CUdeviceptr dstDevice, size_t dstPitch, unsigned short us,
                                                    size_t Width, size_t Height) {
    return sync_op(CU_GRAPH_NODE_TYPE_MEMSET, [&](state& s, work& w) {
        return memset_2d<unsigned short>(s, w, dstDevice, dstPitch, us, Width, Height);
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuMemsetD2D32_v2(CUdeviceptr dstDevice, size_t dstPitch, unsigned int ui,
                                                    size_t Width, size_t Height) {
    return sync_op(CU_GRAPH_NODE_TYPE_MEMSET, [&](state& s, work& w) {
        return memset_2d<unsigned int>(s, w, dstDevice, dstPitch, ui, Width, Height);
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N,
                                                   CUstream hStream) {
    return async_op(hStream, CU_GRAPH_NODE_TYPE_MEMSET, [&](state& s, work& w) {
        return memset_1d<unsigned char>(s, w, dstDevice, uc, N, capture_of(s, hStream) != nullptr);
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuMemsetD16Async(CUdeviceptr dstDevice, unsigned short us, size_t N,
                                                    CUstream hStream) {
    return async_op(hStream, CU_GRAPH_NODE_TYPE_MEMSET, [&](state& s, work& w) {
        return memset_1d<unsigned short>(s, w, dstDevice, us, N, capture_of(s, hStream) != nullptr);
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuMemsetD32Async(CUdeviceptr dstDevice, unsigned int ui, size_t N,
                                                    CUstream hStream) {
    return async_op(hStream, CU_GRAPH_NODE_TYPE_MEMSET, [&](state& s, work& w) {
        return memset_1d<unsigned int>(s, w, dstDevice, ui, N, capture_of(s, hStream) != nullptr);
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuMemsetD2D8Async(CUdeviceptr dstDevice, size_t dstPitch, unsigned char uc,
                                                     size_t Width, size_t Height, CUstream hStream) {
    return async_op(hStream, CU_GRAPH_NODE_TYPE_MEMSET, [&](state& s, work& w) {
        return memset_2d<unsigned char>(s, w, dstDevice, dstPitch, uc, Width, Height,
                                        capture_of(s, hStream) != nullptr);
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuMemsetD2D16Async(CUdeviceptr dstDevice, size_t dstPitch,
                                                      unsigned short us, size_t Width, size_t Height,
                                                      CUstream hStream) {
    return async_op(hStream, CU_GRAPH_NODE_TYPE_MEMSET, [&](state& s, work& w) {
        return memset_2d<unsigned short>(s, w, dstDevice, dstPitch, us, Width, Height,
                                         capture_of(s, hStream) != nullptr);
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuMemsetD2D32Async(CUdeviceptr dstDevice, size_t dstPitch, unsigned int ui,
                                                      size_t Width, size_t Height, CUstream hStream) {
    return async_op(hStream, CU_GRAPH_NODE_TYPE_MEMSET, [&](state& s, work& w) {
        return memset_2d<unsigned int>(s, w, dstDevice, dstPitch, ui, Width, Height,
                                       capture_of(s, hStream) != nullptr);
    });
}
