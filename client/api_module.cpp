// Modules, libraries, kernels and functions. Images go to the server once per content hash; parameter
// layouts come back with each function or kernel and are kept in the mirror, so launches and parameter
// queries need no further message.
#include <cstdlib>
#include <cstring>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "client/entry_point.hpp"
#include "client/images.hpp"
#include "client/jit.hpp"
#include "client/managed.hpp"
#include "client/plain_call.hpp"
#include "client/remote_call.hpp"
#include "client/state.hpp"
#include "client/trace.hpp"
#include "client_ops.hpp"
#include "common/log.hpp"

using namespace vcuda;
using namespace vcuda::client;

namespace {

enum class target : uint64_t { module = 0, library = 1 };

// Names handed to the application (cuKernelGetName) must outlive the call: interned for the process.
const char* intern(const std::string& s) {
    static std::mutex mu;
    static auto* pool = new std::set<std::string>();
    std::lock_guard lock(mu);
    return pool->insert(s).first->c_str();
}

}  // namespace

namespace vcuda::client {
CUresult load_parts(uint64_t t, uint64_t format, uint64_t hash,
                    const std::vector<std::span<const std::byte>>& parts, uint64_t& handle);
}

namespace {

// Loads an image into the session of the current device (sending the bytes unless that session has them),
// with the caller's JIT options when `jit` has some: their answers (logs, sizes) are written back also when
// the load fails.
CUresult load_image(uint64_t t, uint64_t format, uint64_t hash,
                    const std::vector<std::span<const std::byte>>& parts, uint64_t& handle,
                    const jit_call& jit) {
    auto& st = state::get();
    bool send = !st.image_sent(hash);
    for (int attempt = 0; attempt < 2; ++attempt) {
        std::vector<uint64_t> args = {t, format, hash, parts.size()};
        size_t total = 0;
        for (auto& p : parts) {
            args.push_back(p.size());
            total += p.size();
        }
        std::vector<std::byte> payload;
        if (send) {
            payload.reserve(total);
            for (auto& p : parts) payload.insert(payload.end(), p.begin(), p.end());
        }
        lane* l = st.remote().this_thread_lane();
        if (!l) return static_cast<CUresult>(connection_lost_result);
        const std::span<const std::byte> blobs[1] = {jit.blob()};
        call_request rq;
        rq.operation = op::module_load;
        rq.device = current_server_device();
        rq.args = args;
        if (jit.count) rq.blobs = blobs;
        rq.payload = payload;
        call_reply rp;
        auto rc = static_cast<CUresult>(l->call(rq, rp));
        if (rc == CUDA_ERROR_NOT_FOUND && !send) {  // the server no longer has it: send the bytes this time
            send = true;
            continue;
        }
        if (jit.count && !rp.outs.empty() && !jit.answer(rp, 1) && rc == CUDA_SUCCESS)
            return CUDA_ERROR_UNKNOWN;
        if (rc != CUDA_SUCCESS) {  // applications try images that may fail (bad PTX): a debug line only
            VCUDA_LOG_DEBUG("loading a code image of {} part(s), {} bytes, failed with error {}{}{}",
                            parts.size(), total, static_cast<int>(rc), rp.detail.empty() ? "" : ": ",
                            rp.detail);
            return rc;
        }
        if (rp.outs.empty()) return CUDA_ERROR_UNKNOWN;
        handle = rp.outs[0];
        st.mark_image_sent(hash);
        st.journal().made(op::module_load, args, handle);
        return CUDA_SUCCESS;
    }
    return CUDA_ERROR_UNKNOWN;
}

}  // namespace

CUresult vcuda::client::load_parts(uint64_t t, uint64_t format, uint64_t hash,
                                   const std::vector<std::span<const std::byte>>& parts, uint64_t& handle) {
    return load_image(t, format, hash, parts, handle, jit_call{});
}

