// The software test driver: CUDA arrays, texture objects and surface objects. An array is host memory with a
// plain layout (soft_state.hpp: array_obj); 2D/3D copies reach it through soft_copy.cpp. Texture and surface
// objects live in a table of their own, guarded by its own mutex, so that host kernels (which run with the
// driver's lock released) can resolve them through soft_kernel.hpp's tex_read / surf_write / surf_read. Their
// values count from 1 in each context, texture and surface objects together, as the H200's driver (580)
// numbers them.
// Emulated exactly: point filtering at integer coordinates, clamp (wrap and mirror are treated as clamp) or
// border addressing, element formats of 1, 2 and 4 bytes per channel with 1, 2 or 4 channels.
// locks: the driver's state lock for arrays; objects_mu for the object table (never taken the other way
// round).
#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>

#include "soft_kernel.hpp"
#include "soft_state.hpp"

namespace vcuda::soft {
namespace {

// Bytes of one channel of `f`, 0 for formats not emulated.
size_t channel_bytes(CUarray_format f) {
    switch (f) {
        case CU_AD_FORMAT_UNSIGNED_INT8:
        case CU_AD_FORMAT_SIGNED_INT8:
            return 1;
        case CU_AD_FORMAT_UNSIGNED_INT16:
        case CU_AD_FORMAT_SIGNED_INT16:
        case CU_AD_FORMAT_HALF:
            return 2;
        case CU_AD_FORMAT_UNSIGNED_INT32:
        case CU_AD_FORMAT_SIGNED_INT32:
        case CU_AD_FORMAT_FLOAT:
            return 4;
        default:
            return 0;
    }
}

size_t element_bytes(CUarray_format f, unsigned channels) {
    if (channels != 1 && channels != 2 && channels != 4) return 0;
    return channel_bytes(f) * channels;
}

// One level of what a texture or surface object reads: `element` bytes at (x, y, z) of a pitch x rows x depth
// layout.
struct plane {
    std::byte* base = nullptr;
    size_t width = 0, rows = 1, depth = 1, pitch = 0;
};
struct view {
    bool surface = false;
    bool border = false;  // texture: out-of-range reads give zeros
    size_t element = 0;
    std::vector<plane> levels;  // one, or a mipmapped array's levels
    CUDA_RESOURCE_DESC res{};   // as created, for cuTexObjectGetResourceDesc
    CUDA_TEXTURE_DESC tex{};    // as created, for cuTexObjectGetTextureDesc
};

plane plane_of(array_obj& a) {
    return {a.data.data(), a.desc.Width, a.rows(), a.desc.Depth ? a.desc.Depth : 1, a.row_bytes()};
}

std::mutex objects_mu;
using object_key = std::pair<uint64_t, uint64_t>;  // context handle, the object's value
std::map<object_key, view>& objects() {
    static auto* m = new std::map<object_key, view>();
    return *m;
}
std::map<uint64_t, uint64_t>& last_value() {  // context handle -> the last value it gave; under objects_mu
    static auto* m = new std::map<uint64_t, uint64_t>();
    return *m;
}
thread_local uint64_t running_context = 0;  // the context of the kernel this thread runs

// The object `value` of the calling thread's context (a kernel's: the context it runs in), or end().
std::map<object_key, view>::iterator find_object(uint64_t value) {
    uint64_t ctx = running_context ? running_context : current_context_handle();
    return objects().find({ctx, value});
}

// The view a resource descriptor names (under the driver's lock).
CUresult view_of(state& s, const CUDA_RESOURCE_DESC& r, bool surface, view& v) {
    if (r.flags != 0) return CUDA_ERROR_INVALID_VALUE;
    v.res = r;
    v.surface = surface;
    switch (r.resType) {
        case CU_RESOURCE_TYPE_ARRAY: {
            auto* a = s.find<array_obj>(r.res.array.hArray);
            if (a == nullptr) return CUDA_ERROR_INVALID_HANDLE;
            if (surface && !(a->desc.Flags & CUDA_ARRAY3D_SURFACE_LDST)) return CUDA_ERROR_INVALID_VALUE;
            v.element = a->element;
            v.levels = {plane_of(*a)};
            return CUDA_SUCCESS;
        }
        case CU_RESOURCE_TYPE_MIPMAPPED_ARRAY: {
            auto* m = s.find<mipmapped_array_obj>(r.res.mipmap.hMipmappedArray);
            if (surface) return CUDA_ERROR_INVALID_VALUE;
            if (m == nullptr) return CUDA_ERROR_INVALID_HANDLE;
            for (uint64_t level : m->levels) {
                auto* a = s.find<array_obj>(level);
                v.element = a->element;
                v.levels.push_back(plane_of(*a));
            }
            return CUDA_SUCCESS;
        }
        case CU_RESOURCE_TYPE_LINEAR: {
            if (surface) return CUDA_ERROR_INVALID_VALUE;
            v.element = element_bytes(r.res.linear.format, r.res.linear.numChannels);
            if (v.element == 0 || r.res.linear.sizeInBytes < v.element) return CUDA_ERROR_INVALID_VALUE;
            uintptr_t p = static_cast<uintptr_t>(r.res.linear.devPtr);
            if (CUresult rc = check_device_range(s, p, r.res.linear.sizeInBytes, false); rc != CUDA_SUCCESS)
                return rc;
            v.levels = {{reinterpret_cast<std::byte*>(p), r.res.linear.sizeInBytes / v.element, 1, 1,
                         r.res.linear.sizeInBytes}};
            return CUDA_SUCCESS;
        }
        case CU_RESOURCE_TYPE_PITCH2D: {
            if (surface) return CUDA_ERROR_INVALID_VALUE;
            const auto& p2 = r.res.pitch2D;
            v.element = element_bytes(p2.format, p2.numChannels);
            size_t row = 0, extent = 0;
            if (v.element == 0 || p2.width == 0 || p2.height == 0 ||
                __builtin_mul_overflow(p2.width, v.element, &row) || p2.pitchInBytes < row ||
                __builtin_mul_overflow(p2.height - 1, p2.pitchInBytes, &extent) ||
                __builtin_add_overflow(extent, row, &extent))
                return CUDA_ERROR_INVALID_VALUE;
            uintptr_t p = static_cast<uintptr_t>(p2.devPtr);
            if (CUresult rc = check_device_range(s, p, extent, false); rc != CUDA_SUCCESS) return rc;
            v.levels = {{reinterpret_cast<std::byte*>(p), p2.width, p2.height, 1, p2.pitchInBytes}};
            return CUDA_SUCCESS;
        }
        default:
            return CUDA_ERROR_INVALID_VALUE;
    }
}

CUresult create_object(const CUDA_RESOURCE_DESC* r, const CUDA_TEXTURE_DESC* t, bool surface,
                       unsigned long long* out) {
    if (r == nullptr || out == nullptr || (!surface && t == nullptr)) return CUDA_ERROR_INVALID_VALUE;
    return entry([&](state& s) -> CUresult {
        context_obj* c = nullptr;
        if (CUresult rc = require_context(s, c); rc != CUDA_SUCCESS) return rc;
        view v;
        if (CUresult rc = view_of(s, *r, surface, v); rc != CUDA_SUCCESS) return rc;
        if (t) {
            v.border = t->addressMode[0] == CU_TR_ADDRESS_MODE_BORDER;
            v.tex = *t;
        }
        std::lock_guard lk(objects_mu);
        uint64_t value = ++last_value()[c->handle];
        objects()[{c->handle, value}] = v;
        *out = value;
        return CUDA_SUCCESS;
    });
}

CUresult destroy_object(uint64_t h, bool surface) {
    return entry([&](state&) -> CUresult {
        std::lock_guard lk(objects_mu);
        auto it = find_object(h);
        if (it == objects().end() || it->second.surface != surface) return CUDA_ERROR_INVALID_VALUE;
        objects().erase(it);
        return CUDA_SUCCESS;
    });
}

// Makes an array in the current context (under the driver's lock).
CUresult create_array_locked(state& s, const CUDA_ARRAY3D_DESCRIPTOR& d, CUarray* out) {
    const unsigned known = CUDA_ARRAY3D_SURFACE_LDST | CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_TEXTURE_GATHER;
    size_t element = element_bytes(d.Format, d.NumChannels);
    if (element == 0 || d.Width == 0 || (d.Flags & ~known) || (d.Depth && !d.Height))
        return CUDA_ERROR_INVALID_VALUE;
    size_t bytes = 0;
    if (__builtin_mul_overflow(d.Width, element, &bytes) ||
        __builtin_mul_overflow(bytes, d.Height ? d.Height : 1, &bytes) ||
        __builtin_mul_overflow(bytes, d.Depth ? d.Depth : 1, &bytes))
        return CUDA_ERROR_INVALID_VALUE;
    context_obj* c = nullptr;
    if (CUresult rc = require_context(s, c); rc != CUDA_SUCCESS) return rc;
    if (CUresult rc = charge(s, c->device, bytes); rc != CUDA_SUCCESS) return rc;
    auto* a = s.create<array_obj>();
    a->desc = d;
    a->element = element;
    a->data.resize(bytes);
    a->device = c->device;
    *out = to_handle<CUarray>(a->handle);
    return CUDA_SUCCESS;
}

CUresult create_array(const CUDA_ARRAY3D_DESCRIPTOR& d, CUarray* out) {
    if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
    return entry([&](state& s) -> CUresult { return create_array_locked(s, d, out); });
}

void destroy_array(state& s, array_obj& a) {
    uncharge(s, a.device, a.data.size());
    s.erase(a.handle);
}

void destroy_mipmapped(state& s, mipmapped_array_obj& m) {
    for (uint64_t level : m.levels)
        if (auto* a = s.find<array_obj>(level)) destroy_array(s, *a);
    s.erase(m.handle);
}

// The element at (x, y, z) of level `level` of an object, clamped or null when outside.
std::byte* element_at(view& v, size_t level, long x_elements, long y, long z) {
    if (level >= v.levels.size()) return nullptr;
    const plane& p = v.levels[level];
    auto fit = [&](long i, size_t n, bool& out) -> size_t {
        if (i >= 0 && static_cast<size_t>(i) < n) return static_cast<size_t>(i);
        out = true;
        return i < 0 ? 0 : n - 1;
    };
    bool out = false;
    size_t xi = fit(x_elements, p.width, out), yi = fit(y, p.rows, out), zi = fit(z, p.depth, out);
    if (out && (v.surface || v.border)) return nullptr;
    return p.base + (zi * p.rows + yi) * p.pitch + xi * v.element;
}

// Makes a mipmapped array of `levels` levels (under the driver's lock).
CUresult create_mipmapped(state& s, const CUDA_ARRAY3D_DESCRIPTOR& d, unsigned levels,
                          CUmipmappedArray* out) {
    size_t largest = std::max<size_t>({d.Width, d.Height, (d.Flags & CUDA_ARRAY3D_LAYERED) ? 0 : d.Depth});
    unsigned most = 1;
    while (most < 32 && (largest >> most) != 0) ++most;
    if (levels == 0 || levels > most) return CUDA_ERROR_INVALID_VALUE;
    auto* m = s.create<mipmapped_array_obj>();
    m->desc = d;
    auto halve = [](size_t n, unsigned l) { return n ? std::max<size_t>(1, n >> l) : 0; };
    for (unsigned l = 0; l < levels; ++l) {
        CUDA_ARRAY3D_DESCRIPTOR ld = d;
        ld.Width = halve(d.Width, l);
        ld.Height = halve(d.Height, l);
        ld.Depth = (d.Flags & CUDA_ARRAY3D_LAYERED) ? d.Depth : halve(d.Depth, l);
        CUarray a = nullptr;
        CUresult rc = create_array_locked(s, ld, &a);
        if (rc != CUDA_SUCCESS) {
            destroy_mipmapped(s, *m);
            return rc;
        }
        s.find<array_obj>(a)->mipmapped = m->handle;
        m->levels.push_back(reinterpret_cast<uint64_t>(a));
    }
    *out = to_handle<CUmipmappedArray>(m->handle);
    return CUDA_SUCCESS;
}

}  // namespace

running_in_context::running_in_context(uint64_t ctx) : previous(running_context) { running_context = ctx; }
running_in_context::~running_in_context() { running_context = previous; }

void forget_context_objects(uint64_t ctx) {
    std::lock_guard lk(objects_mu);
    auto& m = objects();
    m.erase(m.lower_bound({ctx, 0}), m.lower_bound({ctx + 1, 0}));
    last_value().erase(ctx);
}

bool tex_read_level(uint64_t object, unsigned level, long x, long y, long z, void* out, size_t n) {
    std::lock_guard lk(objects_mu);
    auto it = find_object(object);
    if (it == objects().end() || it->second.surface || n != it->second.element ||
        level >= it->second.levels.size())
        return false;
    std::byte* p = element_at(it->second, level, x, y, z);
    if (p)
        std::memcpy(out, p, n);
    else
        std::memset(out, 0, n);
    return true;
}

bool tex_read(uint64_t object, long x, long y, long z, void* out, size_t n) {
    return tex_read_level(object, 0, x, y, z, out, n);
}

bool surf_write(uint64_t object, long x_bytes, long y, long z, const void* in, size_t n) {
    std::lock_guard lk(objects_mu);
    auto it = find_object(object);
    if (it == objects().end() || !it->second.surface || n != it->second.element || x_bytes % long(n))
        return false;
    std::byte* p = element_at(it->second, 0, x_bytes / long(n), y, z);
    if (p == nullptr) return false;
    std::memcpy(p, in, n);
    return true;
}

bool surf_read(uint64_t object, long x_bytes, long y, long z, void* out, size_t n) {
    std::lock_guard lk(objects_mu);
    auto it = find_object(object);
    if (it == objects().end() || !it->second.surface || n != it->second.element || x_bytes % long(n))
        return false;
    std::byte* p = element_at(it->second, 0, x_bytes / long(n), y, z);
    if (p == nullptr) return false;
    std::memcpy(out, p, n);
    return true;
}

}  // namespace vcuda::soft

