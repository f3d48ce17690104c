// Tensor maps (cuTensorMapEncodeTiled, cuTensorMapEncodeIm2col, cuTensorMapEncodeIm2colWide): the 128-byte
// descriptor embeds the global address and travels to kernels by value, as parameter bytes. So the server
// encodes it with the real driver, over memory this session owns (checked across every dimension's stride),
// and answers the descriptor's bytes; the client hands them to the application. cuTensorMapReplaceAddress is
// the client encoding again with the new address (client/api_tensor.cpp), so every address is checked here.
#include <cstring>

#include "server/call_context.hpp"

namespace vcuda::server {

namespace {

// Bits of one element; the packed sub-byte types keep 16 elements in `packed` bytes.
bool element_bits(uint64_t type, uint64_t& bits, uint64_t& packed) {
    packed = 0;
    switch (type) {
        case CU_TENSOR_MAP_DATA_TYPE_UINT8:
            bits = 8;
            return true;
        case CU_TENSOR_MAP_DATA_TYPE_UINT16:
        case CU_TENSOR_MAP_DATA_TYPE_FLOAT16:
        case CU_TENSOR_MAP_DATA_TYPE_BFLOAT16:
            bits = 16;
            return true;
        case CU_TENSOR_MAP_DATA_TYPE_UINT32:
        case CU_TENSOR_MAP_DATA_TYPE_INT32:
        case CU_TENSOR_MAP_DATA_TYPE_FLOAT32:
        case CU_TENSOR_MAP_DATA_TYPE_FLOAT32_FTZ:
        case CU_TENSOR_MAP_DATA_TYPE_TFLOAT32:
        case CU_TENSOR_MAP_DATA_TYPE_TFLOAT32_FTZ:
            bits = 32;
            return true;
        case CU_TENSOR_MAP_DATA_TYPE_UINT64:
        case CU_TENSOR_MAP_DATA_TYPE_INT64:
        case CU_TENSOR_MAP_DATA_TYPE_FLOAT64:
            bits = 64;
            return true;
        case CU_TENSOR_MAP_DATA_TYPE_16U4_ALIGN8B:
            bits = 4;
            packed = 8;
            return true;
        case CU_TENSOR_MAP_DATA_TYPE_16U4_ALIGN16B:
            bits = 4;
            packed = 16;
            return true;
        case CU_TENSOR_MAP_DATA_TYPE_16U6_ALIGN16B:
            bits = 6;
            packed = 16;
            return true;
        default:
            return false;
    }
}

// Blob `i` as exactly n values of T (at most N), copied out (blob bytes need not be aligned).
template <class T, size_t N>
bool blob_array(call_context& cx, size_t i, size_t n, T (&out)[N]) {
    auto b = cx.blob(i);
    if (n > N || b.size() != n * sizeof(T)) return false;
    if (n) std::memcpy(out, b.data(), b.size());
    return true;
}

}  // namespace

// args {kind (0 tiled, 1 im2col, 2 im2col wide), data type, rank, global address, interleave, swizzle,
// L2 promotion, OOB fill, then by kind: im2col {channels per pixel, pixels per column}; im2col wide {channels
// per pixel, pixels per column, lower corner width, upper corner width, mode}}; blobs {global dims (rank
// u64), global strides (rank-1 u64), element strides (rank u32), then by kind: tiled {box dims (rank u32)};
// im2col {the lower corner then the upper one (2 x (rank-2) int)}}. Out blob: the 128-byte descriptor.
CUresult handle_tensor_map_encode(call_context& cx) {
    if (cx.arg_count() < 8) return cx.bad_arguments();
    const uint64_t kind = cx.arg(0);
    static constexpr size_t want_args[] = {8, 10, 13};
    static constexpr size_t want_blobs[] = {4, 4, 3};
    static constexpr const char* names[] = {"cuTensorMapEncodeTiled", "cuTensorMapEncodeIm2col",
                                            "cuTensorMapEncodeIm2colWide"};
    if (kind > 2 || cx.arg_count() != want_args[kind] || cx.blob_count() != want_blobs[kind])
        return cx.bad_arguments();
    const uint64_t rank = cx.arg(2);
    const uint64_t min_rank = kind == 0 ? 1 : 3;
    if (rank < min_rank || rank > 5)
        return cx.fail(CUDA_ERROR_INVALID_VALUE,
                       std::string(names[kind]) + ": tensor rank " + std::to_string(rank) + " out of range");
    uint64_t bits = 0, packed = 0;
    if (!element_bits(cx.arg(1), bits, packed))
        return cx.fail(CUDA_ERROR_INVALID_VALUE, std::string(names[kind]) + ": unknown tensor data type");
    for (size_t i = 4; i < 8; ++i)
        if (cx.arg(i) > 0xff) return cx.bad_arguments();  // the interleave, swizzle, promotion and fill enums

    cuuint64_t dims[5] = {}, strides[5] = {};
    cuuint32_t element_strides[5] = {};
    if (!blob_array(cx, 0, rank, dims) || !blob_array(cx, 1, rank - 1, strides) ||
        !blob_array(cx, 2, rank, element_strides))
        return cx.bad_arguments();

    // The bytes the tensor spans from its address: the innermost dimension's row, then each outer dimension's
    // (dim - 1) strides. The driver checks the rest (alignments, stride multiples, box sizes).
    uint64_t extent = 0;
    for (uint64_t i = 0; i < rank; ++i)
        if (dims[i] == 0 || dims[i] > (uint64_t{1} << 32))
            return cx.fail(CUDA_ERROR_INVALID_VALUE, std::string(names[kind]) + ": global dimension " +
                                                         std::to_string(i) + " out of range");
    if (packed)
        extent = (dims[0] + 15) / 16 * packed;
    else
        extent = dims[0] * bits / 8;
    for (uint64_t i = 1; i < rank; ++i)
        if (!mul_add(dims[i] - 1, strides[i - 1], extent, extent))
            return cx.fail(CUDA_ERROR_INVALID_VALUE, std::string(names[kind]) + ": tensor extent overflows");
    // A null address is encoded as the driver does (a descriptor made before its tensor, given an address
    // later with cuTensorMapReplaceAddress); any other must be this session's memory. An address in a module
    // global the driver placed elsewhere since the application learnt it (a resume, a move) is the global's
    // new one (XLA encodes its constants' tensor maps before each run).
    const CUdeviceptr address = cx.sess.globals.relocated(cx.arg(3)).value_or(cx.arg(3));
    if (CUresult rc = address ? cx.device_range(address, extent) : CUDA_SUCCESS; rc != CUDA_SUCCESS)
        return cx.fail(rc, std::string(names[kind]) + ": the tensor (" + std::to_string(extent) +
                               " bytes from its address) is not memory this session owns");

    auto& d = cx.drv();
    CUtensorMap map{};
    void* global = reinterpret_cast<void*>(address);
    auto type = static_cast<CUtensorMapDataType>(cx.arg(1));
    auto rank32 = static_cast<cuuint32_t>(rank);
    auto interleave = static_cast<CUtensorMapInterleave>(cx.arg(4));
    auto swizzle = static_cast<CUtensorMapSwizzle>(cx.arg(5));
    auto promotion = static_cast<CUtensorMapL2promotion>(cx.arg(6));
    auto fill = static_cast<CUtensorMapFloatOOBfill>(cx.arg(7));
    CUresult rc;
    if (kind == 0) {
        cuuint32_t box[5] = {};
        if (!blob_array(cx, 3, rank, box)) return cx.bad_arguments();
        if (!d.cuTensorMapEncodeTiled) return cx.unsupported(names[kind]);
        rc = d.cuTensorMapEncodeTiled(&map, type, rank32, global, dims, strides, box, element_strides,
                                      interleave, swizzle, promotion, fill);
    } else if (kind == 1) {
        int corners[6] = {};  // the lower corner, then the upper one
        if (!blob_array(cx, 3, 2 * (rank - 2), corners)) return cx.bad_arguments();
        const int* lower = corners;
        const int* upper = corners + (rank - 2);
        if (cx.arg(8) > 0xffffffffu || cx.arg(9) > 0xffffffffu) return cx.bad_arguments();
        if (!d.cuTensorMapEncodeIm2col) return cx.unsupported(names[kind]);
        rc = d.cuTensorMapEncodeIm2col(&map, type, rank32, global, dims, strides, lower, upper,
                                       static_cast<cuuint32_t>(cx.arg(8)), static_cast<cuuint32_t>(cx.arg(9)),
                                       element_strides, interleave, swizzle, promotion, fill);
    } else {
        if (cx.arg(8) > 0xffffffffu || cx.arg(9) > 0xffffffffu || cx.arg(12) > 0xff)
            return cx.bad_arguments();
        if (!d.cuTensorMapEncodeIm2colWide) return cx.unsupported(names[kind]);
        rc = d.cuTensorMapEncodeIm2colWide(
            &map, type, rank32, global, dims, strides, cx.scalar<int>(10), cx.scalar<int>(11),
            static_cast<cuuint32_t>(cx.arg(8)), static_cast<cuuint32_t>(cx.arg(9)), element_strides,
            interleave, static_cast<CUtensorMapIm2ColWideMode>(cx.arg(12)), swizzle, promotion, fill);
    }
    if (rc != CUDA_SUCCESS) return rc;
    cx.out_blob({reinterpret_cast<const std::byte*>(&map), sizeof map});
    return CUDA_SUCCESS;
}

}  // namespace vcuda::server