namespace {

CUresult load(target t, const void* code, uint64_t& handle, const jit_call& jit = {}) {
    VCUDA_REQUIRE_INIT();
    if (!code) return CUDA_ERROR_INVALID_VALUE;
    // Libraries are context-independent (cudart loads them eagerly before any context is current); modules
    // belong to the current context.
    if (t == target::module && current_device() < 0) return CUDA_ERROR_INVALID_CONTEXT;
    image img;
    if (!describe_image(code, img)) return CUDA_ERROR_INVALID_IMAGE;
    auto& st = state::get();
    if (CUresult rc = load_image(static_cast<uint64_t>(t), static_cast<uint64_t>(img.format), img.hash,
                                 img.parts, handle, jit);
        rc != CUDA_SUCCESS)
        return rc;
    handle_info info;
    info.kind = t == target::module ? handle_kind::module : handle_kind::library;
    info.ctx = current_context();
    info.device = current_device();
    if (t == target::library && st.session_count() > 1) {
        auto parts = std::make_shared<std::vector<std::vector<std::byte>>>();
        for (auto& p : img.parts) parts->emplace_back(p.begin(), p.end());
        info.image_parts = std::move(parts);
        info.image_format = static_cast<uint64_t>(img.format);
        info.image_hash = img.hash;
    }
    st.adopt(handle, info);
    return CUDA_SUCCESS;
}

CUresult unload(uint64_t h, handle_kind k) {
    VCUDA_REQUIRE_INIT();
    if (!state::get().known(h, k)) return CUDA_ERROR_INVALID_HANDLE;
    CUresult rc =
        module_unload_call(k == handle_kind::library ? "cuLibraryUnload" : "cuModuleUnload", h).send_sync();
    if (rc == CUDA_SUCCESS) {
        state::get().forget(h);
        if (k == handle_kind::library) managed_release_library(h);
    }
    return rc;
}

// Adopts a function or kernel from a reply: outs = {handle, nparams, offset0, size0, ...}.
CUresult adopt_entry(const call_reply& rp, handle_kind k, uint64_t owner, const std::string& name,
                     uint64_t& out) {
    if (rp.outs.size() < 2 || rp.outs.size() != 2 + 2 * rp.outs[1]) return CUDA_ERROR_UNKNOWN;
    auto layout = std::make_shared<param_layout>();
    for (size_t i = 0; i < rp.outs[1]; ++i)
        layout->params.emplace_back(static_cast<uint32_t>(rp.outs[2 + 2 * i]),
                                    static_cast<uint32_t>(rp.outs[3 + 2 * i]));
    handle_info info;
    info.kind = k;
    info.ctx = current_context();
    info.device = current_device();
    info.owner = owner;
    info.name = name;
    info.layout = std::move(layout);
    out = rp.outs[0];
    state::get().adopt(out, std::move(info));
    return CUDA_SUCCESS;
}

std::span<const std::byte> name_blob(const char* name) {
    return {reinterpret_cast<const std::byte*>(name), std::strlen(name)};
}

CUresult get_entry(op o, uint64_t owner, handle_kind owner_kind, handle_kind k, const char* name,
                   uint64_t& out) {
    VCUDA_REQUIRE_INIT();
    if (!name) return CUDA_ERROR_INVALID_VALUE;
    if (!state::get().known(owner, owner_kind)) return CUDA_ERROR_INVALID_HANDLE;
    call_reply rp;
    CUresult rc = remote(o, {state::get().route(owner)}, mode::sync, &rp, {}, {name_blob(name)});
    if (rc != CUDA_SUCCESS) return rc;
    return adopt_entry(rp, k, owner, name, out);
}

// The names of a module's functions or a library's kernels, in the driver's order.
CUresult entry_names(uint64_t owner, handle_kind owner_kind, std::vector<std::string>& names) {
    VCUDA_REQUIRE_INIT();
    if (!state::get().known(owner, owner_kind)) return CUDA_ERROR_INVALID_HANDLE;
    module_entries_call c("cuModuleEnumerateFunctions", state::get().route(owner));
    if (CUresult rc = c.send_sync(); rc != CUDA_SUCCESS) return rc;
    const auto all = c.names();  // each name ends with a NUL
    names.clear();
    for (size_t at = 0; at < all.size();) {
        const auto* start = reinterpret_cast<const char*>(all.data() + at);
        const size_t len = strnlen(start, all.size() - at);
        if (at + len == all.size()) return CUDA_ERROR_UNKNOWN;  // no NUL: not this protocol
        names.emplace_back(start, len);
        at += len + 1;
    }
    if (names.size() != c.count()) return CUDA_ERROR_UNKNOWN;
    return CUDA_SUCCESS;
}

CUresult entry_count(uint64_t owner, handle_kind owner_kind, unsigned* count) {
    if (!count) return CUDA_ERROR_INVALID_VALUE;
    std::vector<std::string> names;
    CUresult rc = entry_names(owner, owner_kind, names);
    if (rc == CUDA_SUCCESS) *count = static_cast<unsigned>(names.size());
    return rc;
}

// Up to `n` handles, each looked up by name as cuModuleGetFunction / cuLibraryGetKernel do.
CUresult enumerate_entries(uint64_t owner, handle_kind owner_kind, op get, handle_kind k, uint64_t* out,
                           unsigned n) {
    if (!out || n == 0) return CUDA_ERROR_INVALID_VALUE;
    std::vector<std::string> names;
    CUresult rc = entry_names(owner, owner_kind, names);
    for (size_t i = 0; rc == CUDA_SUCCESS && i < names.size() && i < n; ++i)
        rc = get_entry(get, owner, owner_kind, k, names[i].c_str(), out[i]);
    return rc;
}

// managed: a library's __managed__ variable (cuLibraryGetManaged), which gets a CPU view at its address.
CUresult get_global(uint64_t owner, handle_kind owner_kind, CUdeviceptr* dptr, size_t* bytes,
                    const char* name, bool managed = false) {
    VCUDA_REQUIRE_INIT();
    if (!name) return CUDA_ERROR_INVALID_VALUE;
    if (!state::get().known(owner, owner_kind)) return CUDA_ERROR_INVALID_HANDLE;
    // cudart asks for __managed__ variables before any context is current (a library belongs to none): then
    // they are looked up, and later fetched and written back, in device 0's primary context.
    const uint64_t ctx = managed && current_context() == 0 ? state::get().primary_context(0) : 0;
    std::optional<context_scope> in_primary;
    if (ctx) in_primary.emplace(ctx);
    const uint64_t route = state::get().route(owner);
    module_get_global_call c(managed ? "cuLibraryGetManaged" : "cuModuleGetGlobal", route, name_blob(name),
                             managed ? std::optional(true) : std::nullopt);
    if (CUresult rc = c.send_sync(); rc != CUDA_SUCCESS) return rc;
    if (c.reply().outs.size() != 2) return CUDA_ERROR_UNKNOWN;
    const CUdeviceptr p = c.address();
    const size_t size = c.size();
    if (managed)
        if (CUresult rc = managed_adopt_variable(p, size, current_device(), current_context(), owner);
            rc != CUDA_SUCCESS)
            return rc;
    state::get().add_allocation(p, size, current_device(), true, managed);
    if (dptr) *dptr = p;
    if (bytes) *bytes = size;
    return CUDA_SUCCESS;
}

CUresult param_info(uint64_t h, handle_kind k, size_t index, size_t* offset, size_t* size) {
    VCUDA_REQUIRE_INIT();
    handle_info info;
    if (!state::get().lookup(h, info) || info.kind != k) return CUDA_ERROR_INVALID_HANDLE;
    if (!info.layout || index >= info.layout->params.size()) return CUDA_ERROR_INVALID_VALUE;
    if (offset) *offset = info.layout->params[index].first;
    if (size) *size = info.layout->params[index].second;
    return CUDA_SUCCESS;
}

}  // namespace

