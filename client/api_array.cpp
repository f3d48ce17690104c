// CUDA arrays, mipmapped arrays, texture objects and surface objects (server/handlers_array.cpp). Arrays are
// session handles the mirror knows by kind, so a copy naming an unknown array fails here at once; the server
// checks every copy's box against the array's extent. A mipmapped array's level arrays come with it. Texture
// and surface objects are the server's real values (kernels receive them by value): the server keeps which
// belong to the session. The array copies (cuMemcpyHtoA ...) are 1D copies through the 2D/3D path
// (client/copy_paths.cpp).
#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "client/copy_paths.hpp"
#include "client/entry_point.hpp"
#include "client/plain_call.hpp"
#include "client/state.hpp"
#include "client/trace.hpp"
#include "client_ops.hpp"

using namespace vcuda;
using namespace vcuda::client;

namespace {

// The extent of each array this process made (its id -> row bytes, rows, slices), so that a copy past it
// fails at call time even when it is queued, as with the driver.
struct extent {
    uint64_t row = 0, rows = 1, slices = 1;
    uint64_t element = 0;  // bytes
};
std::mutex arrays_mu;
std::map<uint64_t, extent>& arrays() {
    static auto* m = new std::map<uint64_t, extent>();
    return *m;
}

uint64_t element_bytes(CUarray_format f, unsigned channels) {
    switch (f) {
        case CU_AD_FORMAT_UNSIGNED_INT8:
        case CU_AD_FORMAT_SIGNED_INT8:
            return channels;
        case CU_AD_FORMAT_UNSIGNED_INT16:
        case CU_AD_FORMAT_SIGNED_INT16:
        case CU_AD_FORMAT_HALF:
            return 2ull * channels;
        default:
            return 4ull * channels;  // the server refuses formats it does not serve before any copy
    }
}

// Each mipmapped array this process made, and its levels' arrays (level 0 first).
std::map<uint64_t, std::vector<uint64_t>>& mipmapped() {
    static auto* m = new std::map<uint64_t, std::vector<uint64_t>>();
    return *m;
}

std::span<const std::byte> bytes_of(const void* p, size_t n) { return {static_cast<const std::byte*>(p), n}; }

CUresult create_array(CUarray* out, size_t width, size_t height, size_t depth, CUarray_format format,
                      unsigned channels, unsigned flags, bool three_d, const char* name) {
    array_create_call c(name, width, height, depth, static_cast<unsigned>(format), channels, flags, three_d);
    if (CUresult rc = c.send_sync(); rc != CUDA_SUCCESS) return rc;
    *out = c.array();
    std::lock_guard lock(arrays_mu);
    arrays()[reinterpret_cast<uint64_t>(*out)] = {width * element_bytes(format, channels),
                                                  height ? height : 1, depth ? depth : 1,
                                                  element_bytes(format, channels)};
    return CUDA_SUCCESS;
}

CUresult array_descriptor(CUarray a, CUDA_ARRAY3D_DESCRIPTOR& d) {
    array_descriptor_call c("cuArray3DGetDescriptor", a);
    if (CUresult rc = c.send_sync(); rc != CUDA_SUCCESS) return rc;
    d.Width = c.width();
    d.Height = c.height();
    d.Depth = c.depth();
    d.Format = static_cast<CUarray_format>(c.format());
    d.NumChannels = c.channels();
    d.Flags = c.flags();
    return CUDA_SUCCESS;
}

// A 1D copy of n bytes between an array (at a byte offset in its first row) and host or device memory; on
// `stream` in its order (mode::post) for the Async forms.
CUresult copy_1d(CUmemorytype dt, void* dhost, CUdeviceptr ddev, CUarray darr, size_t doff, CUmemorytype st,
                 const void* shost, CUdeviceptr sdev, CUarray sarr, size_t soff, size_t n,
                 CUstream stream = nullptr, mode m = mode::sync) {
    CUDA_MEMCPY3D c{};
    c.dstMemoryType = dt;
    c.dstHost = dhost;
    c.dstDevice = ddev;
    c.dstArray = darr;
    c.dstXInBytes = doff;
    c.srcMemoryType = st;
    c.srcHost = shost;
    c.srcDevice = sdev;
    c.srcArray = sarr;
    c.srcXInBytes = soff;
    c.WidthInBytes = n;
    c.Height = 1;
    c.Depth = 1;
    return copy_3d(c, stream, m);
}

}  // namespace

