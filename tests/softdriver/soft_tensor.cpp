// The software test driver: tensor maps (descriptors in the format soft_tensor_map.hpp documents) and the
// profiler switches (no profiler here: they check the context and succeed).
#include "soft_state.hpp"
#include "soft_tensor_map.hpp"

namespace vcuda::soft {
namespace {

// Bytes per element; 0 for the packed sub-byte types (16 elements in 8 or 16 bytes). False for unknown types.
bool element_size(CUtensorMapDataType t, unsigned& bytes) {
    switch (t) {
        case CU_TENSOR_MAP_DATA_TYPE_UINT8:
            bytes = 1;
            return true;
        case CU_TENSOR_MAP_DATA_TYPE_UINT16:
        case CU_TENSOR_MAP_DATA_TYPE_FLOAT16:
        case CU_TENSOR_MAP_DATA_TYPE_BFLOAT16:
            bytes = 2;
            return true;
        case CU_TENSOR_MAP_DATA_TYPE_UINT32:
        case CU_TENSOR_MAP_DATA_TYPE_INT32:
        case CU_TENSOR_MAP_DATA_TYPE_FLOAT32:
        case CU_TENSOR_MAP_DATA_TYPE_FLOAT32_FTZ:
        case CU_TENSOR_MAP_DATA_TYPE_TFLOAT32:
        case CU_TENSOR_MAP_DATA_TYPE_TFLOAT32_FTZ:
            bytes = 4;
            return true;
        case CU_TENSOR_MAP_DATA_TYPE_UINT64:
        case CU_TENSOR_MAP_DATA_TYPE_INT64:
        case CU_TENSOR_MAP_DATA_TYPE_FLOAT64:
            bytes = 8;
            return true;
        case CU_TENSOR_MAP_DATA_TYPE_16U4_ALIGN8B:
        case CU_TENSOR_MAP_DATA_TYPE_16U4_ALIGN16B:
        case CU_TENSOR_MAP_DATA_TYPE_16U6_ALIGN16B:
            bytes = 0;
            return true;
        default:
            return false;
    }
}

// The checks every encoder shares (the documented requirements of cuTensorMapEncodeTiled), and the common
// fields.
CUresult encode_common(tensor_map_desc& d, uint8_t kind, CUtensorMap* map, CUtensorMapDataType type,
                       cuuint32_t rank, void* address, const cuuint64_t* dims, const cuuint64_t* strides,
                       const cuuint32_t* element_strides, CUtensorMapInterleave interleave,
                       CUtensorMapSwizzle swizzle, CUtensorMapL2promotion promotion,
                       CUtensorMapFloatOOBfill fill) {
    unsigned esize = 0;
    if (map == nullptr || dims == nullptr ||
        element_strides == nullptr)  // a null address is accepted (driver 580)
        return CUDA_ERROR_INVALID_VALUE;
    if (rank < (kind == 0 ? 1u : 3u) || rank > 5 || (rank > 1 && strides == nullptr))
        return CUDA_ERROR_INVALID_VALUE;
    if (!element_size(type, esize)) return CUDA_ERROR_INVALID_VALUE;
    if (interleave > CU_TENSOR_MAP_INTERLEAVE_32B || swizzle > CU_TENSOR_MAP_SWIZZLE_128B_ATOM_64B ||
        promotion > CU_TENSOR_MAP_L2_PROMOTION_L2_256B ||
        fill > CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA)
        return CUDA_ERROR_INVALID_VALUE;
    const uintptr_t a = reinterpret_cast<uintptr_t>(address);
    if (a % (interleave == CU_TENSOR_MAP_INTERLEAVE_32B ? 32 : 16) != 0) return CUDA_ERROR_INVALID_VALUE;
    std::memset(&d, 0, sizeof d);
    d.magic = tensor_map_magic;
    d.kind = kind;
    d.data_type = static_cast<uint8_t>(type);
    d.rank = static_cast<uint8_t>(rank);
    d.element_bytes = static_cast<uint8_t>(esize);
    d.address = a;
    for (unsigned i = 0; i < 5; ++i) {
        d.dims[i] = 1;
        d.box_minus_1[i] = 0;
        d.element_strides[i] = 1;
    }
    for (unsigned i = 0; i < rank; ++i) {
        if (dims[i] == 0 || dims[i] > (uint64_t{1} << 32)) return CUDA_ERROR_INVALID_VALUE;
        if (element_strides[i] == 0 || element_strides[i] > 8) return CUDA_ERROR_INVALID_VALUE;
        d.dims[i] = dims[i];
        d.element_strides[i] = static_cast<uint8_t>(element_strides[i]);
    }
    for (unsigned i = 0; i + 1 < rank; ++i) {
        if (strides[i] % (interleave == CU_TENSOR_MAP_INTERLEAVE_32B ? 32 : 16) != 0 ||
            strides[i] >= (uint64_t{1} << 40))
            return CUDA_ERROR_INVALID_VALUE;
        d.strides[i] = strides[i];
    }
    d.interleave = static_cast<uint8_t>(interleave);
    d.swizzle = static_cast<uint8_t>(swizzle);
    d.l2_promotion = static_cast<uint8_t>(promotion);
    d.oob_fill = static_cast<uint8_t>(fill);
    return CUDA_SUCCESS;
}

}  // namespace
}  // namespace vcuda::soft