VCUDA_API cuModuleGetLoadingMode(CUmoduleLoadingMode* mode) noexcept {
    VCUDA_TRACE_HOOK(cuModuleGetLoadingMode, mode);
    if (!mode) return CUDA_ERROR_INVALID_VALUE;
    const char* env = std::getenv("CUDA_MODULE_LOADING");
    *mode = env && std::strcmp(env, "EAGER") == 0 ? CU_MODULE_EAGER_LOADING : CU_MODULE_LAZY_LOADING;
    return CUDA_SUCCESS;
}

VCUDA_API cuModuleLoadData(CUmodule* module, const void* image) noexcept {
    VCUDA_TRACE_HOOK(cuModuleLoadData, module, image);
    if (!module) return CUDA_ERROR_INVALID_VALUE;
    uint64_t h = 0;
    CUresult rc = load(target::module, image, h);
    if (rc == CUDA_SUCCESS) *module = reinterpret_cast<CUmodule>(h);
    return rc;
}

VCUDA_API cuModuleLoadDataEx(CUmodule* module, const void* image, unsigned int numOptions,
                             CUjit_option* options, void** optionValues) noexcept {
    VCUDA_TRACE_HOOK(cuModuleLoadDataEx, module, image, numOptions, options, optionValues);
    if (!module) return CUDA_ERROR_INVALID_VALUE;
    jit_call jit;
    if (CUresult rc = jit.take(numOptions, options, optionValues, "cuModuleLoadDataEx"); rc != CUDA_SUCCESS)
        return rc;
    uint64_t h = 0;
    CUresult rc = load(target::module, image, h, jit);
    if (rc == CUDA_SUCCESS) *module = reinterpret_cast<CUmodule>(h);
    return rc;
}