bool vcuda::client::array_box_fits(uint64_t id, uint64_t x, uint64_t y, uint64_t z, uint64_t w, uint64_t h,
                                   uint64_t d) {
    std::lock_guard lock(arrays_mu);
    auto it = arrays().find(id);
    if (it == arrays().end()) return false;
    uint64_t xe, ye, ze;
    return !__builtin_add_overflow(x, w, &xe) && xe <= it->second.row && !__builtin_add_overflow(y, h, &ye) &&
           ye <= it->second.rows && !__builtin_add_overflow(z, d, &ze) && ze <= it->second.slices;
}

uint64_t vcuda::client::array_element_bytes(uint64_t id) {
    std::lock_guard lock(arrays_mu);
    auto it = arrays().find(id);
    return it == arrays().end() ? 0 : it->second.element;
}

VCUDA_API cuArrayCreate_v2(CUarray* pHandle, const CUDA_ARRAY_DESCRIPTOR* d) noexcept {
    VCUDA_TRACE_HOOK(cuArrayCreate_v2, pHandle, d);
    VCUDA_REQUIRE_INIT();
    if (!pHandle || !d) return CUDA_ERROR_INVALID_VALUE;
    return create_array(pHandle, d->Width, d->Height, 0, d->Format, d->NumChannels, 0, false,
                        "cuArrayCreate");
}

VCUDA_API cuArray3DCreate_v2(CUarray* pHandle, const CUDA_ARRAY3D_DESCRIPTOR* d) noexcept {
    VCUDA_TRACE_HOOK(cuArray3DCreate_v2, pHandle, d);
    VCUDA_REQUIRE_INIT();
    if (!pHandle || !d) return CUDA_ERROR_INVALID_VALUE;
    return create_array(pHandle, d->Width, d->Height, d->Depth, d->Format, d->NumChannels, d->Flags, true,
                        "cuArray3DCreate");
}

VCUDA_API cuMipmappedArrayCreate(CUmipmappedArray* pHandle, const CUDA_ARRAY3D_DESCRIPTOR* d,
                                 unsigned int numMipmapLevels) noexcept {
    VCUDA_TRACE_HOOK(cuMipmappedArrayCreate, pHandle, d, numMipmapLevels);
    VCUDA_REQUIRE_INIT();
    if (!pHandle || !d) return CUDA_ERROR_INVALID_VALUE;
    mipmapped_array_create_call c("cuMipmappedArrayCreate", d->Width, d->Height, d->Depth, d->Format,
                                  d->NumChannels, d->Flags, numMipmapLevels);
    if (CUresult rc = c.send_sync(); rc != CUDA_SUCCESS) return rc;
    if (c.level_arrays().size() != numMipmapLevels) return CUDA_ERROR_UNKNOWN;
    *pHandle = c.mipmapped();
    const auto id = reinterpret_cast<uint64_t>(*pHandle);
    std::vector<uint64_t> levels;
    std::lock_guard lock(arrays_mu);
    for (unsigned l = 0; l < numMipmapLevels; ++l) {
        const uint64_t level =
            reinterpret_cast<uint64_t>(c.out_handle<CUarray>(1 + l, handle_kind::array, id));
        auto half = [&](size_t n) -> uint64_t { return n ? std::max<uint64_t>(1, n >> l) : 0; };
        const bool layered = d->Flags & CUDA_ARRAY3D_LAYERED;
        const uint64_t height = half(d->Height), depth = layered ? d->Depth : half(d->Depth);
        arrays()[level] = {half(d->Width) * element_bytes(d->Format, d->NumChannels), height ? height : 1,
                           depth ? depth : 1, element_bytes(d->Format, d->NumChannels)};
        levels.push_back(level);
    }
    mipmapped()[id] = std::move(levels);
    return CUDA_SUCCESS;
}

// The levels' arrays came with the mipmapped array: answered here.
VCUDA_API cuMipmappedArrayGetLevel(CUarray* pLevelArray, CUmipmappedArray hMipmappedArray,
                                   unsigned int level) noexcept {
    VCUDA_TRACE_HOOK(cuMipmappedArrayGetLevel, pLevelArray, hMipmappedArray, level);
    VCUDA_REQUIRE_INIT();
    if (!pLevelArray) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard lock(arrays_mu);
    auto it = mipmapped().find(reinterpret_cast<uint64_t>(hMipmappedArray));
    if (it == mipmapped().end()) return CUDA_ERROR_INVALID_HANDLE;
    if (level >= it->second.size()) return CUDA_ERROR_INVALID_VALUE;
    *pLevelArray = reinterpret_cast<CUarray>(it->second[level]);
    return CUDA_SUCCESS;
}