using namespace vcuda::soft;

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuTensorMapEncodeTiled(
    CUtensorMap* tensorMap, CUtensorMapDataType tensorDataType, cuuint32_t tensorRank, void* globalAddress,
    const cuuint64_t* globalDim, const cuuint64_t* globalStrides, const cuuint32_t* boxDim,
    const cuuint32_t* elementStrides, CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
    CUtensorMapL2promotion l2Promotion, CUtensorMapFloatOOBfill oobFill) {
    return entry([&](state&) -> CUresult {
        tensor_map_desc d;
        if (CUresult r =
                encode_common(d, 0, tensorMap, tensorDataType, tensorRank, globalAddress, globalDim,
                              globalStrides, elementStrides, interleave, swizzle, l2Promotion, oobFill);
            r != CUDA_SUCCESS)
            return r;
        if (boxDim == nullptr) return CUDA_ERROR_INVALID_VALUE;
        for (unsigned i = 0; i < tensorRank; ++i) {
            if (boxDim[i] == 0 || boxDim[i] > 256) return CUDA_ERROR_INVALID_VALUE;
            d.box_minus_1[i] = static_cast<uint8_t>(boxDim[i] - 1);
        }
        // Without interleave the inner box row is a multiple of 16 bytes.
        if (interleave == CU_TENSOR_MAP_INTERLEAVE_NONE && d.element_bytes &&
            boxDim[0] * d.element_bytes % 16 != 0)
            return CUDA_ERROR_INVALID_VALUE;
        std::memcpy(tensorMap, &d, sizeof d);
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuTensorMapEncodeIm2col(
    CUtensorMap* tensorMap, CUtensorMapDataType tensorDataType, cuuint32_t tensorRank, void* globalAddress,
    const cuuint64_t* globalDim, const cuuint64_t* globalStrides, const int* pixelBoxLowerCorner,
    const int* pixelBoxUpperCorner, cuuint32_t channelsPerPixel, cuuint32_t pixelsPerColumn,
    const cuuint32_t* elementStrides, CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
    CUtensorMapL2promotion l2Promotion, CUtensorMapFloatOOBfill oobFill) {
    return entry([&](state&) -> CUresult {
        tensor_map_desc d;
        if (CUresult r =
                encode_common(d, 1, tensorMap, tensorDataType, tensorRank, globalAddress, globalDim,
                              globalStrides, elementStrides, interleave, swizzle, l2Promotion, oobFill);
            r != CUDA_SUCCESS)
            return r;
        if (pixelBoxLowerCorner == nullptr || pixelBoxUpperCorner == nullptr) return CUDA_ERROR_INVALID_VALUE;
        if (channelsPerPixel == 0 || channelsPerPixel > 256 || pixelsPerColumn == 0 || pixelsPerColumn > 1024)
            return CUDA_ERROR_INVALID_VALUE;
        for (unsigned i = 0; i + 2 < tensorRank; ++i) {
            if (pixelBoxLowerCorner[i] < -128 || pixelBoxLowerCorner[i] > 127 ||
                pixelBoxUpperCorner[i] < -128 || pixelBoxUpperCorner[i] > 127)
                return CUDA_ERROR_INVALID_VALUE;
            d.lower[i] = static_cast<int8_t>(pixelBoxLowerCorner[i]);
            d.upper[i] = static_cast<int8_t>(pixelBoxUpperCorner[i]);
        }
        d.channels_per_pixel = static_cast<uint16_t>(channelsPerPixel);
        d.pixels_per_column = static_cast<uint16_t>(pixelsPerColumn);
        std::memcpy(tensorMap, &d, sizeof d);
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuTensorMapEncodeIm2colWide(
    CUtensorMap* tensorMap, CUtensorMapDataType tensorDataType, cuuint32_t tensorRank, void* globalAddress,
    const cuuint64_t* globalDim, const cuuint64_t* globalStrides, int pixelBoxLowerCornerWidth,
    int pixelBoxUpperCornerWidth, cuuint32_t channelsPerPixel, cuuint32_t pixelsPerColumn,
    const cuuint32_t* elementStrides, CUtensorMapInterleave interleave, CUtensorMapIm2ColWideMode mode,
    CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2Promotion, CUtensorMapFloatOOBfill oobFill) {
    return entry([&](state&) -> CUresult {
        tensor_map_desc d;
        if (CUresult r =
                encode_common(d, 2, tensorMap, tensorDataType, tensorRank, globalAddress, globalDim,
                              globalStrides, elementStrides, interleave, swizzle, l2Promotion, oobFill);
            r != CUDA_SUCCESS)
            return r;
        if (mode > CU_TENSOR_MAP_IM2COL_WIDE_MODE_W128 || channelsPerPixel == 0 || channelsPerPixel > 256 ||
            pixelsPerColumn == 0 || pixelsPerColumn > 1024 || pixelBoxLowerCornerWidth < -128 ||
            pixelBoxLowerCornerWidth > 127 || pixelBoxUpperCornerWidth < -128 ||
            pixelBoxUpperCornerWidth > 127)
            return CUDA_ERROR_INVALID_VALUE;
        d.lower[0] = static_cast<int8_t>(pixelBoxLowerCornerWidth);
        d.upper[0] = static_cast<int8_t>(pixelBoxUpperCornerWidth);
        d.channels_per_pixel = static_cast<uint16_t>(channelsPerPixel);
        d.pixels_per_column = static_cast<uint16_t>(pixelsPerColumn);
        d.wide_mode = static_cast<uint8_t>(mode);
        std::memcpy(tensorMap, &d, sizeof d);
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuTensorMapReplaceAddress(CUtensorMap* tensorMap, void* globalAddress) {
    return entry([&](state&) -> CUresult {
        tensor_map_desc d;
        if (tensorMap == nullptr || globalAddress == nullptr || !decode_tensor_map(tensorMap, d))
            return CUDA_ERROR_INVALID_VALUE;
        const uintptr_t a = reinterpret_cast<uintptr_t>(globalAddress);
        if (a % (d.interleave == CU_TENSOR_MAP_INTERLEAVE_32B ? 32 : 16) != 0)
            return CUDA_ERROR_INVALID_VALUE;
        d.address = a;
        std::memcpy(tensorMap, &d, sizeof d);
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuProfilerStart() {
    return entry([&](state& s) -> CUresult {
        context_obj* c = nullptr;
        return require_context(s, c);
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuProfilerStop() {
    return entry([&](state& s) -> CUresult {
        context_obj* c = nullptr;
        return require_context(s, c);
    });
}
