// CUDA arrays and mipmapped arrays in a suspend or a move (server/session_image.cpp). An array is an opaque
// layout of the driver's, so its contents are read out with a 3D copy into packed rows, and the array is made
// again from its descriptor (kept in the session's array table) and filled the same way; its handle id then
// stands for the new array. A mipmapped array is made again with as many levels, each level's handle standing
// for the new level.
//
// Texture and surface objects: kernels hold their values, which the driver gives, not vcuda. The driver
// numbers them in each context from 1, texture and surface objects together, and does not give a value twice
// (seen on the H200, driver 580: tests/gpu/probes/texture_values.cpp). So in the new context they are made
// again in the order of their values, with a stand-in made for each value that was given and is gone, and the
// stand-ins are destroyed after. A value that comes back otherwise fails the rebuild: no kernel may read
// another object than the one it names.
#include <cstring>
#include <map>
#include <vector>

#include "common/wire.hpp"
#include "server/handlers_array.hpp"
#include "server/session.hpp"
#include "server/session_image.hpp"

namespace vcuda::server {

namespace {

// A copy of all of an array made with `d`, between the array and packed rows on the host: the caller names
// the two sides. A context is current when it runs.
CUDA_MEMCPY3D whole_array(const CUDA_ARRAY3D_DESCRIPTOR& d) {
    CUDA_MEMCPY3D c{};
    c.WidthInBytes = packed_row_bytes(d);
    c.Height = d.Height ? d.Height : 1;
    c.Depth = d.Depth ? d.Depth : 1;
    return c;
}

CUresult copy_out(const driver_table& drv, CUarray a, const CUDA_ARRAY3D_DESCRIPTOR& d, std::byte* host) {
    CUDA_MEMCPY3D c = whole_array(d);
    c.srcMemoryType = CU_MEMORYTYPE_ARRAY;
    c.srcArray = a;
    c.dstMemoryType = CU_MEMORYTYPE_HOST;
    c.dstHost = host;
    c.dstPitch = c.WidthInBytes;
    c.dstHeight = c.Height;
    return drv.cuMemcpy3D_v2(&c);
}

CUresult copy_in(const driver_table& drv, CUarray a, const CUDA_ARRAY3D_DESCRIPTOR& d,
                 const std::byte* host) {
    CUDA_MEMCPY3D c = whole_array(d);
    c.srcMemoryType = CU_MEMORYTYPE_HOST;
    c.srcHost = host;
    c.srcPitch = c.WidthInBytes;
    c.srcHeight = c.Height;
    c.dstMemoryType = CU_MEMORYTYPE_ARRAY;
    c.dstArray = a;
    return drv.cuMemcpy3D_v2(&c);
}

// At most this many stand-ins a rebuild makes (values given and gone below the largest held): a program that
// makes and destroys objects without end is not suspended or moved, instead of a rebuild that takes minutes.
constexpr uint64_t max_stand_ins = uint64_t{1} << 16;
// At most this many objects in a moved session's state (a bound on what the sender may ask for).
constexpr size_t max_moved_objects = size_t{1} << 20;

}  // namespace

std::string session::objects_blocker() const {
    std::map<size_t, std::pair<uint64_t, uint64_t>> per_device;  // device -> objects held, largest value
    for (auto& [key, o] : arrays.objects) {
        auto& [held, largest] = per_device[key.first];
        ++held;
        largest = std::max(largest, key.second);
    }
    uint64_t gaps = 0;
    for (auto& [device, p] : per_device) gaps += p.second - p.first;
    if (gaps <= max_stand_ins) return {};
    return "texture or surface objects whose values are too far apart (" + std::to_string(gaps) +
           " values made and destroyed below those held)";
}

CUresult session::rebuild_objects(std::string& what) {
    auto& d = api();
    struct stand_in {
        size_t device;
        uint64_t value;
        bool surface;
    };
    std::vector<stand_in> stand_ins;
    auto drop_stand_ins = [&] {
        for (auto& s : stand_ins) {
            d.cuCtxSetCurrent(devices_[s.device].ctx);
            (s.surface ? d.cuSurfObjectDestroy : d.cuTexObjectDestroy)(s.value);
        }
    };
    // In (device, value) order, the table's own.
    for (auto& [key, o] : arrays.objects) {
        const auto [device, value] = key;
        if (device >= devices_.size() || !devices_[device].ctx) {
            drop_stand_ins();
            what = "a texture or surface object has no context";
            return CUDA_ERROR_INVALID_CONTEXT;
        }
        d.cuCtxSetCurrent(devices_[device].ctx);
        // The resource as the driver must see it now: the session's array made again, or its memory, which
        // kept its addresses (checked again: a moved session's table came from another server).
        CUDA_RESOURCE_DESC r = o.made;
        bool owned = r.flags == 0;
        if (r.resType == CU_RESOURCE_TYPE_ARRAY || r.resType == CU_RESOURCE_TYPE_MIPMAPPED_ARRAY) {
            const bool mip = r.resType == CU_RESOURCE_TYPE_MIPMAPPED_ARRAY;
            const uint64_t id = mip ? reinterpret_cast<uint64_t>(r.res.mipmap.hMipmappedArray)
                                    : reinterpret_cast<uint64_t>(r.res.array.hArray);
            const handle_entry* e = handles.find(id, mip ? handle_kind::mipmapped_array : handle_kind::array);
            owned = owned && e && e->raw && static_cast<size_t>(e->device) == device;
            if (owned && mip) r.res.mipmap.hMipmappedArray = static_cast<CUmipmappedArray>(e->raw);
            if (owned && !mip) r.res.array.hArray = static_cast<CUarray>(e->raw);
        } else if (r.resType == CU_RESOURCE_TYPE_LINEAR && !o.surface) {
            const auto& l = r.res.linear;
            owned = owned && l.sizeInBytes &&
                    (owns_range_locked(l.devPtr, l.sizeInBytes) || host.holding(l.devPtr, l.sizeInBytes));
        } else if (r.resType == CU_RESOURCE_TYPE_PITCH2D && !o.surface) {
            const auto& p = r.res.pitch2D;
            uint64_t span = 0;
            owned = owned && p.height && mul_add(p.height - 1, p.pitchInBytes, p.pitchInBytes, span) &&
                    (owns_range_locked(p.devPtr, span) || host.holding(p.devPtr, span));
        } else {
            owned = false;
        }
        if (!owned) {
            drop_stand_ins();
            what = "texture or surface object " + std::to_string(value) +
                   " reads what the session does not hold";
            return CUDA_ERROR_INVALID_VALUE;
        }
        for (;;) {
            unsigned long long got = 0;
            CUresult rc = o.surface ? d.cuSurfObjectCreate(&got, &r)
                                    : d.cuTexObjectCreate(&got, &r, &o.tex, o.has_view ? &o.view : nullptr);
            if (rc != CUDA_SUCCESS) {
                drop_stand_ins();
                what = "texture or surface object " + std::to_string(value) + " could not be made again";
                return rc;
            }
            if (got == value) break;
            if (got > value || stand_ins.size() >= max_stand_ins) {
                (o.surface ? d.cuSurfObjectDestroy : d.cuTexObjectDestroy)(got);
                drop_stand_ins();
                what = "texture or surface object " + std::to_string(value) + " came back as " +
                       std::to_string(got) + ", and kernels hold the first";
                return CUDA_ERROR_NOT_SUPPORTED;
            }
            stand_ins.push_back({device, got, o.surface});
        }
    }
    drop_stand_ins();
    return CUDA_SUCCESS;
}

CUresult session::take_moved_objects(const wire::SessionState& st, std::string& why) {
    if (!st.objects()) return CUDA_SUCCESS;
    if (st.objects()->size() > max_moved_objects) {
        why = "the moved session's state is malformed: too many texture or surface objects";
        return CUDA_ERROR_INVALID_VALUE;
    }
    for (const auto* m : *st.objects()) {
        array_tables::object o;
        o.surface = m->surface();
        o.has_view = m->view() && m->view()->size() > 0;
        const size_t device = m->device();
        if (device >= devices_.size() || !allowed(device) || m->value() == 0 ||
            arrays.objects.count({device, m->value()}) || !vector_as(m->resource(), o.res) ||
            !vector_as(m->made(), o.made) || (!o.surface && !vector_as(m->texture(), o.tex)) ||
            (o.has_view && !vector_as(m->view(), o.view))) {
            why = "the moved session's state is malformed: a texture or surface object";
            return CUDA_ERROR_INVALID_VALUE;
        }
        arrays.objects[{device, m->value()}] = o;  // what it reads is checked when it is made again
    }
    return CUDA_SUCCESS;
}

CUresult session::save_arrays(session_image& img, std::string& why) {
    auto& d = api();
    for (auto& [id, a] : arrays.arrays) {
        const handle_entry* e = handles.find(id, kind_of(id));
        if (!e || e->owned) continue;  // a level: saved with its mipmapped array
        if (a.device >= devices_.size() || !devices_[a.device].ctx) {
            why = "a CUDA array is on a GPU without a context";
            return CUDA_ERROR_NOT_SUPPORTED;
        }
        d.cuCtxSetCurrent(devices_[a.device].ctx);
        session_image::array_state st;
        st.id = id;
        std::vector<std::pair<CUarray, CUDA_ARRAY3D_DESCRIPTOR>> parts;
        if (e->kind == handle_kind::mipmapped_array) {
            struct level {
                uint64_t id;
                CUarray raw;
                CUDA_ARRAY3D_DESCRIPTOR desc;
            };
            std::map<unsigned, level> by_level;
            for (auto& [level_id, l] : arrays.arrays)
                if (const handle_entry* le = handles.find(level_id, handle_kind::array);
                    le && le->owner == id)
                    by_level[l.level] = {level_id, static_cast<CUarray>(le->raw), l.desc};
            for (auto& [n, l] : by_level) {
                st.levels.push_back(l.id);
                parts.emplace_back(l.raw, l.desc);
            }
        } else {
            parts.emplace_back(static_cast<CUarray>(e->raw), a.desc);
        }
        size_t total = 0;
        for (auto& [raw, desc] : parts) total += packed_bytes(desc);
        st.bytes.resize(total);
        std::byte* at = st.bytes.data();
        for (auto& [raw, desc] : parts) {
            if (CUresult rc = copy_out(d, raw, desc, at); rc != CUDA_SUCCESS) {
                why = "a CUDA array could not be copied out (" + error_text(rc) + ")";
                return rc;
            }
            at += packed_bytes(desc);
        }
        img.bytes += total;
        img.arrays.push_back(std::move(st));
    }
    return CUDA_SUCCESS;
}

void session::release_arrays() {
    auto& d = api();
    for (auto& [id, a] : arrays.arrays) {
        handle_entry* e = handles.find(id, kind_of(id));
        if (!e || !e->raw) continue;
        if (a.device < devices_.size() && devices_[a.device].ctx) {
            d.cuCtxSetCurrent(devices_[a.device].ctx);
            destroy_driver_array(d, *e);
        }
        handles.rebind(id, nullptr);
    }
}

CUresult session::rebuild_arrays(const session_image& img, std::string& what) {
    auto& d = api();
    for (auto& st : img.arrays) {
        auto a = arrays.arrays.find(st.id);
        handle_entry* e = handles.find(st.id, kind_of(st.id));
        if (a == arrays.arrays.end() || !e || a->second.device >= devices_.size() ||
            !devices_[a->second.device].ctx) {
            what = "a CUDA array has no context";
            return CUDA_ERROR_INVALID_CONTEXT;
        }
        d.cuCtxSetCurrent(devices_[a->second.device].ctx);
        std::vector<std::pair<CUarray, CUDA_ARRAY3D_DESCRIPTOR>> parts;
        CUresult rc;
        if (e->kind == handle_kind::mipmapped_array) {
            CUmipmappedArray m = nullptr;
            rc = d.cuMipmappedArrayCreate(&m, &a->second.desc, static_cast<unsigned>(st.levels.size()));
            if (rc == CUDA_SUCCESS) handles.rebind(st.id, m);
            for (unsigned l = 0; rc == CUDA_SUCCESS && l < st.levels.size(); ++l) {
                CUarray level = nullptr;
                rc = d.cuMipmappedArrayGetLevel(&level, m, l);
                if (rc == CUDA_SUCCESS) {
                    handles.rebind(st.levels[l], level);
                    parts.emplace_back(level, arrays.arrays.at(st.levels[l]).desc);
                }
            }
        } else {
            CUarray made = nullptr;
            rc = d.cuArray3DCreate_v2(&made, &a->second.desc);
            if (rc == CUDA_SUCCESS) {
                handles.rebind(st.id, made);
                parts.emplace_back(made, a->second.desc);
            }
        }
        const std::byte* at = st.bytes.data();
        for (auto& [raw, desc] : parts) {
            if (rc != CUDA_SUCCESS) break;
            rc = copy_in(d, raw, desc, at);
            at += packed_bytes(desc);
        }
        if (rc != CUDA_SUCCESS) {  // what was made goes with release_arrays
            what = "a CUDA array could not be made again (" + error_text(rc) + ")";
            return rc;
        }
    }
    return CUDA_SUCCESS;
}

CUresult session::take_moved_arrays(const wire::SessionState& st, session_image& img, std::string& why) {
    if (!st.arrays()) return CUDA_SUCCESS;
    auto bad = [&](const std::string& what) {
        why = "the moved session's state is malformed: " + what;
        return CUDA_ERROR_INVALID_VALUE;
    };
    constexpr uint64_t extent_limit = uint64_t{1} << 20;  // as handlers_array.cpp accepts
    for (const auto* m : *st.arrays()) {
        const size_t device = m->device();
        const handle_entry* e = handles.find(m->id(), kind_of(m->id()));
        const bool mipmapped = e && e->kind == handle_kind::mipmapped_array;
        CUDA_ARRAY3D_DESCRIPTOR desc;
        if (!e || (e->kind != handle_kind::array && !mipmapped) || e->owned || device >= devices_.size() ||
            !allowed(device) || !vector_as(m->descriptor(), desc) || arrays.arrays.count(m->id()) ||
            (mipmapped != (m->levels() && m->levels()->size() > 0)) ||
            (m->levels() && m->levels()->size() > 64))
            return bad("a CUDA array");
        if (!desc.Width || desc.Width > extent_limit || desc.Height > extent_limit ||
            desc.Depth > extent_limit || !packed_row_bytes(desc))
            return bad("a CUDA array's descriptor");
        session_image::array_state s;
        s.id = m->id();
        uint64_t total = 0;
        std::vector<std::pair<uint64_t, CUDA_ARRAY3D_DESCRIPTOR>> levels;
        if (mipmapped) {
            for (unsigned l = 0; l < m->levels()->size(); ++l) {
                const uint64_t level_id = m->levels()->Get(l);
                const handle_entry* le = handles.find(level_id, handle_kind::array);
                if (!le || le->owner != m->id() || arrays.arrays.count(level_id))
                    return bad("a mipmapped array's level");
                levels.emplace_back(level_id, mipmap_level(desc, l));
                s.levels.push_back(level_id);
            }
        } else {
            levels.emplace_back(0, desc);
        }
        for (auto& [level_id, ld] : levels) {
            uint64_t part = 0;
            if (!mul_add(packed_row_bytes(ld), ld.Height ? ld.Height : 1, 0, part) ||
                !mul_add(part, ld.Depth ? ld.Depth : 1, 0, part) || !mul_add(1, total, part, total))
                return bad("a CUDA array's size");
        }
        if (!m->bytes() || m->bytes()->size() != total) return bad("a CUDA array's contents");
        if (!devices_[device].memory->charge(m->charge())) {
            why = "its CUDA arrays exceed its memory quota here";
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        arrays.arrays[m->id()] = {device, m->charge(), desc, 0};
        for (unsigned l = 0; mipmapped && l < levels.size(); ++l)
            arrays.arrays[levels[l].first] = {device, 0, levels[l].second, l};
        s.bytes.assign(reinterpret_cast<const std::byte*>(m->bytes()->data()),
                       reinterpret_cast<const std::byte*>(m->bytes()->data()) + total);
        img.arrays.push_back(std::move(s));
    }
    return CUDA_SUCCESS;
}

}  // namespace vcuda::server