VCUDA_API cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray) noexcept {
    VCUDA_TRACE_HOOK(cuMipmappedArrayDestroy, hMipmappedArray);
    VCUDA_REQUIRE_INIT();
    mipmapped_array_destroy_call c("cuMipmappedArrayDestroy", hMipmappedArray);
    if (CUresult rc = c.send_sync(); rc != CUDA_SUCCESS) return rc;
    c.forget_destroyed();
    std::lock_guard lock(arrays_mu);
    auto it = mipmapped().find(reinterpret_cast<uint64_t>(hMipmappedArray));
    if (it == mipmapped().end()) return CUDA_SUCCESS;
    for (uint64_t level : it->second) {
        c.forget(reinterpret_cast<CUarray>(level), handle_kind::array);
        arrays().erase(level);
    }
    mipmapped().erase(it);
    return CUDA_SUCCESS;
}

VCUDA_API cuArrayDestroy(CUarray hArray) noexcept {
    VCUDA_TRACE_HOOK(cuArrayDestroy, hArray);
    VCUDA_REQUIRE_INIT();
    array_destroy_call c("cuArrayDestroy", hArray);
    if (CUresult rc = c.send_sync(); rc != CUDA_SUCCESS) return rc;
    c.forget_destroyed();
    std::lock_guard lock(arrays_mu);
    arrays().erase(reinterpret_cast<uint64_t>(hArray));
    return CUDA_SUCCESS;
}

VCUDA_API cuArray3DGetDescriptor_v2(CUDA_ARRAY3D_DESCRIPTOR* out, CUarray hArray) noexcept {
    VCUDA_TRACE_HOOK(cuArray3DGetDescriptor_v2, out, hArray);
    VCUDA_REQUIRE_INIT();
    if (!out) return CUDA_ERROR_INVALID_VALUE;
    CUDA_ARRAY3D_DESCRIPTOR d{};
    if (CUresult rc = array_descriptor(hArray, d); rc != CUDA_SUCCESS) return rc;
    *out = d;
    return CUDA_SUCCESS;
}

VCUDA_API cuArrayGetDescriptor_v2(CUDA_ARRAY_DESCRIPTOR* out, CUarray hArray) noexcept {
    VCUDA_TRACE_HOOK(cuArrayGetDescriptor_v2, out, hArray);
    VCUDA_REQUIRE_INIT();
    if (!out) return CUDA_ERROR_INVALID_VALUE;
    CUDA_ARRAY3D_DESCRIPTOR d{};
    if (CUresult rc = array_descriptor(hArray, d); rc != CUDA_SUCCESS) return rc;
    out->Width = d.Width;
    out->Height = d.Height;
    out->Format = d.Format;
    out->NumChannels = d.NumChannels;
    return CUDA_SUCCESS;
}

VCUDA_API cuMemcpyHtoA_v2(CUarray dstArray, size_t dstOffset, const void* srcHost,
                          size_t ByteCount) noexcept {
    VCUDA_TRACE_HOOK(cuMemcpyHtoA_v2, dstArray, dstOffset, srcHost, ByteCount);
    if (!srcHost) return CUDA_ERROR_INVALID_VALUE;
    return copy_1d(CU_MEMORYTYPE_ARRAY, nullptr, 0, dstArray, dstOffset, CU_MEMORYTYPE_HOST, srcHost, 0,
                   nullptr, 0, ByteCount);
}

VCUDA_API cuMemcpyAtoH_v2(void* dstHost, CUarray srcArray, size_t srcOffset, size_t ByteCount) noexcept {
    VCUDA_TRACE_HOOK(cuMemcpyAtoH_v2, dstHost, srcArray, srcOffset, ByteCount);
    if (!dstHost) return CUDA_ERROR_INVALID_VALUE;
    return copy_1d(CU_MEMORYTYPE_HOST, dstHost, 0, nullptr, 0, CU_MEMORYTYPE_ARRAY, nullptr, 0, srcArray,
                   srcOffset, ByteCount);
}