// Images named by file: the file is the application's, on this machine, read here and sent like any image.
// Text (PTX) images get their terminating NUL.
namespace {
CUresult load_file(target t, const char* path, uint64_t& handle, const jit_call& jit = {}) {
    VCUDA_REQUIRE_INIT();
    std::vector<std::byte> bytes;
    if (CUresult rc = read_image_file(path, bytes); rc != CUDA_SUCCESS) return rc;
    if (bytes.empty()) return CUDA_ERROR_INVALID_IMAGE;
    bytes.push_back(std::byte{0});
    return load(t, bytes.data(), handle, jit);
}
}  // namespace

VCUDA_API cuModuleLoad(CUmodule* module, const char* fname) noexcept {
    VCUDA_TRACE_HOOK(cuModuleLoad, module, fname);
    if (!module || !fname) return CUDA_ERROR_INVALID_VALUE;
    uint64_t h = 0;
    CUresult rc = load_file(target::module, fname, h);
    if (rc == CUDA_SUCCESS) *module = reinterpret_cast<CUmodule>(h);
    return rc;
}

VCUDA_API cuLibraryLoadFromFile(CUlibrary* library, const char* fileName, CUjit_option* jitOptions,
                                void** jitOptionsValues, unsigned int numJitOptions,
                                CUlibraryOption* libraryOptions, void** libraryOptionValues,
                                unsigned int numLibraryOptions) noexcept {
    VCUDA_TRACE_HOOK(cuLibraryLoadFromFile, library, fileName, jitOptions, jitOptionsValues, numJitOptions,
                     libraryOptions, libraryOptionValues, numLibraryOptions);
    if (!library || !fileName) return CUDA_ERROR_INVALID_VALUE;
    jit_call jit;
    if (CUresult rc = jit.take(numJitOptions, jitOptions, jitOptionsValues, "cuLibraryLoadFromFile");
        rc != CUDA_SUCCESS)
        return rc;
    uint64_t h = 0;
    CUresult rc = load_file(target::library, fileName, h, jit);
    if (rc == CUDA_SUCCESS) *library = reinterpret_cast<CUlibrary>(h);
    return rc;
}

VCUDA_API cuModuleLoadFatBinary(CUmodule* module, const void* fatCubin) noexcept {
    VCUDA_TRACE_HOOK(cuModuleLoadFatBinary, module, fatCubin);
    return cuModuleLoadData(module, fatCubin);
}

