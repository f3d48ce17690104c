// Tensor maps (cuTensorMapEncodeTiled, cuTensorMapEncodeIm2col, cuTensorMapEncodeIm2colWide): the 128-byte
// descriptor embeds the global address and travels to kernels by value, as parameter bytes. So the server
// encodes it with the real driver, over memory this session owns (checked across every dimension's stride),
// and answers the descriptor's bytes; the client hands them to the application. cuTensorMapReplaceAddress is
// the client encoding again with the new address (client/api_tensor.cpp), so every address is checked here.
#include <cstring>

#include "server/call_context.hpp"
#include "server_ops.hpp"

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

// A blob as exactly n values of T (at most N), copied out (blob bytes need not be aligned).
template <class T, size_t N>
bool blob_array(std::span<const std::byte> b, size_t n, T (&out)[N]) {
    if (n > N || b.size() != n * sizeof(T)) return false;
    if (n) std::memcpy(out, b.data(), b.size());
    return true;
}

}  // namespace

// Blobs: global dims (rank u64), global strides (rank-1 u64), element strides (rank u32), the shape by kind:
// tiled, the box dims (rank u32); im2col, the lower corner then the upper one (2 x (rank-2) int); im2col
// wide, none. Out blob: the 128-byte descriptor.
CUresult handle_tensor_map_encode(call_context& cx, const tensor_map_encode_args& a) {
    const unsigned kind = a.kind;
    static constexpr const char* names[] = {"cuTensorMapEncodeTiled", "cuTensorMapEncodeIm2col",
                                            "cuTensorMapEncodeIm2colWide"};
    // What a kind does not take must be 0 (empty): a malformed call, not a value ignored.
    const bool im2col_args = a.channels || a.pixels, wide_args = a.lower_width || a.upper_width || a.mode;
    if (kind > 2 || (kind == 0 && (im2col_args || wide_args)) || (kind == 1 && wide_args) ||
        (kind == 2 && !a.shape.empty()))
        return cx.bad_arguments();
    const uint64_t rank = a.rank;
    const uint64_t min_rank = kind == 0 ? 1 : 3;
    if (rank < min_rank || rank > 5)
        return cx.fail(CUDA_ERROR_INVALID_VALUE,
                       std::string(names[kind]) + ": tensor rank " + std::to_string(rank) + " out of range");
    uint64_t bits = 0, packed = 0;
    if (!element_bits(a.type, bits, packed))
        return cx.fail(CUDA_ERROR_INVALID_VALUE, std::string(names[kind]) + ": unknown tensor data type");
    for (unsigned e : {a.interleave, a.swizzle, a.promotion, a.fill})
        if (e > 0xff) return cx.bad_arguments();  // the interleave, swizzle, promotion and fill enums

    cuuint64_t dims[5] = {}, strides[5] = {};
    cuuint32_t element_strides[5] = {};
    if (!blob_array(a.dims, rank, dims) || !blob_array(a.strides, rank - 1, strides) ||
        !blob_array(a.element_strides, rank, element_strides))
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
    const CUdeviceptr address = cx.sess.globals.relocated(a.address).value_or(a.address);
    if (CUresult rc = address ? cx.device_range(address, extent) : CUDA_SUCCESS; rc != CUDA_SUCCESS)
        return cx.fail(rc, std::string(names[kind]) + ": the tensor (" + std::to_string(extent) +
                               " bytes from its address) is not memory this session owns");

    auto& d = cx.drv();
    CUtensorMap map{};
    void* global = reinterpret_cast<void*>(address);
    auto type = static_cast<CUtensorMapDataType>(a.type);
    auto rank32 = static_cast<cuuint32_t>(rank);
    auto interleave = static_cast<CUtensorMapInterleave>(a.interleave);
    auto swizzle = static_cast<CUtensorMapSwizzle>(a.swizzle);
    auto promotion = static_cast<CUtensorMapL2promotion>(a.promotion);
    auto fill = static_cast<CUtensorMapFloatOOBfill>(a.fill);
    CUresult rc;
    if (kind == 0) {
        cuuint32_t box[5] = {};
        if (!blob_array(a.shape, rank, box)) return cx.bad_arguments();
        if (!d.cuTensorMapEncodeTiled) return cx.unsupported(names[kind]);
        rc = d.cuTensorMapEncodeTiled(&map, type, rank32, global, dims, strides, box, element_strides,
                                      interleave, swizzle, promotion, fill);
    } else if (kind == 1) {
        int corners[6] = {};  // the lower corner, then the upper one
        if (!blob_array(a.shape, 2 * (rank - 2), corners)) return cx.bad_arguments();
        const int* lower = corners;
        const int* upper = corners + (rank - 2);
        if (!d.cuTensorMapEncodeIm2col) return cx.unsupported(names[kind]);
        rc = d.cuTensorMapEncodeIm2col(&map, type, rank32, global, dims, strides, lower, upper, a.channels,
                                       a.pixels, element_strides, interleave, swizzle, promotion, fill);
    } else {
        if (a.mode > 0xff) return cx.bad_arguments();
        if (!d.cuTensorMapEncodeIm2colWide) return cx.unsupported(names[kind]);
        rc = d.cuTensorMapEncodeIm2colWide(&map, type, rank32, global, dims, strides, a.lower_width,
                                           a.upper_width, a.channels, a.pixels, element_strides, interleave,
                                           static_cast<CUtensorMapIm2ColWideMode>(a.mode), swizzle, promotion,
                                           fill);
    }
    if (rc != CUDA_SUCCESS) return rc;
    cx.out_blob({reinterpret_cast<const std::byte*>(&map), sizeof map});
    return CUDA_SUCCESS;
}

}  // namespace vcuda::server