VCUDA_API cuMemcpyHtoAAsync_v2(CUarray dstArray, size_t dstOffset, const void* srcHost, size_t ByteCount,
                               CUstream hStream) noexcept {
    VCUDA_TRACE_HOOK(cuMemcpyHtoAAsync_v2, dstArray, dstOffset, srcHost, ByteCount, hStream);
    if (!srcHost) return CUDA_ERROR_INVALID_VALUE;
    return copy_1d(CU_MEMORYTYPE_ARRAY, nullptr, 0, dstArray, dstOffset, CU_MEMORYTYPE_HOST, srcHost, 0,
                   nullptr, 0, ByteCount, hStream, mode::post);
}

VCUDA_API cuMemcpyAtoHAsync_v2(void* dstHost, CUarray srcArray, size_t srcOffset, size_t ByteCount,
                               CUstream hStream) noexcept {
    VCUDA_TRACE_HOOK(cuMemcpyAtoHAsync_v2, dstHost, srcArray, srcOffset, ByteCount, hStream);
    if (!dstHost) return CUDA_ERROR_INVALID_VALUE;
    return copy_1d(CU_MEMORYTYPE_HOST, dstHost, 0, nullptr, 0, CU_MEMORYTYPE_ARRAY, nullptr, 0, srcArray,
                   srcOffset, ByteCount, hStream, mode::post);
}

VCUDA_API cuMemcpyDtoA_v2(CUarray dstArray, size_t dstOffset, CUdeviceptr srcDevice,
                          size_t ByteCount) noexcept {
    VCUDA_TRACE_HOOK(cuMemcpyDtoA_v2, dstArray, dstOffset, srcDevice, ByteCount);
    return copy_1d(CU_MEMORYTYPE_ARRAY, nullptr, 0, dstArray, dstOffset, CU_MEMORYTYPE_DEVICE, nullptr,
                   srcDevice, nullptr, 0, ByteCount);
}

VCUDA_API cuMemcpyAtoD_v2(CUdeviceptr dstDevice, CUarray srcArray, size_t srcOffset,
                          size_t ByteCount) noexcept {
    VCUDA_TRACE_HOOK(cuMemcpyAtoD_v2, dstDevice, srcArray, srcOffset, ByteCount);
    return copy_1d(CU_MEMORYTYPE_DEVICE, nullptr, dstDevice, nullptr, 0, CU_MEMORYTYPE_ARRAY, nullptr, 0,
                   srcArray, srcOffset, ByteCount);
}

VCUDA_API cuMemcpyAtoA_v2(CUarray dstArray, size_t dstOffset, CUarray srcArray, size_t srcOffset,
                          size_t ByteCount) noexcept {
    VCUDA_TRACE_HOOK(cuMemcpyAtoA_v2, dstArray, dstOffset, srcArray, srcOffset, ByteCount);
    return copy_1d(CU_MEMORYTYPE_ARRAY, nullptr, 0, dstArray, dstOffset, CU_MEMORYTYPE_ARRAY, nullptr, 0,
                   srcArray, srcOffset, ByteCount);
}

VCUDA_API cuTexObjectCreate(CUtexObject* pTexObject, const CUDA_RESOURCE_DESC* pResDesc,
                            const CUDA_TEXTURE_DESC* pTexDesc,
                            const CUDA_RESOURCE_VIEW_DESC* pResViewDesc) noexcept {
    VCUDA_TRACE_HOOK(cuTexObjectCreate, pTexObject, pResDesc, pTexDesc, pResViewDesc);
    VCUDA_REQUIRE_INIT();
    if (!pTexObject || !pResDesc || !pTexDesc) return CUDA_ERROR_INVALID_VALUE;
    if (pResDesc->resType == CU_RESOURCE_TYPE_ARRAY &&
        !valid_handle(reinterpret_cast<uint64_t>(pResDesc->res.array.hArray), handle_kind::array))
        return CUDA_ERROR_INVALID_HANDLE;
    if (pResDesc->resType == CU_RESOURCE_TYPE_MIPMAPPED_ARRAY &&
        !valid_handle(reinterpret_cast<uint64_t>(pResDesc->res.mipmap.hMipmappedArray),
                      handle_kind::mipmapped_array))
        return CUDA_ERROR_INVALID_HANDLE;
    tex_create_call c(
        "cuTexObjectCreate", bytes_of(pResDesc, sizeof *pResDesc), bytes_of(pTexDesc, sizeof *pTexDesc),
        pResViewDesc ? bytes_of(pResViewDesc, sizeof *pResViewDesc) : std::span<const std::byte>{});
    if (CUresult rc = c.send_sync(); rc != CUDA_SUCCESS) return rc;
    *pTexObject = c.object();
    return CUDA_SUCCESS;
}