VCUDA_API cuModuleUnload(CUmodule hmod) noexcept {
    VCUDA_TRACE_HOOK(cuModuleUnload, hmod);
    return unload(reinterpret_cast<uint64_t>(hmod), handle_kind::module);
}

VCUDA_API cuModuleGetFunction(CUfunction* hfunc, CUmodule hmod, const char* name) noexcept {
    VCUDA_TRACE_HOOK(cuModuleGetFunction, hfunc, hmod, name);
    if (!hfunc) return CUDA_ERROR_INVALID_VALUE;
    uint64_t h = 0;
    CUresult rc = get_entry(op::module_get_function, reinterpret_cast<uint64_t>(hmod), handle_kind::module,
                            handle_kind::function, name, h);
    if (rc == CUDA_SUCCESS) *hfunc = reinterpret_cast<CUfunction>(h);
    return rc;
}

VCUDA_API cuModuleGetFunctionCount(unsigned int* count, CUmodule mod) noexcept {
    VCUDA_TRACE_HOOK(cuModuleGetFunctionCount, count, mod);
    return entry_count(reinterpret_cast<uint64_t>(mod), handle_kind::module, count);
}

VCUDA_API cuModuleEnumerateFunctions(CUfunction* functions, unsigned int numFunctions,
                                     CUmodule mod) noexcept {
    VCUDA_TRACE_HOOK(cuModuleEnumerateFunctions, functions, numFunctions, mod);
    static_assert(sizeof(CUfunction) == sizeof(uint64_t));
    return enumerate_entries(reinterpret_cast<uint64_t>(mod), handle_kind::module, op::module_get_function,
                             handle_kind::function, reinterpret_cast<uint64_t*>(functions), numFunctions);
}

VCUDA_API cuLibraryGetKernelCount(unsigned int* count, CUlibrary lib) noexcept {
    VCUDA_TRACE_HOOK(cuLibraryGetKernelCount, count, lib);
    return entry_count(reinterpret_cast<uint64_t>(lib), handle_kind::library, count);
}

VCUDA_API cuLibraryEnumerateKernels(CUkernel* kernels, unsigned int numKernels, CUlibrary lib) noexcept {
    VCUDA_TRACE_HOOK(cuLibraryEnumerateKernels, kernels, numKernels, lib);
    static_assert(sizeof(CUkernel) == sizeof(uint64_t));
    return enumerate_entries(reinterpret_cast<uint64_t>(lib), handle_kind::library, op::library_get_kernel,
                             handle_kind::kernel, reinterpret_cast<uint64_t*>(kernels), numKernels);
}

VCUDA_API cuModuleGetGlobal_v2(CUdeviceptr* dptr, size_t* bytes, CUmodule hmod, const char* name) noexcept {
    VCUDA_TRACE_HOOK(cuModuleGetGlobal_v2, dptr, bytes, hmod, name);
    return get_global(reinterpret_cast<uint64_t>(hmod), handle_kind::module, dptr, bytes, name);
}

VCUDA_API cuLibraryLoadData(CUlibrary* library, const void* code, CUjit_option* jitOptions,
                            void** jitOptionsValues, unsigned int numJitOptions,
                            CUlibraryOption* libraryOptions, void** libraryOptionValues,
                            unsigned int numLibraryOptions) noexcept {
    VCUDA_TRACE_HOOK(cuLibraryLoadData, library, code, jitOptions, jitOptionsValues, numJitOptions,
                     libraryOptions, libraryOptionValues, numLibraryOptions);
    if (!library) return CUDA_ERROR_INVALID_VALUE;
    jit_call jit;
    if (CUresult rc = jit.take(numJitOptions, jitOptions, jitOptionsValues, "cuLibraryLoadData");
        rc != CUDA_SUCCESS)
        return rc;
    uint64_t h = 0;
    CUresult rc = load(target::library, code, h, jit);
    if (rc == CUDA_SUCCESS) *library = reinterpret_cast<CUlibrary>(h);
    return rc;
}

