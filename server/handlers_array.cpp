// Hand-written ops for CUDA arrays, mipmapped arrays, texture objects and surface objects
// (protocol/spec/driver.spec, ids 390-397, 420-421). Arrays are session handles whose bytes (rows rounded up
// to 512 bytes, as the driver lays them out) are charged to the device's quota before the driver makes them;
// a mipmapped array is charged for all its levels, whose arrays are handles it owns. Texture and surface
// objects are the driver's own 64-bit values, answered to the client because kernels receive them by value;
// the session keeps which are its own (array_tables), so destroy and queries refuse any other value. A
// resource descriptor names an array by the session's handle (translated here) or device memory (checked
// against the session's allocations). runs on: the lane's thread. locks: the session's `mu` around its
// tables, never across a driver call that may block.
#include "server/handlers_array.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

#include "common/log.hpp"
#include "server/call_context.hpp"
#include "server_ops.hpp"

namespace vcuda::server {

namespace {

// Bytes of one element of `f` with `channels` channels; 0 for formats vcuda does not serve.
uint64_t element_bytes(uint64_t f, uint64_t channels) {
    if (channels != 1 && channels != 2 && channels != 4) return 0;
    switch (f) {
        case CU_AD_FORMAT_UNSIGNED_INT8:
        case CU_AD_FORMAT_SIGNED_INT8:
            return channels;
        case CU_AD_FORMAT_UNSIGNED_INT16:
        case CU_AD_FORMAT_SIGNED_INT16:
        case CU_AD_FORMAT_HALF:
            return 2 * channels;
        case CU_AD_FORMAT_UNSIGNED_INT32:
        case CU_AD_FORMAT_SIGNED_INT32:
        case CU_AD_FORMAT_FLOAT:
            return 4 * channels;
        default:
            return 0;
    }
}

CUresult current_device(call_context& cx, size_t& device) {
    int d = cx.device_index();
    if (d < 0 || static_cast<size_t>(d) >= cx.sess.device_count())
        return cx.fail(CUDA_ERROR_INVALID_CONTEXT, "no current context");
    device = static_cast<size_t>(d);
    return CUDA_SUCCESS;
}

// A blob that is exactly one T.
template <class T>
bool bytes_as(std::span<const std::byte> b, T& out) {
    if (b.size() != sizeof(T)) return false;
    std::memcpy(&out, b.data(), sizeof(T));
    return true;
}

// The resource descriptor as the driver must see it: the session's array handle replaced by the driver's,
// device memory checked against the session's own.
CUresult translate_resource(call_context& cx, CUDA_RESOURCE_DESC& r, bool surface) {
    if (r.flags != 0) return cx.fail(CUDA_ERROR_INVALID_VALUE, "resource descriptor flags must be 0");
    switch (r.resType) {
        case CU_RESOURCE_TYPE_ARRAY: {
            void* raw = nullptr;
            uint64_t id = reinterpret_cast<uint64_t>(r.res.array.hArray);
            if (CUresult rc = cx.lookup(id, handle_kind::array, raw); rc != CUDA_SUCCESS) return rc;
            r.res.array.hArray = static_cast<CUarray>(raw);
            return CUDA_SUCCESS;
        }
        case CU_RESOURCE_TYPE_LINEAR: {
            if (surface) break;
            auto& l = r.res.linear;
            const uint64_t elem = element_bytes(l.format, l.numChannels);
            if (!elem || l.sizeInBytes == 0) return cx.fail(CUDA_ERROR_INVALID_VALUE, "bad linear resource");
            // The driver does not check the size against the allocation, and programs rely on it
            // (convolutionFFT2D sizes a texture with padding its source allocation lacks). Past what the
            // session owns the driver must not read: the texture is cut at its end, where fetches return
            // zero instead of another allocation's bytes.
            size_t owned = cx.owned_prefix(l.devPtr, l.sizeInBytes);
            if (owned < elem)
                return cx.fail(CUDA_ERROR_INVALID_VALUE, "address range not owned by this session");
            if (owned < l.sizeInBytes) {
                VCUDA_LOG_DEBUG(
                    "session {}: linear texture of {} bytes at {:#x} cut to the {} bytes the session owns",
                    cx.sess.id(), l.sizeInBytes, l.devPtr, owned / elem * elem);
                l.sizeInBytes = owned / elem * elem;
            }
            return CUDA_SUCCESS;
        }
        case CU_RESOURCE_TYPE_PITCH2D: {
            if (surface) break;
            auto& p = r.res.pitch2D;
            uint64_t elem = element_bytes(p.format, p.numChannels), row, span;
            if (!elem || !p.width || !p.height || !mul_add(p.width, elem, 0, row) || p.pitchInBytes < row ||
                !mul_add(p.height - 1, p.pitchInBytes, row, span))
                return cx.fail(CUDA_ERROR_INVALID_VALUE, "bad pitch2D resource");
            return cx.device_range(p.devPtr, span);
        }
        case CU_RESOURCE_TYPE_MIPMAPPED_ARRAY: {
            if (surface) break;
            void* raw = nullptr;
            uint64_t id = reinterpret_cast<uint64_t>(r.res.mipmap.hMipmappedArray);
            if (CUresult rc = cx.lookup(id, handle_kind::mipmapped_array, raw); rc != CUDA_SUCCESS) return rc;
            r.res.mipmap.hMipmappedArray = static_cast<CUmipmappedArray>(raw);
            return CUDA_SUCCESS;
        }
        default:
            break;
    }
    return cx.fail(CUDA_ERROR_INVALID_VALUE, "bad resource type");
}

// Records a texture or surface object the driver made from `made` (translate_resource's result); the
// session's handle stands in it for the driver's array, so that a suspend or a move can make it again.
void keep_object(call_context& cx, uint64_t value, size_t device, array_tables::object o,
                 const CUDA_RESOURCE_DESC& made) {
    o.made = made;
    if (made.resType == CU_RESOURCE_TYPE_ARRAY) o.made.res.array.hArray = o.res.res.array.hArray;
    if (made.resType == CU_RESOURCE_TYPE_MIPMAPPED_ARRAY)
        o.made.res.mipmap.hMipmappedArray = o.res.res.mipmap.hMipmappedArray;
    std::lock_guard lock(cx.sess.mu);
    cx.sess.arrays.objects[{device, value}] = o;
}

// Forgets the session's object `value` (of the right kind, of the current device) and destroys it.
CUresult destroy_object(call_context& cx, uint64_t value, bool surface) {
    size_t device;
    if (CUresult rc = current_device(cx, device); rc != CUDA_SUCCESS) return rc;
    {
        std::lock_guard lock(cx.sess.mu);
        auto it = cx.sess.arrays.objects.find({device, value});
        if (it == cx.sess.arrays.objects.end() || it->second.surface != surface)
            return cx.fail(CUDA_ERROR_INVALID_VALUE, surface ? "not a surface object of this session"
                                                             : "not a texture object of this session");
        cx.sess.arrays.objects.erase(it);
    }
    return surface ? cx.drv().cuSurfObjectDestroy(value) : cx.drv().cuTexObjectDestroy(value);
}

}  // namespace

void destroy_driver_array(const driver_table& d, const handle_entry& e) {
    if (!e.raw) return;
    if (e.kind == handle_kind::mipmapped_array)
        d.cuMipmappedArrayDestroy(static_cast<CUmipmappedArray>(e.raw));
    else if (e.kind == handle_kind::array && !e.owned)
        d.cuArrayDestroy(static_cast<CUarray>(e.raw));
}

uint64_t packed_row_bytes(const CUDA_ARRAY3D_DESCRIPTOR& d) {
    return d.Width * element_bytes(d.Format, d.NumChannels);
}

uint64_t packed_bytes(const CUDA_ARRAY3D_DESCRIPTOR& d) {
    return packed_row_bytes(d) * (d.Height ? d.Height : 1) * (d.Depth ? d.Depth : 1);
}

CUDA_ARRAY3D_DESCRIPTOR mipmap_level(const CUDA_ARRAY3D_DESCRIPTOR& d, unsigned level) {
    auto halve = [level](size_t n) -> size_t { return n ? std::max<size_t>(1, n >> level) : 0; };
    CUDA_ARRAY3D_DESCRIPTOR ld = d;
    ld.Width = halve(d.Width);
    ld.Height = halve(d.Height);
    ld.Depth = (d.Flags & CUDA_ARRAY3D_LAYERED) ? d.Depth : halve(d.Depth);
    return ld;
}

CUresult array_box(call_context& cx, uint64_t id, uint64_t x, uint64_t y, uint64_t z, uint64_t w, uint64_t h,
                   uint64_t depth, CUarray& out) {
    void* raw = nullptr;
    if (CUresult rc = cx.lookup(id, handle_kind::array, raw); rc != CUDA_SUCCESS) return rc;
    std::lock_guard lock(cx.sess.mu);
    auto it = cx.sess.arrays.arrays.find(id);
    if (it == cx.sess.arrays.arrays.end()) return CUDA_ERROR_INVALID_HANDLE;
    const auto& d = it->second.desc;
    uint64_t row = d.Width * element_bytes(d.Format, d.NumChannels), xe, ye, ze;
    uint64_t rows = d.Height ? d.Height : 1, slices = d.Depth ? d.Depth : 1;
    if (!mul_add(1, x, w, xe) || xe > row || !mul_add(1, y, h, ye) || ye > rows ||
        !mul_add(1, z, depth, ze) || ze > slices)
        return CUDA_ERROR_INVALID_VALUE;
    out = static_cast<CUarray>(raw);
    return CUDA_SUCCESS;
}

namespace {

// The descriptor {width, height, depth, format, channels, flags} and the bytes it takes (rows rounded up to
// 512 bytes), or a refusal. `three_d`: a cuArray3DCreate descriptor (depth and flags allowed).
CUresult array_args(call_context& cx, bool three_d, uint64_t width, uint64_t height, uint64_t depth,
                    uint64_t format, uint64_t channels, uint64_t flags, CUDA_ARRAY3D_DESCRIPTOR& d,
                    uint64_t& bytes) {
    constexpr uint64_t limit = uint64_t{1} << 20;  // past any dimension the driver allows
    // Layered, surface load/store, cubemap, texture gather, depth texture, colour attachment; not sparse.
    constexpr uint64_t known_flags = 0x3f;
    uint64_t elem = element_bytes(format, channels);
    if (!elem) return cx.fail(CUDA_ERROR_INVALID_VALUE, "array format or channel count not served");
    if (!width || width > limit || height > limit || depth > limit || (flags & ~known_flags) ||
        (!three_d && (depth || flags)) || (depth && !height && !(flags & CUDA_ARRAY3D_LAYERED)))
        return cx.fail(CUDA_ERROR_INVALID_VALUE, "bad array descriptor");
    uint64_t row = (width * elem + 511) / 512 * 512;
    if (!mul_add(row, height ? height : 1, 0, bytes) || !mul_add(bytes, depth ? depth : 1, 0, bytes))
        return cx.fail(CUDA_ERROR_INVALID_VALUE, "array too large");
    d = {};
    d.Width = width;
    d.Height = height;
    d.Depth = depth;
    d.Format = static_cast<CUarray_format>(format);
    d.NumChannels = static_cast<unsigned>(channels);
    d.Flags = static_cast<unsigned>(flags);
    return CUDA_SUCCESS;
}

// Charges `bytes` to the session's quota on `device`.
CUresult charge_array(call_context& cx, size_t device, uint64_t bytes) {
    std::lock_guard lock(cx.sess.mu);
    if (!cx.sess.memory(device).charge(bytes))
        return cx.fail(CUDA_ERROR_OUT_OF_MEMORY,
                       "array of " + std::to_string(bytes) + " bytes exceeds the session's memory quota");
    return CUDA_SUCCESS;
}

void credit_array(call_context& cx, size_t device, uint64_t bytes) {
    std::lock_guard lock(cx.sess.mu);
    cx.sess.memory(device).credit(bytes);
}

}  // namespace

CUresult handle_array_create(call_context& cx, const array_create_args& a) {
    const bool three_d = a.three_d;
    CUDA_ARRAY3D_DESCRIPTOR d{};
    uint64_t bytes = 0;
    if (CUresult rc =
            array_args(cx, three_d, a.width, a.height, a.depth, a.format, a.channels, a.flags, d, bytes);
        rc != CUDA_SUCCESS)
        return rc;
    size_t device;
    if (CUresult rc = current_device(cx, device); rc != CUDA_SUCCESS) return rc;
    if (CUresult rc = charge_array(cx, device, bytes); rc != CUDA_SUCCESS) return rc;
    CUarray made = nullptr;
    CUresult rc;
    if (three_d) {
        rc = cx.drv().cuArray3DCreate_v2(&made, &d);
    } else {
        CUDA_ARRAY_DESCRIPTOR d2{};
        d2.Width = d.Width;
        d2.Height = d.Height;
        d2.Format = d.Format;
        d2.NumChannels = d.NumChannels;
        rc = cx.drv().cuArrayCreate_v2(&made, &d2);
    }
    if (rc != CUDA_SUCCESS) {
        credit_array(cx, device, bytes);
        return rc;
    }
    cx.out_handle(handle_kind::array, made);
    std::lock_guard lock(cx.sess.mu);
    cx.sess.arrays.arrays[cx.outs.back()] = {device, bytes, d};
    return CUDA_SUCCESS;
}

// Level l is the descriptor with every extent halved l times (at least 1; a layered array keeps its layers),
// charged with the mipmapped array.
CUresult handle_mipmapped_array_create(call_context& cx, const mipmapped_array_create_args& a) {
    CUDA_ARRAY3D_DESCRIPTOR d{};
    uint64_t bytes = 0;
    if (CUresult rc =
            array_args(cx, true, a.width, a.height, a.depth, a.format, a.channels, a.flags, d, bytes);
        rc != CUDA_SUCCESS)
        return rc;
    const bool layered = d.Flags & CUDA_ARRAY3D_LAYERED;
    const uint64_t largest = std::max({d.Width, d.Height, layered ? size_t{0} : d.Depth});
    const uint64_t levels = a.levels;
    if (levels == 0 || levels > 64 || (largest >> (levels - 1)) == 0)
        return cx.fail(CUDA_ERROR_INVALID_VALUE, "bad number of mipmap levels");
    std::vector<CUDA_ARRAY3D_DESCRIPTOR> level_desc(levels);
    bytes = 0;
    for (uint64_t l = 0; l < levels; ++l) {
        auto& ld = level_desc[l] = mipmap_level(d, static_cast<unsigned>(l));
        uint64_t row = (ld.Width * element_bytes(d.Format, d.NumChannels) + 511) / 512 * 512, level_bytes;
        if (!mul_add(row, ld.Height ? ld.Height : 1, 0, level_bytes) ||
            !mul_add(level_bytes, ld.Depth ? ld.Depth : 1, bytes, bytes))
            return cx.fail(CUDA_ERROR_INVALID_VALUE, "array too large");
    }
    size_t device;
    if (CUresult rc = current_device(cx, device); rc != CUDA_SUCCESS) return rc;
    auto& drv = cx.drv();
    if (!drv.cuMipmappedArrayCreate || !drv.cuMipmappedArrayGetLevel || !drv.cuMipmappedArrayDestroy)
        return cx.unsupported("cuMipmappedArrayCreate");
    if (CUresult rc = charge_array(cx, device, bytes); rc != CUDA_SUCCESS) return rc;
    CUmipmappedArray m = nullptr;
    CUresult rc = drv.cuMipmappedArrayCreate(&m, &d, static_cast<unsigned>(levels));
    std::vector<CUarray> level_arrays(levels);
    for (uint64_t l = 0; rc == CUDA_SUCCESS && l < levels; ++l)
        rc = drv.cuMipmappedArrayGetLevel(&level_arrays[l], m, static_cast<unsigned>(l));
    if (rc != CUDA_SUCCESS) {
        if (m) drv.cuMipmappedArrayDestroy(m);
        credit_array(cx, device, bytes);
        return rc;
    }
    cx.out_handle(handle_kind::mipmapped_array, m);
    const uint64_t id = cx.outs.back();
    for (uint64_t l = 0; l < levels; ++l)
        cx.out_handle(handle_kind::array, level_arrays[l], id, /*owned=*/true);
    std::lock_guard lock(cx.sess.mu);
    cx.sess.arrays.arrays[id] = {device, bytes, d};
    for (uint64_t l = 0; l < levels; ++l)
        cx.sess.arrays.arrays[cx.outs[1 + l]] = {device, 0, level_desc[l], static_cast<unsigned>(l)};
    return CUDA_SUCCESS;
}

// Its levels go with it.
CUresult handle_mipmapped_array_destroy(call_context& cx, const mipmapped_array_destroy_args& a) {
    if (CUresult rc = cx.drv().cuMipmappedArrayDestroy(a.mipmapped); rc != CUDA_SUCCESS) return rc;
    const uint64_t id = a.mipmapped_id;
    std::lock_guard lock(cx.sess.mu);
    std::vector<uint64_t> levels;
    cx.sess.handles.for_each([&](uint64_t level, handle_entry& e) {
        if (e.kind == handle_kind::array && e.owner == id) levels.push_back(level);
    });
    for (uint64_t level : levels) {
        cx.sess.handles.erase(level);
        cx.sess.arrays.arrays.erase(level);
    }
    if (auto it = cx.sess.arrays.arrays.find(id); it != cx.sess.arrays.arrays.end()) {
        cx.sess.memory(it->second.device).credit(it->second.bytes);
        cx.sess.arrays.arrays.erase(it);
    }
    return CUDA_SUCCESS;
}

CUresult handle_array_destroy(call_context& cx, const array_destroy_args& a) {
    void* raw = nullptr;
    handle_entry e;
    if (CUresult rc = cx.lookup(a.array_id, handle_kind::array, raw, &e); rc != CUDA_SUCCESS) return rc;
    if (e.owned)
        return cx.fail(CUDA_ERROR_INVALID_VALUE,
                       "a level of a mipmapped array: it is destroyed with its mipmapped array");
    if (CUresult rc = cx.drv().cuArrayDestroy(a.array); rc != CUDA_SUCCESS) return rc;
    std::lock_guard lock(cx.sess.mu);
    if (auto it = cx.sess.arrays.arrays.find(a.array_id); it != cx.sess.arrays.arrays.end()) {
        cx.sess.memory(it->second.device).credit(it->second.bytes);
        cx.sess.arrays.arrays.erase(it);
    }
    return CUDA_SUCCESS;
}

CUresult handle_array_descriptor(call_context& cx, const array_descriptor_args& a) {
    CUDA_ARRAY3D_DESCRIPTOR d{};
    if (CUresult rc = cx.drv().cuArray3DGetDescriptor_v2(&d, a.array); rc != CUDA_SUCCESS) return rc;
    cx.out(static_cast<uint64_t>(d.Width));
    cx.out(static_cast<uint64_t>(d.Height));
    cx.out(static_cast<uint64_t>(d.Depth));
    cx.out(static_cast<unsigned>(d.Format));
    cx.out(d.NumChannels);
    cx.out(d.Flags);
    return CUDA_SUCCESS;
}

CUresult handle_tex_create(call_context& cx, const tex_create_args& a) {
    CUDA_RESOURCE_DESC r{};
    CUDA_TEXTURE_DESC t{};
    CUDA_RESOURCE_VIEW_DESC v{};
    const bool view = !a.view.empty();
    if (!bytes_as(a.resource, r) || !bytes_as(a.texture, t) || (view && !bytes_as(a.view, v)))
        return cx.bad_arguments();
    size_t device;
    if (CUresult rc = current_device(cx, device); rc != CUDA_SUCCESS) return rc;
    const CUDA_RESOURCE_DESC as_given = r;
    if (CUresult rc = translate_resource(cx, r, false); rc != CUDA_SUCCESS) return rc;
    CUtexObject o = 0;
    if (CUresult rc = cx.drv().cuTexObjectCreate(&o, &r, &t, view ? &v : nullptr); rc != CUDA_SUCCESS)
        return rc;
    keep_object(cx, o, device, {false, as_given, {}, t, view, v}, r);
    cx.out(static_cast<uint64_t>(o));
    return CUDA_SUCCESS;
}

CUresult handle_tex_destroy(call_context& cx, const tex_destroy_args& a) {
    return destroy_object(cx, a.object, false);
}

// args {object[, which]}. Blob out: which 0 (or absent), a texture object's resource desc as created (the
// session's array handles in it); 1 its texture desc and 2 its resource view desc, as the driver answers; 3 a
// surface object's resource desc as created.
CUresult handle_tex_resource_desc(call_context& cx, const tex_resource_desc_args& a) {
    const unsigned which = a.has_which ? a.which : 0;
    if (which > 3) return cx.bad_arguments();
    const bool surface = which == 3;
    const uint64_t value = a.object;
    size_t device;
    if (CUresult rc = current_device(cx, device); rc != CUDA_SUCCESS) return rc;
    // Held through the driver's answer too (a query that does not wait for the GPU), so that the value cannot
    // be destroyed and made again meanwhile.
    std::lock_guard lock(cx.sess.mu);
    auto it = cx.sess.arrays.objects.find({device, value});
    if (it == cx.sess.arrays.objects.end() || it->second.surface != surface)
        return cx.fail(CUDA_ERROR_INVALID_VALUE, surface ? "not a surface object of this session"
                                                         : "not a texture object of this session");
    if (which == 0 || which == 3) {
        cx.out_blob({reinterpret_cast<const std::byte*>(&it->second.res), sizeof(CUDA_RESOURCE_DESC)});
        return CUDA_SUCCESS;
    }
    auto& d = cx.drv();
    if (which == 1) {
        CUDA_TEXTURE_DESC t{};
        if (!d.cuTexObjectGetTextureDesc) return cx.unsupported("cuTexObjectGetTextureDesc");
        if (CUresult rc = d.cuTexObjectGetTextureDesc(&t, value); rc != CUDA_SUCCESS) return rc;
        cx.out_blob({reinterpret_cast<const std::byte*>(&t), sizeof t});
        return CUDA_SUCCESS;
    }
    CUDA_RESOURCE_VIEW_DESC v{};
    if (!d.cuTexObjectGetResourceViewDesc) return cx.unsupported("cuTexObjectGetResourceViewDesc");
    if (CUresult rc = d.cuTexObjectGetResourceViewDesc(&v, value); rc != CUDA_SUCCESS) return rc;
    cx.out_blob({reinterpret_cast<const std::byte*>(&v), sizeof v});
    return CUDA_SUCCESS;
}

CUresult handle_surf_create(call_context& cx, const surf_create_args& a) {
    CUDA_RESOURCE_DESC r{};
    if (!bytes_as(a.resource, r)) return cx.bad_arguments();
    if (r.resType != CU_RESOURCE_TYPE_ARRAY)
        return cx.fail(CUDA_ERROR_INVALID_VALUE, "a surface object needs an array");
    size_t device;
    if (CUresult rc = current_device(cx, device); rc != CUDA_SUCCESS) return rc;
    const CUDA_RESOURCE_DESC as_given = r;
    if (CUresult rc = translate_resource(cx, r, true); rc != CUDA_SUCCESS) return rc;
    CUsurfObject o = 0;
    if (CUresult rc = cx.drv().cuSurfObjectCreate(&o, &r); rc != CUDA_SUCCESS) return rc;
    keep_object(cx, o, device, {true, as_given, {}, {}, false, {}}, r);
    cx.out(static_cast<uint64_t>(o));
    return CUDA_SUCCESS;
}

CUresult handle_surf_destroy(call_context& cx, const surf_destroy_args& a) {
    return destroy_object(cx, a.object, true);
}

}  // namespace vcuda::server