VCUDA_API cuTexObjectDestroy(CUtexObject texObject) noexcept {
    VCUDA_TRACE_HOOK(cuTexObjectDestroy, texObject);
    VCUDA_REQUIRE_INIT();
    return tex_destroy_call("cuTexObjectDestroy", texObject).send_sync();
}

namespace {
// One descriptor of a texture or surface object of the session (op tex_resource_desc): the resource as
// created, or the driver's texture or resource-view descriptor.
enum class object_desc : uint64_t {
    texture_resource = 0,
    texture = 1,
    resource_view = 2,
    surface_resource = 3
};

CUresult object_descriptor(uint64_t object, object_desc which, void* out, size_t size, const char* name) {
    if (!out) return CUDA_ERROR_INVALID_VALUE;
    tex_resource_desc_call c(name, object, static_cast<unsigned>(which));
    if (CUresult rc = c.send_sync(); rc != CUDA_SUCCESS) return rc;
    const auto& blobs = c.reply().blobs;
    if (blobs.size() != 1 || blobs[0].size() != size) return CUDA_ERROR_UNKNOWN;
    std::memcpy(out, blobs[0].data(), size);
    return CUDA_SUCCESS;
}
}  // namespace

VCUDA_API cuTexObjectGetResourceDesc(CUDA_RESOURCE_DESC* pResDesc, CUtexObject texObject) noexcept {
    VCUDA_TRACE_HOOK(cuTexObjectGetResourceDesc, pResDesc, texObject);
    VCUDA_REQUIRE_INIT();
    return object_descriptor(texObject, object_desc::texture_resource, pResDesc, sizeof *pResDesc,
                             "cuTexObjectGetResourceDesc");
}

VCUDA_API cuTexObjectGetTextureDesc(CUDA_TEXTURE_DESC* pTexDesc, CUtexObject texObject) noexcept {
    VCUDA_TRACE_HOOK(cuTexObjectGetTextureDesc, pTexDesc, texObject);
    VCUDA_REQUIRE_INIT();
    return object_descriptor(texObject, object_desc::texture, pTexDesc, sizeof *pTexDesc,
                             "cuTexObjectGetTextureDesc");
}

VCUDA_API cuTexObjectGetResourceViewDesc(CUDA_RESOURCE_VIEW_DESC* pResViewDesc,
                                         CUtexObject texObject) noexcept {
    VCUDA_TRACE_HOOK(cuTexObjectGetResourceViewDesc, pResViewDesc, texObject);
    VCUDA_REQUIRE_INIT();
    return object_descriptor(texObject, object_desc::resource_view, pResViewDesc, sizeof *pResViewDesc,
                             "cuTexObjectGetResourceViewDesc");
}

VCUDA_API cuSurfObjectGetResourceDesc(CUDA_RESOURCE_DESC* pResDesc, CUsurfObject surfObject) noexcept {
    VCUDA_TRACE_HOOK(cuSurfObjectGetResourceDesc, pResDesc, surfObject);
    VCUDA_REQUIRE_INIT();
    return object_descriptor(surfObject, object_desc::surface_resource, pResDesc, sizeof *pResDesc,
                             "cuSurfObjectGetResourceDesc");
}

VCUDA_API cuSurfObjectCreate(CUsurfObject* pSurfObject, const CUDA_RESOURCE_DESC* pResDesc) noexcept {
    VCUDA_TRACE_HOOK(cuSurfObjectCreate, pSurfObject, pResDesc);
    VCUDA_REQUIRE_INIT();
    if (!pSurfObject || !pResDesc) return CUDA_ERROR_INVALID_VALUE;
    if (pResDesc->resType == CU_RESOURCE_TYPE_ARRAY &&
        !valid_handle(reinterpret_cast<uint64_t>(pResDesc->res.array.hArray), handle_kind::array))
        return CUDA_ERROR_INVALID_HANDLE;
    surf_create_call c("cuSurfObjectCreate", bytes_of(pResDesc, sizeof *pResDesc));
    if (CUresult rc = c.send_sync(); rc != CUDA_SUCCESS) return rc;
    *pSurfObject = c.object();
    return CUDA_SUCCESS;
}

VCUDA_API cuSurfObjectDestroy(CUsurfObject surfObject) noexcept {
    VCUDA_TRACE_HOOK(cuSurfObjectDestroy, surfObject);
    VCUDA_REQUIRE_INIT();
    return surf_destroy_call("cuSurfObjectDestroy", surfObject).send_sync();
}