VCUDA_API cuLibraryUnload(CUlibrary library) noexcept {
    VCUDA_TRACE_HOOK(cuLibraryUnload, library);
    return unload(reinterpret_cast<uint64_t>(library), handle_kind::library);
}

VCUDA_API cuLibraryGetKernel(CUkernel* kernel, CUlibrary library, const char* name) noexcept {
    VCUDA_TRACE_HOOK(cuLibraryGetKernel, kernel, library, name);
    if (!kernel) return CUDA_ERROR_INVALID_VALUE;
    uint64_t h = 0;
    CUresult rc = get_entry(op::library_get_kernel, reinterpret_cast<uint64_t>(library), handle_kind::library,
                            handle_kind::kernel, name, h);
    if (rc == CUDA_SUCCESS) *kernel = reinterpret_cast<CUkernel>(h);
    return rc;
}

VCUDA_API cuLibraryGetModule(CUmodule* module, CUlibrary library) noexcept {
    VCUDA_TRACE_HOOK(cuLibraryGetModule, module, library);
    VCUDA_REQUIRE_INIT();
    if (!module) return CUDA_ERROR_INVALID_VALUE;
    uint64_t lib = reinterpret_cast<uint64_t>(library);
    if (!state::get().known(lib, handle_kind::library)) return CUDA_ERROR_INVALID_HANDLE;
    library_get_module_call c("cuLibraryGetModule", library);
    if (CUresult rc = c.send_sync(); rc != CUDA_SUCCESS) return rc;
    if (!c.module_id()) return CUDA_ERROR_UNKNOWN;
    *module = c.module(lib);
    return CUDA_SUCCESS;
}

VCUDA_API cuLibraryGetGlobal(CUdeviceptr* dptr, size_t* bytes, CUlibrary library, const char* name) noexcept {
    VCUDA_TRACE_HOOK(cuLibraryGetGlobal, dptr, bytes, library, name);
    return get_global(reinterpret_cast<uint64_t>(library), handle_kind::library, dptr, bytes, name);
}

VCUDA_API cuLibraryGetManaged(CUdeviceptr* dptr, size_t* bytes, CUlibrary library,
                              const char* name) noexcept {
    VCUDA_TRACE_HOOK(cuLibraryGetManaged, dptr, bytes, library, name);
    return get_global(reinterpret_cast<uint64_t>(library), handle_kind::library, dptr, bytes, name, true);
}

VCUDA_API cuKernelGetFunction(CUfunction* pFunc, CUkernel kernel) noexcept {
    VCUDA_TRACE_HOOK(cuKernelGetFunction, pFunc, kernel);
    VCUDA_REQUIRE_INIT();
    if (!pFunc) return CUDA_ERROR_INVALID_VALUE;
    uint64_t k = reinterpret_cast<uint64_t>(kernel);
    handle_info kinfo;
    if (!state::get().lookup(k, kinfo) || kinfo.kind != handle_kind::kernel) return CUDA_ERROR_INVALID_HANDLE;
    // The server gives the same function for the same kernel and device each time: asked once, then cached.
    kernel_get_function_call c("cuKernelGetFunction", reinterpret_cast<CUkernel>(k));
    if (CUresult rc = c.send_cached(); rc != CUDA_SUCCESS) return rc;
    uint64_t fn = c.function_id();
    if (!fn) return CUDA_ERROR_UNKNOWN;
    handle_info finfo;
    if (!state::get().lookup(fn, finfo)) {
        handle_info info = kinfo;
        info.kind = handle_kind::function;
        info.owner = k;
        state::get().adopt(fn, info);
    }
    *pFunc = reinterpret_cast<CUfunction>(fn);
    return CUDA_SUCCESS;
}

VCUDA_API cuKernelGetParamInfo(CUkernel kernel, size_t index, size_t* offset, size_t* size) noexcept {
    VCUDA_TRACE_HOOK(cuKernelGetParamInfo, kernel, index, offset, size);
    return param_info(reinterpret_cast<uint64_t>(kernel), handle_kind::kernel, index, offset, size);
}