using namespace vcuda::soft;

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuArrayCreate_v2(CUarray* pHandle, const CUDA_ARRAY_DESCRIPTOR* d) {
    if (d == nullptr) return CUDA_ERROR_INVALID_VALUE;
    CUDA_ARRAY3D_DESCRIPTOR d3{};
    d3.Width = d->Width;
    d3.Height = d->Height;
    d3.Format = d->Format;
    d3.NumChannels = d->NumChannels;
    return guarded([&] { return create_array(d3, pHandle); });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuArray3DCreate_v2(CUarray* pHandle, const CUDA_ARRAY3D_DESCRIPTOR* d) {
    if (d == nullptr) return CUDA_ERROR_INVALID_VALUE;
    return guarded([&] { return create_array(*d, pHandle); });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuArrayDestroy(CUarray hArray) {
    return entry([&](state& s) -> CUresult {
        auto* a = s.find<array_obj>(hArray);
        if (a == nullptr) return CUDA_ERROR_INVALID_HANDLE;
        if (a->mipmapped) return CUDA_ERROR_INVALID_VALUE;  // a level: destroyed with its mipmapped array
        destroy_array(s, *a);
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuMipmappedArrayCreate(CUmipmappedArray* pHandle,
                                                          const CUDA_ARRAY3D_DESCRIPTOR* d,
                                                          unsigned int numMipmapLevels) {
    if (pHandle == nullptr || d == nullptr) return CUDA_ERROR_INVALID_VALUE;
    return guarded([&] {
        return entry([&](state& s) -> CUresult { return create_mipmapped(s, *d, numMipmapLevels, pHandle); });
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuMipmappedArrayGetLevel(CUarray* pLevelArray,
                                                            CUmipmappedArray hMipmappedArray,
                                                            unsigned int level) {
    if (pLevelArray == nullptr) return CUDA_ERROR_INVALID_VALUE;
    return entry([&](state& s) -> CUresult {
        auto* m = s.find<mipmapped_array_obj>(hMipmappedArray);
        if (m == nullptr) return CUDA_ERROR_INVALID_HANDLE;
        if (level >= m->levels.size()) return CUDA_ERROR_INVALID_VALUE;
        *pLevelArray = to_handle<CUarray>(m->levels[level]);
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray) {
    return entry([&](state& s) -> CUresult {
        auto* m = s.find<mipmapped_array_obj>(hMipmappedArray);
        if (m == nullptr) return CUDA_ERROR_INVALID_HANDLE;
        destroy_mipmapped(s, *m);
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuArray3DGetDescriptor_v2(CUDA_ARRAY3D_DESCRIPTOR* out, CUarray hArray) {
    if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
    return entry([&](state& s) -> CUresult {
        auto* a = s.find<array_obj>(hArray);
        if (a == nullptr) return CUDA_ERROR_INVALID_HANDLE;
        *out = a->desc;
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuArrayGetDescriptor_v2(CUDA_ARRAY_DESCRIPTOR* out, CUarray hArray) {
    if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
    return entry([&](state& s) -> CUresult {
        auto* a = s.find<array_obj>(hArray);
        if (a == nullptr) return CUDA_ERROR_INVALID_HANDLE;
        out->Width = a->desc.Width;
        out->Height = a->desc.Height;
        out->Format = a->desc.Format;
        out->NumChannels = a->desc.NumChannels;
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuTexObjectCreate(CUtexObject* pTexObject,
                                                     const CUDA_RESOURCE_DESC* pResDesc,
                                                     const CUDA_TEXTURE_DESC* pTexDesc,
                                                     const CUDA_RESOURCE_VIEW_DESC* pResViewDesc) {
    if (pResViewDesc != nullptr) return CUDA_ERROR_NOT_SUPPORTED;  // resource views are not emulated
    return guarded([&] { return create_object(pResDesc, pTexDesc, false, pTexObject); });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuTexObjectDestroy(CUtexObject texObject) {
    return guarded([&] { return destroy_object(texObject, false); });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuTexObjectGetResourceDesc(CUDA_RESOURCE_DESC* out,
                                                              CUtexObject texObject) {
    if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard lk(objects_mu);
    auto it = find_object(texObject);
    if (it == objects().end() || it->second.surface) return CUDA_ERROR_INVALID_VALUE;
    *out = it->second.res;
    return CUDA_SUCCESS;
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuTexObjectGetTextureDesc(CUDA_TEXTURE_DESC* out, CUtexObject texObject) {
    if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard lk(objects_mu);
    auto it = find_object(texObject);
    if (it == objects().end() || it->second.surface) return CUDA_ERROR_INVALID_VALUE;
    *out = it->second.tex;
    return CUDA_SUCCESS;
}

// Resource views are not emulated (cuTexObjectCreate refuses them): no texture object has one, which the
// driver answers with INVALID_VALUE.
VCUDA_SOFT_EXPORT CUresult CUDAAPI cuTexObjectGetResourceViewDesc(CUDA_RESOURCE_VIEW_DESC*, CUtexObject) {
    return CUDA_ERROR_INVALID_VALUE;
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuSurfObjectCreate(CUsurfObject* pSurfObject,
                                                      const CUDA_RESOURCE_DESC* pResDesc) {
    if (pResDesc != nullptr && pResDesc->resType != CU_RESOURCE_TYPE_ARRAY) return CUDA_ERROR_INVALID_VALUE;
    return guarded([&] { return create_object(pResDesc, nullptr, true, pSurfObject); });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuSurfObjectDestroy(CUsurfObject surfObject) {
    return guarded([&] { return destroy_object(surfObject, true); });
}
