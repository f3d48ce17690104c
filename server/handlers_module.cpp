// Hand-written ops for modules, libraries, kernels, functions and launches.
#include <algorithm>
#include <cstring>

#include "common/log.hpp"
#include "server/call_context.hpp"
#include "server/image_memory.hpp"
#include "server/jit.hpp"
#include "server/kernel_args.hpp"
#include "server/launch_attributes.hpp"
#include "server_ops.hpp"

namespace vcuda::server {

namespace {

constexpr size_t max_name = 4096;
// A fatbin wrapper of version 2 lists the fatbins of relocatable device code, one per source file linked:
// NCCL 2.28's holds hundreds. A bound on the arguments only (the bytes are bounded by the payload).
constexpr size_t max_image_parts = 16384;
constexpr size_t max_cached_image_bytes = size_t{1} << 30;  // per session

// A symbol name from blob 0: non-empty, bounded, no NUL inside.
bool name_arg(std::span<const std::byte> b, std::string& out) {
    if (b.empty() || b.size() > max_name) return false;
    out.assign(reinterpret_cast<const char*>(b.data()), b.size());
    return out.find('\0') == std::string::npos;
}

// The module or library `id` names, for ops that take either.
CUresult lookup_module_or_library(call_context& cx, uint64_t id, void*& raw, handle_entry& e) {
    CUresult rc = cx.lookup(id, handle_kind::module, raw, &e);
    return rc == CUDA_SUCCESS ? rc : cx.lookup(id, handle_kind::library, raw, &e);
}

// A function's or kernel's parameter layout, as the driver reports it. The driver needs a context current
// (cuKernelGetParamInfo answers CUDA_ERROR_INVALID_CONTEXT without one): a call that named no device gets the
// session's first context for the query. The list ends where the driver answers CUDA_ERROR_INVALID_VALUE; any
// other error fails the lookup, so that no handle is given out with a layout that is not the kernel's (a
// launch packed at a wrong layout hands the driver a parameter array it reads past).
template <class Query>
CUresult query_layout(call_context& cx, Query&& q, std::shared_ptr<param_layout>& out) {
    auto& d = cx.drv();
    CUcontext current = nullptr;
    if (d.cuCtxGetCurrent(&current) != CUDA_SUCCESS) current = nullptr;
    const bool borrowed = current == nullptr;
    if (borrowed) {
        CUresult rc;
        CUcontext ctx = cx.sess.first_context(rc);
        if (!ctx) return cx.fail(rc, "no context for the parameter layout query");
        d.cuCtxSetCurrent(ctx);
    }
    auto layout = std::make_shared<param_layout>();
    CUresult rc = driver_param_layout(q, *layout);
    if (borrowed) d.cuCtxSetCurrent(nullptr);
    if (rc == CUDA_SUCCESS && layout->params.size() == max_kernel_params)
        return cx.fail(CUDA_ERROR_INVALID_VALUE, "the kernel reports too many parameters");
    if (rc != CUDA_SUCCESS) {
        VCUDA_LOG_WARN("session {}: parameter layout query failed with error {}", cx.sess.id(),
                       static_cast<int>(rc));
        return cx.fail(rc, "the driver did not report the kernel's parameters");
    }
    out = std::move(layout);
    return CUDA_SUCCESS;
}

// What loading an image makes the driver hold (server/image_memory.hpp), charged before the driver loads it:
// to the module's device, or to every device of the session for a library (the driver loads a library into
// each context). All or nothing; `device` is the module's.
CUresult charge_load(call_context& cx, bool library, uint64_t bytes, size_t& device) {
    int current = cx.device_index();
    if (!library && (current < 0 || static_cast<size_t>(current) >= cx.sess.device_count()))
        return CUDA_SUCCESS;  // no context: the driver refuses the load
    device = library ? 0 : static_cast<size_t>(current);
    const size_t end = library ? cx.sess.device_count() : device + 1;
    std::lock_guard lock(cx.sess.mu);
    for (size_t i = device; i < end; ++i) {
        if (cx.sess.memory(i).charge(bytes)) continue;
        for (size_t j = device; j < i; ++j) cx.sess.memory(j).credit(bytes);
        return cx.fail(CUDA_ERROR_OUT_OF_MEMORY,
                       "loading this image makes the driver hold " + std::to_string(bytes) +
                           " bytes of device memory (code, constants, globals), which exceeds the session's "
                           "memory quota");
    }
    return CUDA_SUCCESS;
}

void credit_load(session& sess, bool library, uint64_t bytes, size_t device) {
    const size_t end = library ? sess.device_count() : device + 1;
    for (size_t i = device; i < end && i < sess.device_count(); ++i) sess.memory(i).credit(bytes);
}

void out_layout(call_context& cx, const param_layout& l) {
    cx.out(static_cast<uint64_t>(l.params.size()));
    for (auto [off, size] : l.params) {
        cx.out(static_cast<uint64_t>(off));
        cx.out(static_cast<uint64_t>(size));
    }
}

// What an image the driver refused holds, for the log: each part's kind and size and, for a fatbin, its
// entries (kind 1 PTX, 2 ELF; the architecture; flags, where compression shows).
std::string image_summary(uint64_t format, const image_cache::parts& parts) {
    std::string out = "format " + std::to_string(format);
    for (auto& part : parts) {
        const auto* b = reinterpret_cast<const unsigned char*>(part.data());
        const size_t n = part.size() * 8;
        uint32_t magic = 0;
        std::memcpy(&magic, b, sizeof magic);
        out += "; part of " + std::to_string(n) + " bytes, magic " + std::to_string(magic);
        if (magic != 0xBA55ED50u || n < 16) continue;
        uint16_t header = 0;
        uint64_t files = 0;
        std::memcpy(&header, b + 6, 2);
        std::memcpy(&files, b + 8, 8);
        out += ", fatbin entries:";
        for (size_t off = header, k = 0; off + 64 <= n && off < header + files && k < 64; ++k) {
            uint16_t kind = 0;
            uint32_t entry_header = 0, arch = 0;
            uint64_t size = 0, flags = 0;
            std::memcpy(&kind, b + off, 2);
            std::memcpy(&entry_header, b + off + 4, 4);
            std::memcpy(&size, b + off + 8, 8);
            std::memcpy(&arch, b + off + 28, 4);
            std::memcpy(&flags, b + off + 40, 8);
            out += " " + std::to_string(kind) + "/sm" + std::to_string(arch) + "/" + std::to_string(size) +
                   "/f" + std::to_string(flags);
            if (entry_header == 0) break;
            off += entry_header + size;
        }
    }
    return out;
}

}  // namespace

// args {target (0 module, 1 library), format (0 raw, 1 wrapper v1, 2 wrapper v2), hash, nparts, sizes...};
// payload = the parts back to back, or empty when the session already has this hash.
CUresult handle_module_load(call_context& cx) {
    if (cx.arg_count() < 4) return cx.bad_arguments();
    uint64_t target = cx.arg(0), format = cx.arg(1), hash = cx.arg(2), nparts = cx.arg(3);
    if (target > 1 || format > 2 || nparts == 0 || cx.arg_count() != 4 + nparts ||
        (format != 2 && nparts != 1))
        return cx.bad_arguments();
    if (nparts > max_image_parts)
        return cx.fail(CUDA_ERROR_INVALID_VALUE, "an image of " + std::to_string(nparts) +
                                                     " parts (at most " + std::to_string(max_image_parts) +
                                                     ")");
    auto payload = cx.payload();
    std::shared_ptr<const image_cache::parts> parts;
    {
        std::lock_guard lock(cx.sess.mu);
        if (payload.empty()) {
            parts = cx.sess.images.find(hash);
            if (!parts) return cx.fail(CUDA_ERROR_NOT_FOUND, "image not cached; send its bytes");
        } else {
            uint64_t total = 0;
            for (size_t i = 0; i < nparts; ++i) {
                if (cx.arg(4 + i) == 0 || __builtin_add_overflow(total, cx.arg(4 + i), &total))
                    return cx.bad_arguments();
            }
            if (total != payload.size())
                return cx.fail(CUDA_ERROR_INVALID_VALUE, "image part sizes do not add up");
            image_cache::parts copy;
            size_t off = 0;
            for (size_t i = 0; i < nparts; ++i) {
                size_t n = cx.arg(4 + i);
                std::vector<uint64_t> p((n + 7) / 8 + 1, 0);  // 8-byte aligned, zero-terminated for PTX
                std::memcpy(p.data(), payload.data() + off, n);
                off += n;
                copy.push_back(std::move(p));
            }
            parts = cx.sess.images.add(hash, std::move(copy), total, max_cached_image_bytes);
        }
    }
    // Blob 0, when there, holds the caller's JIT options: the reply then carries their values and the logs,
    // also when the load fails (the error log says why).
    jit_request jit;
    std::string why;
    if (cx.blob_count() > 0)
        if (CUresult rc = jit.parse(cx.blob(0), why); rc != CUDA_SUCCESS) return cx.fail(rc, why);
    if (target == 0 && !cx.drv().cuModuleLoadDataEx) return cx.unsupported("cuModuleLoadDataEx");
    if (target == 1 && !cx.drv().cuLibraryLoadData) return cx.unsupported("cuLibraryLoadData");
    auto bytes = load_device_bytes(format, *parts);
    if (!bytes) return cx.fail(CUDA_ERROR_INVALID_IMAGE, "malformed image: its tables point outside it");
    size_t device = 0;
    void* loaded = nullptr;
    CUresult rc = charge_load(cx, target == 1, *bytes, device);
    if (rc == CUDA_SUCCESS) {
        rc = load_image(cx.drv(), target == 1, format, *parts, jit, loaded);
        if (rc != CUDA_SUCCESS) {
            std::lock_guard lock(cx.sess.mu);
            credit_load(cx.sess, target == 1, *bytes, device);
        }
    }
    if (rc == CUDA_SUCCESS) {
        cx.out_handle(target == 0 ? handle_kind::module : handle_kind::library, loaded);
        // Kept so that a suspended session can load it again (server/session_image.cpp), and to credit the
        // charge at unload.
        module_origins::origin o{target == 1, format, parts, {}, *bytes, device};
        if (cx.blob_count() > 0) o.jit_options.assign(cx.blob(0).begin(), cx.blob(0).end());
        std::lock_guard lock(cx.sess.mu);
        cx.sess.origins.add(cx.outs.back(), std::move(o));
    }
    if (rc != CUDA_SUCCESS) {
        cx.out(uint64_t{0});
        VCUDA_LOG_INFO("session {}: the driver refused to load a {} with error {} ({}; JIT options: {})",
                       cx.sess.id(), target == 1 ? "library" : "module", static_cast<int>(rc),
                       image_summary(format, *parts), jit.count());
    }
    if (cx.blob_count() > 0) jit.answer(cx);
    return rc;
}

// Everything it owns (functions, kernels, globals, a library's module) goes with it.
CUresult handle_module_unload(call_context& cx, const module_unload_args& a) {
    const uint64_t id = a.module;
    void* raw = nullptr;
    handle_entry e;
    CUresult rc = lookup_module_or_library(cx, id, raw, e);
    if (rc != CUDA_SUCCESS) return rc;
    if (e.owned) return cx.fail(CUDA_ERROR_INVALID_HANDLE, "this module belongs to a library");
    auto& d = cx.drv();
    rc = e.kind == handle_kind::module ? d.cuModuleUnload(static_cast<CUmodule>(raw))
                                       : d.cuLibraryUnload(static_cast<CUlibrary>(raw));
    if (rc != CUDA_SUCCESS) return rc;
    std::lock_guard lock(cx.sess.mu);
    if (const auto* o = cx.sess.origins.find(id)) credit_load(cx.sess, o->library, o->charge, o->device);
    cx.sess.globals.erase_owner(id);
    cx.sess.origins.erase(id);
    cx.sess.handles.erase(id);  // with its functions, kernels and their functions (handle_table: dependents)
    return CUDA_SUCCESS;
}

CUresult handle_module_get_function(call_context& cx, const module_get_function_args& a) {
    std::string name;
    if (!name_arg(a.name, name)) return cx.bad_arguments();
    auto& d = cx.drv();
    CUfunction f = nullptr;
    if (CUresult rc = d.cuModuleGetFunction(&f, a.module, name.c_str()); rc != CUDA_SUCCESS) return rc;
    std::shared_ptr<param_layout> layout;
    if (CUresult rc = query_layout(
            cx, [&](size_t i, size_t* o, size_t* s) { return d.cuFuncGetParamInfo(f, i, o, s); }, layout);
        rc != CUDA_SUCCESS)
        return rc;
    cx.out_handle(handle_kind::function, f, a.module_id, true, layout);
    out_layout(cx, *layout);
    return CUDA_SUCCESS;
}

CUresult handle_library_get_kernel(call_context& cx, const library_get_kernel_args& a) {
    std::string name;
    if (!name_arg(a.name, name)) return cx.bad_arguments();
    auto& d = cx.drv();
    CUkernel k = nullptr;
    if (CUresult rc = d.cuLibraryGetKernel(&k, a.library, name.c_str()); rc != CUDA_SUCCESS) return rc;
    std::shared_ptr<param_layout> layout;
    if (CUresult rc = query_layout(
            cx, [&](size_t i, size_t* o, size_t* s) { return d.cuKernelGetParamInfo(k, i, o, s); }, layout);
        rc != CUDA_SUCCESS)
        return rc;
    cx.out_handle(handle_kind::kernel, k, a.library_id, true, layout);
    out_layout(cx, *layout);
    return CUDA_SUCCESS;
}

CUresult handle_kernel_get_function(call_context& cx, const kernel_get_function_args& a) {
    void* raw = nullptr;
    handle_entry e;
    if (CUresult rc = cx.lookup(a.kernel_id, handle_kind::kernel, raw, &e); rc != CUDA_SUCCESS) return rc;
    CUfunction f = nullptr;
    if (CUresult rc = cx.drv().cuKernelGetFunction(&f, a.kernel); rc != CUDA_SUCCESS) return rc;
    cx.out_handle(handle_kind::function, f, a.kernel_id, true, e.layout);
    return CUDA_SUCCESS;
}

CUresult handle_library_get_module(call_context& cx, const library_get_module_args& a) {
    CUmodule m = nullptr;
    if (CUresult rc = cx.drv().cuLibraryGetModule(&m, a.library); rc != CUDA_SUCCESS) return rc;
    cx.out_handle(handle_kind::module, m, a.library_id, true);
    return CUDA_SUCCESS;
}

// The client looks each name up as cuModuleGetFunction / cuLibraryGetKernel would, so the handles it hands
// out are the usual session handles with their parameter layouts.
CUresult handle_module_entries(call_context& cx, const module_entries_args& a) {
    void* raw = nullptr;
    handle_entry e;
    CUresult rc = lookup_module_or_library(cx, a.owner, raw, e);
    if (rc != CUDA_SUCCESS) return rc;
    auto& d = cx.drv();
    unsigned n = 0;
    std::vector<void*> entries;
    if (e.kind == handle_kind::module) {
        if (!d.cuModuleGetFunctionCount || !d.cuModuleEnumerateFunctions)
            return cx.unsupported("cuModuleEnumerateFunctions");
        if ((rc = d.cuModuleGetFunctionCount(&n, static_cast<CUmodule>(raw))) != CUDA_SUCCESS) return rc;
        entries.resize(n);
        rc = d.cuModuleEnumerateFunctions(reinterpret_cast<CUfunction*>(entries.data()), n,
                                          static_cast<CUmodule>(raw));
    } else {
        if (!d.cuLibraryGetKernelCount || !d.cuLibraryEnumerateKernels)
            return cx.unsupported("cuLibraryEnumerateKernels");
        if ((rc = d.cuLibraryGetKernelCount(&n, static_cast<CUlibrary>(raw))) != CUDA_SUCCESS) return rc;
        entries.resize(n);
        rc = d.cuLibraryEnumerateKernels(reinterpret_cast<CUkernel*>(entries.data()), n,
                                         static_cast<CUlibrary>(raw));
    }
    if (rc != CUDA_SUCCESS) return rc;
    std::vector<std::byte> names;
    for (void* x : entries) {
        const char* name = nullptr;
        rc = e.kind == handle_kind::module ? d.cuFuncGetName(&name, static_cast<CUfunction>(x))
                                           : d.cuKernelGetName(&name, static_cast<CUkernel>(x));
        if (rc != CUDA_SUCCESS) return rc;
        if (!name) return cx.fail(CUDA_ERROR_UNKNOWN, "the driver named no entry");
        const auto* b = reinterpret_cast<const std::byte*>(name);
        names.insert(names.end(), b, b + std::strlen(name) + 1);  // each with the NUL that ends it
    }
    cx.out(static_cast<uint64_t>(n));
    cx.out_blob(names);
    return CUDA_SUCCESS;
}

CUresult handle_module_get_global(call_context& cx, const module_get_global_args& a) {
    const bool managed = a.has_managed && a.managed;
    std::string name;
    if (!name_arg(a.name, name)) return cx.bad_arguments();
    void* raw = nullptr;
    handle_entry e;
    CUresult rc = lookup_module_or_library(cx, a.module, raw, e);
    if (rc != CUDA_SUCCESS) return rc;
    if (managed && e.kind != handle_kind::library) return CUDA_ERROR_INVALID_HANDLE;
    CUdeviceptr p = 0;
    size_t size = 0;
    const auto lib = static_cast<CUlibrary>(raw);
    if (managed && !cx.drv().cuLibraryGetManaged) return cx.unsupported("cuLibraryGetManaged");
    rc = e.kind == handle_kind::module
             ? cx.drv().cuModuleGetGlobal_v2(&p, &size, static_cast<CUmodule>(raw), name.c_str())
         : managed ? cx.drv().cuLibraryGetManaged(&p, &size, lib, name.c_str())
                   : cx.drv().cuLibraryGetGlobal(&p, &size, lib, name.c_str());
    if (rc != CUDA_SUCCESS) return rc;
    {
        std::lock_guard lock(cx.sess.mu);
        cx.sess.globals.add(p, size, a.module, static_cast<size_t>(cx.device_index()), name, managed);
    }
    cx.out(p);
    cx.out(static_cast<uint64_t>(size));
    return CUDA_SUCCESS;
}

namespace {
// The launch attributes in blob `i` (n of them), checked, their events the driver's (`events`: the session
// handles of those recorded). False (with the reply's error set) when malformed.
CUresult launch_attributes(call_context& cx, size_t i, uint64_t n, std::vector<CUlaunchAttribute>& attrs,
                           std::vector<uint64_t>* events = nullptr) {
    auto bytes = cx.blob(i);
    if (n > 64 || bytes.size() != n * sizeof(CUlaunchAttribute)) return cx.bad_arguments();
    attrs.resize(n);
    std::memcpy(attrs.data(), bytes.data(), bytes.size());
    for (auto& a : attrs) {
        if (plain_launch_attribute(a.id)) continue;
        CUevent* e = launch_attribute_event(a);
        if (!e)  // a handle the server would have to translate
            return cx.fail(CUDA_ERROR_NOT_SUPPORTED,
                           "launch attribute " + std::to_string(a.id) + " not supported");
        const auto id = reinterpret_cast<uint64_t>(*e);
        void* raw = nullptr;
        if (CUresult rc = cx.lookup(id, handle_kind::event, raw); rc != CUDA_SUCCESS) return rc;
        *e = static_cast<CUevent>(raw);
        if (events) events->push_back(id);
    }
    return CUDA_SUCCESS;
}
}  // namespace

// `function` may be a kernel too (the lookup takes either).
CUresult handle_occupancy_clusters(call_context& cx, const occupancy_clusters_args& a) {
    std::vector<CUlaunchAttribute> attrs;
    if (CUresult rc = launch_attributes(cx, 0, a.count, attrs); rc != CUDA_SUCCESS) return rc;
    CUlaunchConfig config{a.grid_x,  a.grid_y, a.grid_z, a.block_x,    a.block_y,
                          a.block_z, a.shared, a.stream, attrs.data(), static_cast<unsigned>(attrs.size())};
    auto& d = cx.drv();
    int answer = 0;
    CUresult rc;
    if (a.what == 0) {
        if (!d.cuOccupancyMaxActiveClusters) return cx.unsupported("cuOccupancyMaxActiveClusters");
        rc = d.cuOccupancyMaxActiveClusters(&answer, a.function, &config);
    } else if (a.what == 1) {
        if (!d.cuOccupancyMaxPotentialClusterSize)
            return cx.unsupported("cuOccupancyMaxPotentialClusterSize");
        rc = d.cuOccupancyMaxPotentialClusterSize(&answer, a.function, &config);
    } else {
        return cx.bad_arguments();
    }
    if (rc == CUDA_SUCCESS) cx.out(answer);
    return rc;
}

// args {function or kernel, grid xyz, block xyz, shared bytes, stream, form (0 kernelParams, 1 extra buffer),
// number of launch attributes}; blobs {parameter buffer, attributes}.
CUresult handle_launch(call_context& cx) {
    if (!cx.expect_args(11) || cx.blob_count() > 2) return cx.bad_arguments();
    void* raw = nullptr;
    handle_entry e;
    if (CUresult rc = cx.lookup(cx.arg(0), handle_kind::function, raw, &e); rc != CUDA_SUCCESS) return rc;
    CUstream s;
    if (CUresult rc = cx.handle(8, handle_kind::stream, s); rc != CUDA_SUCCESS) return rc;
    unsigned dims[7];
    if (CUresult rc = launch_dims(cx, 1, dims); rc != CUDA_SUCCESS) return rc;
    uint64_t n_attrs = cx.arg(10);
    kernel_args params;
    if (CUresult rc = params.set(cx, cx.blob(0), cx.arg(9), e); rc != CUDA_SUCCESS) return rc;
    auto& d = cx.drv();
    auto f = static_cast<CUfunction>(raw);
    if (n_attrs == 0)
        return d.cuLaunchKernel(f, dims[0], dims[1], dims[2], dims[3], dims[4], dims[5], dims[6], s,
                                params.kernel_params(), params.extra());
    std::vector<CUlaunchAttribute> attrs;
    std::vector<uint64_t> recorded;
    if (CUresult rc = launch_attributes(cx, 1, n_attrs, attrs, &recorded); rc != CUDA_SUCCESS) return rc;
    CUlaunchConfig config{};
    set_dims(config, dims);
    config.hStream = s;
    config.attrs = attrs.data();
    config.numAttrs = static_cast<unsigned>(n_attrs);
    if (!d.cuLaunchKernelEx) return cx.unsupported("cuLaunchKernelEx");
    CUresult rc = d.cuLaunchKernelEx(&config, f, params.kernel_params(), params.extra());
    if (rc == CUDA_SUCCESS && !recorded.empty()) {  // recorded again, as by cuEventRecord: no age kept
        std::lock_guard lock(cx.sess.mu);
        for (uint64_t e : recorded) cx.sess.event_times.forget(e);
    }
    return rc;
}

CUresult launch_dims(call_context& cx, size_t first, unsigned (&dims)[7]) {
    for (size_t i = 0; i < 7; ++i) {
        if (cx.arg(first + i) > 0xffffffffu) return cx.bad_arguments();
        dims[i] = static_cast<unsigned>(cx.arg(first + i));
    }
    return CUDA_SUCCESS;
}

namespace {
// A launch whose parameters do not match the kernel: refused and logged (the first few per lane: a client
// sending many must not fill the log).
CUresult refuse_launch(call_context& cx, std::string why) {
    if (cx.lane.refused_launches++ < 8) VCUDA_LOG_WARN("session {}: launch refused: {}", cx.sess.id(), why);
    return cx.fail(CUDA_ERROR_INVALID_VALUE, std::move(why));
}
}  // namespace

CUresult kernel_args::set(call_context& cx, std::span<const std::byte> block, uint64_t form,
                          const handle_entry& e) {
    if (form > 1) return cx.bad_arguments();
    form_ = form;
    if (!e.layout) return refuse_launch(cx, "the kernel's parameter layout is unknown");
    const size_t need = e.layout->total();
    // Parameters copied into 8-byte-aligned storage, zero-filled up to the kernel's whole parameter space;
    // kernelParams point into it at the server's own layout.
    const size_t words = (std::max(block.size(), need) + 7) / 8 + 1;
    uint64_t* storage = small_storage_;
    if (words > small_words) {
        big_storage_.resize(words);
        storage = big_storage_.data();
    }
    auto* base = reinterpret_cast<char*>(storage);
    std::memcpy(base, block.data(), block.size());
    std::memset(base + block.size(), 0, words * 8 - block.size());  // only what the client did not send
    // Pointers into module globals the driver placed elsewhere since the application learnt their address.
    cx.sess.globals.relocate_params({reinterpret_cast<std::byte*>(base), block.size()}, *e.layout);
    size_ = block.size();
    extra_[0] = CU_LAUNCH_PARAM_BUFFER_POINTER;
    extra_[1] = base;
    extra_[2] = CU_LAUNCH_PARAM_BUFFER_SIZE;
    extra_[3] = &size_;
    extra_[4] = CU_LAUNCH_PARAM_END;
    // The driver reads the kernel's parameters at its own layout, through one kernelParams pointer per
    // parameter: a block that does not cover them exactly is refused before the driver sees it. An `extra`
    // buffer may be shorter than the parameter space, as natively (NCCL passes the bytes of its work that it
    // uses of a 4 KiB parameter): the driver takes the bytes the buffer's size names, and whatever it might
    // read beyond them is the zeroed storage above, never memory past what the client sent.
    if (form == 1) return CUDA_SUCCESS;
    if (block.size() != need)
        return refuse_launch(cx, "the parameter block holds " + std::to_string(block.size()) +
                                     " bytes, the kernel's " + std::to_string(e.layout->params.size()) +
                                     " parameters " + std::to_string(need));
    if (e.layout->params.size() > small_params) {
        big_pointers_.resize(e.layout->params.size());
        pointers_ = big_pointers_.data();
    }
    for (size_t i = 0; i < e.layout->params.size(); ++i) pointers_[i] = base + e.layout->params[i].first;
    return CUDA_SUCCESS;
}

}  // namespace vcuda::server