// As the real driver: a CUkernel cast to CUfunction is not a function here (CUDA_ERROR_INVALID_HANDLE).
VCUDA_API cuFuncGetParamInfo(CUfunction func, size_t index, size_t* offset, size_t* size) noexcept {
    VCUDA_TRACE_HOOK(cuFuncGetParamInfo, func, index, offset, size);
    return param_info(reinterpret_cast<uint64_t>(func), handle_kind::function, index, offset, size);
}

VCUDA_API cuKernelGetName(const char** name, CUkernel kernel) noexcept {
    VCUDA_TRACE_HOOK(cuKernelGetName, name, kernel);
    VCUDA_REQUIRE_INIT();
    if (!name) return CUDA_ERROR_INVALID_VALUE;
    handle_info info;
    if (!state::get().lookup(reinterpret_cast<uint64_t>(kernel), info) || info.kind != handle_kind::kernel)
        return CUDA_ERROR_INVALID_HANDLE;
    *name = intern(info.name);
    return CUDA_SUCCESS;
}

VCUDA_API cuFuncGetName(const char** name, CUfunction func) noexcept {
    VCUDA_TRACE_HOOK(cuFuncGetName, name, func);
    VCUDA_REQUIRE_INIT();
    if (!name) return CUDA_ERROR_INVALID_VALUE;
    handle_info info;
    if (!state::get().lookup(reinterpret_cast<uint64_t>(func), info) ||
        (info.kind != handle_kind::function && info.kind != handle_kind::kernel))
        return CUDA_ERROR_INVALID_HANDLE;
    *name = intern(info.name);
    return CUDA_SUCCESS;
}

VCUDA_API cuKernelGetLibrary(CUlibrary* lib, CUkernel kernel) noexcept {
    VCUDA_TRACE_HOOK(cuKernelGetLibrary, lib, kernel);
    VCUDA_REQUIRE_INIT();
    if (!lib) return CUDA_ERROR_INVALID_VALUE;
    handle_info info;
    if (!state::get().lookup(reinterpret_cast<uint64_t>(kernel), info) || info.kind != handle_kind::kernel)
        return CUDA_ERROR_INVALID_HANDLE;
    *lib = reinterpret_cast<CUlibrary>(info.owner);
    return CUDA_SUCCESS;
}

VCUDA_API cuFuncGetModule(CUmodule* mod, CUfunction func) noexcept {
    VCUDA_TRACE_HOOK(cuFuncGetModule, mod, func);
    VCUDA_REQUIRE_INIT();
    if (!mod) return CUDA_ERROR_INVALID_VALUE;
    handle_info info;
    if (!state::get().lookup(reinterpret_cast<uint64_t>(func), info) || info.kind != handle_kind::function)
        return CUDA_ERROR_INVALID_HANDLE;
    handle_info owner;
    if (!state::get().lookup(info.owner, owner) || owner.kind != handle_kind::module)
        return CUDA_ERROR_NOT_FOUND;
    *mod = reinterpret_cast<CUmodule>(info.owner);
    return CUDA_SUCCESS;
}

VCUDA_API cuFuncIsLoaded(CUfunctionLoadingState* st, CUfunction func) noexcept {
    VCUDA_TRACE_HOOK(cuFuncIsLoaded, st, func);
    VCUDA_REQUIRE_INIT();
    if (!st) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_handle(reinterpret_cast<uint64_t>(func), handle_kind::function))
        return CUDA_ERROR_INVALID_HANDLE;
    *st = CU_FUNCTION_LOADING_STATE_LOADED;  // the server loads eagerly
    return CUDA_SUCCESS;
}

VCUDA_API cuFuncLoad(CUfunction func) noexcept {
    VCUDA_TRACE_HOOK(cuFuncLoad, func);
    VCUDA_REQUIRE_INIT();
    return valid_handle(reinterpret_cast<uint64_t>(func), handle_kind::function) ? CUDA_SUCCESS
                                                                                 : CUDA_ERROR_INVALID_HANDLE;
}
