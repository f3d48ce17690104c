// The software test driver: libraries, modules, kernels, functions, occupancy and launches. Images are not
// parsed (their size is unknown and there is no GPU code to run): any non-null image loads, and every module
// or library "contains" every kernel and global of the registry (soft_kernel.hpp); a name not registered is
// CUDA_ERROR_NOT_FOUND. Each module and library gets its own zeroed copy of each global. A launch is checked
// as the real driver checks it at call time, then runs the host kernel at once, with the lock released.
//
// CUkernel handles may be passed where a CUfunction is taken (cudart launches that way) except to
// cuFuncGetParamInfo and cuFuncGetModule, which answer CUDA_ERROR_INVALID_HANDLE for them as the real driver
// does.
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "soft_state.hpp"

namespace vcuda::soft {
namespace {

// What a CUfunction argument names: a function, or a kernel cast to CUfunction.
struct callable {
    const kernel_entry* entry = nullptr;
    func_attrs* attrs = nullptr;
    const std::string* name = nullptr;
    uint64_t ctx = 0;               // a function's context; 0 for a kernel (it runs in the stream's context)
    global_set* globals = nullptr;  // its module's or library's variables (kernel_global)
};

global_set* library_globals(state& s, uint64_t library) {
    library_obj* lib = s.find<library_obj>(library);
    return lib != nullptr ? &lib->globals : nullptr;
}

CUresult resolve_callable(state& s, CUfunction f, callable& out) {
    if (function_obj* fn = s.find<function_obj>(f)) {
        global_set* globals = nullptr;
        if (module_obj* m = s.find<module_obj>(fn->module))
            globals = m->library != 0 ? library_globals(s, m->library) : &m->globals;
        else if (kernel_obj* k = s.find<kernel_obj>(fn->kernel))
            globals = library_globals(s, k->library);
        out = {fn->entry, fn->attrs.get(), &fn->name, fn->ctx, globals};
        return CUDA_SUCCESS;
    }
    if (kernel_obj* k = s.find<kernel_obj>(f)) {
        out = {k->entry, k->attrs.get(), &k->name, 0, library_globals(s, k->library)};
        return CUDA_SUCCESS;
    }
    return CUDA_ERROR_INVALID_HANDLE;
}

// The variables of the kernel running on this thread (kernel_global).
thread_local const global_set* running_globals = nullptr;

CUresult get_attr(const func_attrs& a, CUfunction_attribute attrib, int& out) {
    switch (attrib) {
        case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK:
            out = max_threads_per_block;
            break;
        case CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES:
            out = 0;
            break;
        case CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES:
            out = 0;
            break;
        case CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES:
            out = 0;
            break;
        case CU_FUNC_ATTRIBUTE_NUM_REGS:
            out = regs_per_thread;
            break;
        case CU_FUNC_ATTRIBUTE_PTX_VERSION:
            out = 90;
            break;
        case CU_FUNC_ATTRIBUTE_BINARY_VERSION:
            out = 90;
            break;
        case CU_FUNC_ATTRIBUTE_CACHE_MODE_CA:
            out = 0;
            break;
        case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES:
            out = a.max_dynamic_shared;
            break;
        case CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT:
            out = a.carveout;
            break;
        case CU_FUNC_ATTRIBUTE_CLUSTER_SIZE_MUST_BE_SET:
            out = 0;
            break;
        case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH:
            out = a.cluster_w;
            break;
        case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT:
            out = a.cluster_h;
            break;
        case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH:
            out = a.cluster_d;
            break;
        case CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED:
            out = a.non_portable_cluster;
            break;
        case CU_FUNC_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE:
            out = a.cluster_sched;
            break;
        default:
            return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

CUresult set_attr(func_attrs& a, CUfunction_attribute attrib, int value) {
    switch (attrib) {
        case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES:
            if (value < 0 || value > shared_per_block_optin) return CUDA_ERROR_INVALID_VALUE;
            a.max_dynamic_shared = value;
            return CUDA_SUCCESS;
        case CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT:
            if (value < -1 || value > 100) return CUDA_ERROR_INVALID_VALUE;
            a.carveout = value;
            return CUDA_SUCCESS;
        case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH:
        case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT:
        case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH: {
            if (value < 0 || value > 16) return CUDA_ERROR_INVALID_VALUE;
            int& slot = attrib == CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH    ? a.cluster_w
                        : attrib == CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT ? a.cluster_h
                                                                              : a.cluster_d;
            slot = value;
            return CUDA_SUCCESS;
        }
        case CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED:
            if (value != 0 && value != 1) return CUDA_ERROR_INVALID_VALUE;
            a.non_portable_cluster = value;
            return CUDA_SUCCESS;
        case CU_FUNC_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE:
            if (value < CU_CLUSTER_SCHEDULING_POLICY_DEFAULT ||
                value > CU_CLUSTER_SCHEDULING_POLICY_LOAD_BALANCING)
                return CUDA_ERROR_INVALID_VALUE;
            a.cluster_sched = value;
            return CUDA_SUCCESS;
        default:
            return CUDA_ERROR_INVALID_VALUE;  // read-only or unknown
    }
}

CUresult param_info(const kernel_entry& k, size_t index, size_t* offset, size_t* size) {
    if (offset == nullptr || index >= k.param_sizes.size()) return CUDA_ERROR_INVALID_VALUE;
    *offset = param_offsets(k)[index];
    if (size != nullptr) *size = k.param_sizes[index];
    return CUDA_SUCCESS;
}

// --- Objects.

function_obj* make_function(state& s, const kernel_entry* entry, uint64_t ctx, uint64_t module,
                            uint64_t kernel, std::shared_ptr<func_attrs> attrs) {
    function_obj* f = s.create<function_obj>();
    f->entry = entry;
    f->name = std::string(entry->name);
    f->ctx = ctx;
    f->module = module;
    f->kernel = kernel;
    f->attrs = std::move(attrs);
    return f;
}

CUresult load_module(state& s, CUmodule* out, const void* image) {
    if (out == nullptr || image == nullptr) return CUDA_ERROR_INVALID_VALUE;
    context_obj* c = nullptr;
    if (CUresult r = require_context(s, c); r != CUDA_SUCCESS) return r;
    module_obj* m = s.create<module_obj>();
    m->ctx = c->handle;
    m->image = image;
    *out = to_handle<CUmodule>(m->handle);
    return CUDA_SUCCESS;
}

// The module of a library in a context, created on first use.
module_obj* library_module(state& s, library_obj& lib, context_obj& c) {
    auto it = lib.modules.find(c.handle);
    if (it != lib.modules.end())
        if (module_obj* m = s.find<module_obj>(it->second)) return m;
    module_obj* m = s.create<module_obj>();
    m->ctx = c.handle;
    m->library = lib.handle;
    m->image = lib.image;
    lib.modules[c.handle] = m->handle;
    return m;
}

kernel_obj* library_kernel(state& s, library_obj& lib, const kernel_entry* entry) {
    auto it = lib.kernels.find(entry->name);
    if (it != lib.kernels.end())
        if (kernel_obj* k = s.find<kernel_obj>(it->second)) return k;
    kernel_obj* k = s.create<kernel_obj>();
    k->library = lib.handle;
    k->entry = entry;
    k->name = std::string(entry->name);
    k->attrs = std::make_shared<func_attrs>();
    lib.kernels[k->name] = k->handle;
    return k;
}

function_obj* module_function(state& s, module_obj& m, const kernel_entry* entry) {
    auto it = m.functions.find(entry->name);
    if (it != m.functions.end())
        if (function_obj* f = s.find<function_obj>(it->second)) return f;
    function_obj* f = make_function(s, entry, m.ctx, m.handle, 0, std::make_shared<func_attrs>());
    m.functions[f->name] = f->handle;
    return f;
}

global_set& globals_of(state& s, module_obj& m) {
    if (m.library != 0)
        if (library_obj* lib = s.find<library_obj>(m.library)) return lib->globals;
    return m.globals;
}

CUresult get_global(state& s, global_set& set, CUdeviceptr* dptr, size_t* bytes, const char* name,
                    int device) {
    if (name == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const global_entry* g = find_global(name);
    if (g == nullptr) return CUDA_ERROR_NOT_FOUND;
    void* p = global_alloc(s, set, *g, device);
    if (dptr != nullptr) *dptr = static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(p));
    if (bytes != nullptr) *bytes = g->size;
    return CUDA_SUCCESS;
}

void destroy_library(state& s, library_obj& lib) {
    std::vector<uint64_t> modules, kernels;
    for (auto& [ctx, m] : lib.modules) modules.push_back(m);
    for (auto& [name, k] : lib.kernels) kernels.push_back(k);
    for (uint64_t m : modules) destroy_module(s, m);
    for (uint64_t h : kernels) {
        if (kernel_obj* k = s.find<kernel_obj>(h)) {
            std::vector<uint64_t> fns;
            for (auto& [ctx, f] : k->functions) fns.push_back(f);
            for (uint64_t f : fns) destroy_function(s, f);
            s.erase(h);
        }
    }
    free_globals(s, lib.globals);
    s.erase(lib.handle);
}

// --- Occupancy of a block on one SM, for a kernel that uses 32 registers a thread and no static shared
// memory.

int blocks_per_sm(const func_attrs& a, long block_size, size_t dynamic_smem) {
    if (block_size <= 0 || block_size > static_cast<long>(max_threads_per_block)) return 0;
    if (dynamic_smem > static_cast<size_t>(a.max_dynamic_shared)) return 0;
    long threads = (block_size + 31) / 32 * 32;
    long by_threads = max_threads_per_sm / threads;
    long by_regs = regs_per_sm / (regs_per_thread * threads);
    long by_smem = shared_per_sm / static_cast<long>(dynamic_smem + reserved_shared_per_block);
    return static_cast<int>(std::min({by_threads, by_regs, by_smem, static_cast<long>(max_blocks_per_sm)}));
}

CUresult max_potential_block_size(state& s, work& w, int* minGridSize, int* blockSize, CUfunction func,
                                  CUoccupancyB2DSize b2d, size_t dynamicSMemSize, int blockSizeLimit,
                                  unsigned flags) {
    if (minGridSize == nullptr || blockSize == nullptr || blockSizeLimit < 0) return CUDA_ERROR_INVALID_VALUE;
    if (flags != CU_OCCUPANCY_DEFAULT && flags != CU_OCCUPANCY_DISABLE_CACHING_OVERRIDE)
        return CUDA_ERROR_INVALID_VALUE;
    callable c;
    if (CUresult r = resolve_callable(s, func, c); r != CUDA_SUCCESS) return r;
    func_attrs attrs = *c.attrs;
    int limit = blockSizeLimit == 0 ? static_cast<int>(max_threads_per_block)
                                    : std::min(blockSizeLimit, static_cast<int>(max_threads_per_block));
    // b2d is the caller's function: run it without the lock.
    w = [=]() -> CUresult {
        int best_size = 0, best_blocks = 0;
        long best_threads = -1;
        for (int size = limit; size > 0; size = (size - 1) / 32 * 32) {
            size_t smem = b2d != nullptr ? b2d(size) : dynamicSMemSize;
            int blocks = blocks_per_sm(attrs, size, smem);
            long threads = static_cast<long>(blocks) * size;
            if (threads > best_threads) {
                best_threads = threads;
                best_size = size;
                best_blocks = blocks;
            }
            if (size <= 32) break;
        }
        *blockSize = best_size;
        *minGridSize = best_blocks * sm_count;
        return CUDA_SUCCESS;
    };
    return CUDA_SUCCESS;
}

// --- Launches.

struct launch_request {
    CUfunction f = nullptr;
    dim grid, block;
    unsigned shared = 0;
    CUstream stream = nullptr;
    void** kernel_params = nullptr;
    void** extra = nullptr;
    bool cooperative = false;
    unsigned cluster_x = 0, cluster_y = 0, cluster_z = 0;  // 0: no cluster dimension given
};

// The buffer a launch's `extra` gives ({CU_LAUNCH_PARAM_BUFFER_POINTER, p, CU_LAUNCH_PARAM_BUFFER_SIZE,
// &size, CU_LAUNCH_PARAM_END}; either may be missing): false for another key, or no END within 32 pairs.
bool extra_buffer(void* const* extra, const void*& data, const size_t*& size) {
    data = nullptr;
    size = nullptr;
    for (size_t i = 0; i < 64; i += 2) {
        void* key = extra[i];
        if (key == CU_LAUNCH_PARAM_END) return true;
        if (key == CU_LAUNCH_PARAM_BUFFER_POINTER)
            data = extra[i + 1];
        else if (key == CU_LAUNCH_PARAM_BUFFER_SIZE)
            size = static_cast<const size_t*>(extra[i + 1]);
        else
            return false;
    }
    return false;
}

// The work of launch `q` in context `ctx`, checked as the real driver checks at call time (q.stream unused).
CUresult launch_work(state& s, work& w, const launch_request& q, const context_obj& ctx) {
    callable c;
    if (CUresult r = resolve_callable(s, q.f, c); r != CUDA_SUCCESS) return r;
    if (c.ctx != 0 && c.ctx != ctx.handle) return CUDA_ERROR_INVALID_HANDLE;  // a function of another context

    const dim& g = q.grid;
    const dim& b = q.block;
    if (g.x == 0 || g.y == 0 || g.z == 0 || b.x == 0 || b.y == 0 || b.z == 0) return CUDA_ERROR_INVALID_VALUE;
    if (b.x > max_block_x || b.y > max_block_y || b.z > max_block_z) return CUDA_ERROR_INVALID_VALUE;
    if (uint64_t{b.x} * b.y * b.z > max_threads_per_block) return CUDA_ERROR_INVALID_VALUE;
    if (g.x > max_grid_x || g.y > max_grid_y || g.z > max_grid_z) return CUDA_ERROR_INVALID_VALUE;
    if (q.shared > static_cast<unsigned>(c.attrs->max_dynamic_shared)) return CUDA_ERROR_INVALID_VALUE;

    const uint64_t blocks = uint64_t{g.x} * g.y * g.z;
    if (q.cooperative) {
        uint64_t resident = uint64_t(blocks_per_sm(*c.attrs, b.x * b.y * b.z, q.shared)) * sm_count;
        if (blocks > resident) return CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE;
    }
    if (q.cluster_x != 0) {
        const unsigned cx = q.cluster_x, cy = q.cluster_y, cz = q.cluster_z;
        if (cx == 0 || cy == 0 || cz == 0 || g.x % cx != 0 || g.y % cy != 0 || g.z % cz != 0)
            return CUDA_ERROR_INVALID_CLUSTER_SIZE;
        const uint64_t limit = c.attrs->non_portable_cluster != 0 ? 16 : 8;
        if (uint64_t{cx} * cy * cz > limit) return CUDA_ERROR_INVALID_CLUSTER_SIZE;
    }

    const kernel_entry* k = c.entry;
    const size_t count = k->param_sizes.size();
    if (q.kernel_params != nullptr && q.extra != nullptr) return CUDA_ERROR_INVALID_VALUE;

    auto params = std::make_shared<std::vector<void*>>(count);
    std::shared_ptr<std::vector<std::max_align_t>> buffer;
    if (q.extra != nullptr) {
        const void* data = nullptr;
        const size_t* size = nullptr;
        if (!extra_buffer(q.extra, data, size)) return CUDA_ERROR_INVALID_VALUE;
        std::vector<size_t> offsets = param_offsets(*k);
        const size_t needed = count == 0 ? 0 : offsets.back() + k->param_sizes.back();
        if (needed > 0 && (data == nullptr || size == nullptr)) return CUDA_ERROR_INVALID_VALUE;
        // An aligned copy, so that a kernel may read its parameters as the types they are. A buffer shorter
        // than the parameters is taken, as by the real driver (NCCL passes the part of its 4 KiB parameter
        // that it uses): what it leaves out reads as zeros here.
        buffer = std::make_shared<std::vector<std::max_align_t>>((needed + sizeof(std::max_align_t) - 1) /
                                                                 sizeof(std::max_align_t));
        if (needed > 0) std::memcpy(buffer->data(), data, std::min(needed, *size));
        auto* bytes = reinterpret_cast<char*>(buffer->data());
        for (size_t i = 0; i < count; ++i) (*params)[i] = bytes + offsets[i];
    } else if (count > 0) {
        // Copied, as the real driver copies them at launch: a captured launch runs after the caller's are
        // gone.
        if (q.kernel_params == nullptr) return CUDA_ERROR_INVALID_VALUE;
        std::vector<size_t> offsets = param_offsets(*k);
        const size_t needed = offsets.back() + k->param_sizes.back();
        buffer = std::make_shared<std::vector<std::max_align_t>>((needed + sizeof(std::max_align_t) - 1) /
                                                                 sizeof(std::max_align_t));
        auto* bytes = reinterpret_cast<char*>(buffer->data());
        for (size_t i = 0; i < count; ++i) {
            if (q.kernel_params[i] == nullptr) return CUDA_ERROR_INVALID_VALUE;
            std::memcpy(bytes + offsets[i], q.kernel_params[i], k->param_sizes[i]);
            (*params)[i] = bytes + offsets[i];
        }
    }

    launch l;
    l.grid = g;
    l.block = b;
    l.shared_bytes = q.shared;
    kernel_fn fn = k->fn;
    w = [l, fn, params, buffer, context = ctx.handle, globals = c.globals]() mutable -> CUresult {
        l.params = params->data();
        const global_set* outer = running_globals;
        running_globals = globals;
        try {
            running_in_context running(context);  // its texture and surface objects are the context's
            fn(l);
            running_globals = outer;
        } catch (...) {
            running_globals = outer;
            return CUDA_ERROR_LAUNCH_FAILED;
        }
        return CUDA_SUCCESS;
    };
    return CUDA_SUCCESS;
}

CUresult prepare_launch(state& s, work& w, const launch_request& q) {
    callable c;
    if (CUresult r = resolve_callable(s, q.f, c); r != CUDA_SUCCESS) return r;
    context_obj* ctx = nullptr;
    if (CUresult r = check_stream(s, q.stream, &ctx); r != CUDA_SUCCESS) return r;
    if (CUresult r = launch_work(s, w, q, *ctx); r != CUDA_SUCCESS) return r;
    const bool capturing = capture_of(s, q.stream) != nullptr;
    if (CUresult r = capture_or_run(s, q.stream, w, CU_GRAPH_NODE_TYPE_KERNEL, nullptr, c.entry->name);
        r != CUDA_SUCCESS || !capturing)
        return r;
    // A captured launch's node reports its parameters, as one added by cuGraphAddKernelNode.
    if (node_obj* n = last_captured(s, q.stream); n != nullptr && n->type == CU_GRAPH_NODE_TYPE_KERNEL) {
        CUDA_KERNEL_NODE_PARAMS_v2 p{};
        p.func = q.f;
        p.gridDimX = q.grid.x;
        p.gridDimY = q.grid.y;
        p.gridDimZ = q.grid.z;
        p.blockDimX = q.block.x;
        p.blockDimY = q.block.y;
        p.blockDimZ = q.block.z;
        p.sharedMemBytes = q.shared;
        p.kernelParams = q.kernel_params;
        p.extra = q.extra;
        n->kernel = keep_kernel_params(s, p);
    }
    return CUDA_SUCCESS;
}

}  // namespace

void* kernel_global(std::string_view name) {
    if (running_globals == nullptr) return nullptr;
    auto it = running_globals->vars.find(name);
    return it != running_globals->vars.end() ? it->second.first : nullptr;
}

// A kernel node runs `func`, or `kern` in the node's context (the graph's: the one it is made or updated in).
CUresult kernel_node_work(state& s, const CUDA_KERNEL_NODE_PARAMS_v2& p, const context_obj& ctx, work& w) {
    if (p.func == nullptr && p.kern == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (p.func == nullptr && p.ctx != nullptr && usable_context(s, from_handle(p.ctx)) == nullptr)
        return CUDA_ERROR_INVALID_CONTEXT;
    launch_request q;
    q.f = p.func != nullptr ? p.func : reinterpret_cast<CUfunction>(p.kern);
    q.grid = {p.gridDimX, p.gridDimY, p.gridDimZ};
    q.block = {p.blockDimX, p.blockDimY, p.blockDimZ};
    q.shared = p.sharedMemBytes;
    q.kernel_params = p.kernelParams;
    q.extra = p.extra;
    return launch_work(s, w, q, ctx);
}

std::shared_ptr<const kernel_node_params> keep_kernel_params(state& s, const CUDA_KERNEL_NODE_PARAMS_v2& p) {
    auto kept = std::make_shared<kernel_node_params>();
    kept->p = p;
    kept->p.kernelParams = nullptr;
    kept->p.extra = nullptr;
    callable c;
    CUfunction f = p.func != nullptr ? p.func : reinterpret_cast<CUfunction>(p.kern);
    if (resolve_callable(s, f, c) != CUDA_SUCCESS) return kept;
    if (p.kernelParams != nullptr) {
        for (size_t i = 0; i < c.entry->param_sizes.size(); ++i) {
            const auto* v = static_cast<const std::byte*>(p.kernelParams[i]);
            kept->values.emplace_back(v, v + c.entry->param_sizes[i]);
        }
    } else if (p.extra != nullptr) {
        // An `extra` buffer (checked by launch_work): kept as such.
        const void* data = nullptr;
        const size_t* size = nullptr;
        if (extra_buffer(p.extra, data, size) && data != nullptr && size != nullptr)
            kept->buffer.assign(static_cast<const std::byte*>(data),
                                static_cast<const std::byte*>(data) + *size);
        kept->buffer_size = kept->buffer.size();
        kept->extra[0] = CU_LAUNCH_PARAM_BUFFER_POINTER;
        kept->extra[1] = kept->buffer.data();
        kept->extra[2] = CU_LAUNCH_PARAM_BUFFER_SIZE;
        kept->extra[3] = &kept->buffer_size;
        kept->extra[4] = CU_LAUNCH_PARAM_END;
        kept->p.extra = kept->extra;
        return kept;
    }
    if (!kept->values.empty() || c.entry->param_sizes.empty()) {
        for (auto& v : kept->values) kept->pointers.push_back(v.data());
        kept->p.kernelParams = kept->pointers.data();
    }
    return kept;
}

std::string kernel_name(state& s, const CUDA_KERNEL_NODE_PARAMS_v2& p) {
    callable c;
    CUfunction f = p.func != nullptr ? p.func : reinterpret_cast<CUfunction>(p.kern);
    return resolve_callable(s, f, c) == CUDA_SUCCESS ? std::string(c.entry->name) : std::string();
}

void destroy_function(state& s, uint64_t h) {
    function_obj* f = s.find<function_obj>(h);
    if (f == nullptr) return;
    if (f->kernel != 0)
        if (kernel_obj* k = s.find<kernel_obj>(f->kernel)) k->functions.erase(f->ctx);
    s.erase(h);
}

void destroy_module(state& s, uint64_t h) {
    module_obj* m = s.find<module_obj>(h);
    if (m == nullptr) return;
    std::vector<uint64_t> fns;
    for (auto& [name, f] : m->functions) fns.push_back(f);
    for (uint64_t f : fns) destroy_function(s, f);
    if (m->library != 0) {
        if (library_obj* lib = s.find<library_obj>(m->library)) lib->modules.erase(m->ctx);
    } else {
        free_globals(s, m->globals);
    }
    s.erase(h);
}

}  // namespace vcuda::soft

using namespace vcuda::soft;

// --- Libraries (context-independent).

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuLibraryLoadData(CUlibrary* library, const void* code,
                                                     CUjit_option* jitOptions, void** jitOptionsValues,
                                                     unsigned int numJitOptions,
                                                     CUlibraryOption* libraryOptions,
                                                     void** libraryOptionValues,
                                                     unsigned int numLibraryOptions) {
    return entry([&](state& s) -> CUresult {
        if (library == nullptr || code == nullptr) return CUDA_ERROR_INVALID_VALUE;
        if (numJitOptions > 0 && (jitOptions == nullptr || jitOptionsValues == nullptr))
            return CUDA_ERROR_INVALID_VALUE;
        // Both library options are flags whose presence is what counts: a NULL value array is accepted.
        if (numLibraryOptions > 0 && libraryOptions == nullptr) return CUDA_ERROR_INVALID_VALUE;
        for (unsigned i = 0; i < numLibraryOptions; ++i)
            if (libraryOptions[i] < 0 || libraryOptions[i] >= CU_LIBRARY_NUM_OPTIONS)
                return CUDA_ERROR_INVALID_VALUE;
        library_obj* lib = s.create<library_obj>();
        lib->image = code;
        *library = to_handle<CUlibrary>(lib->handle);
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuLibraryUnload(CUlibrary library) {
    return entry([&](state& s) -> CUresult {
        library_obj* lib = s.find<library_obj>(library);
        if (lib == nullptr) return CUDA_ERROR_INVALID_HANDLE;
        destroy_library(s, *lib);
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuLibraryGetKernel(CUkernel* pKernel, CUlibrary library,
                                                      const char* name) {
    return entry([&](state& s) -> CUresult {
        if (pKernel == nullptr || name == nullptr) return CUDA_ERROR_INVALID_VALUE;
        library_obj* lib = s.find<library_obj>(library);
        if (lib == nullptr) return CUDA_ERROR_INVALID_HANDLE;
        const kernel_entry* e = find_kernel(name);
        if (e == nullptr) return CUDA_ERROR_NOT_FOUND;
        *pKernel = to_handle<CUkernel>(library_kernel(s, *lib, e)->handle);
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuLibraryGetKernelCount(unsigned int* count, CUlibrary lib) {
    return entry([&](state& s) -> CUresult {
        if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
        if (s.find<library_obj>(lib) == nullptr) return CUDA_ERROR_INVALID_HANDLE;
        *count = static_cast<unsigned>(registered_kernels().size());
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuLibraryEnumerateKernels(CUkernel* kernels, unsigned int numKernels,
                                                             CUlibrary lib) {
    return entry([&](state& s) -> CUresult {
        if (kernels == nullptr || numKernels == 0) return CUDA_ERROR_INVALID_VALUE;
        library_obj* l = s.find<library_obj>(lib);
        if (l == nullptr) return CUDA_ERROR_INVALID_HANDLE;
        std::vector<const kernel_entry*> all = registered_kernels();
        for (size_t i = 0; i < all.size() && i < numKernels; ++i)
            kernels[i] = to_handle<CUkernel>(library_kernel(s, *l, all[i])->handle);
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuLibraryGetModule(CUmodule* pMod, CUlibrary library) {
    return entry([&](state& s) -> CUresult {
        if (pMod == nullptr) return CUDA_ERROR_INVALID_VALUE;
        library_obj* lib = s.find<library_obj>(library);
        if (lib == nullptr) return CUDA_ERROR_INVALID_HANDLE;
        context_obj* c = nullptr;
        if (CUresult r = require_context(s, c); r != CUDA_SUCCESS) return r;
        *pMod = to_handle<CUmodule>(library_module(s, *lib, *c)->handle);
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuLibraryGetGlobal(CUdeviceptr* dptr, size_t* bytes, CUlibrary library,
                                                      const char* name) {
    return entry([&](state& s) -> CUresult {
        library_obj* lib = s.find<library_obj>(library);
        if (lib == nullptr) return CUDA_ERROR_INVALID_HANDLE;
        context_obj* c = current_context(s);
        return get_global(s, lib->globals, dptr, bytes, name, c != nullptr ? c->device : 0);
    });
}

// A __managed__ variable: host memory here, as every global is, so it is a global looked up by its name.
VCUDA_SOFT_EXPORT CUresult CUDAAPI cuLibraryGetManaged(CUdeviceptr* dptr, size_t* bytes, CUlibrary library,
                                                       const char* name) {
    return cuLibraryGetGlobal(dptr, bytes, library, name);
}

// --- Kernels (CUkernel).

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuKernelGetFunction(CUfunction* pFunc, CUkernel kernel) {
    return entry([&](state& s) -> CUresult {
        if (pFunc == nullptr) return CUDA_ERROR_INVALID_VALUE;
        kernel_obj* k = s.find<kernel_obj>(kernel);
        if (k == nullptr) return CUDA_ERROR_INVALID_HANDLE;
        context_obj* c = nullptr;
        if (CUresult r = require_context(s, c); r != CUDA_SUCCESS) return r;
        auto it = k->functions.find(c->handle);
        if (it != k->functions.end() && s.find<function_obj>(it->second) != nullptr) {
            *pFunc = to_handle<CUfunction>(it->second);
            return CUDA_SUCCESS;
        }
        uint64_t module = 0;
        if (library_obj* lib = s.find<library_obj>(k->library)) module = library_module(s, *lib, *c)->handle;
        function_obj* f = make_function(s, k->entry, c->handle, module, k->handle, k->attrs);
        k->functions[c->handle] = f->handle;
        *pFunc = to_handle<CUfunction>(f->handle);
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuKernelGetLibrary(CUlibrary* pLib, CUkernel kernel) {
    return entry([&](state& s) -> CUresult {
        if (pLib == nullptr) return CUDA_ERROR_INVALID_VALUE;
        kernel_obj* k = s.find<kernel_obj>(kernel);
        if (k == nullptr) return CUDA_ERROR_INVALID_HANDLE;
        *pLib = to_handle<CUlibrary>(k->library);
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuKernelGetAttribute(int* pi, CUfunction_attribute attrib, CUkernel kernel,
                                                        CUdevice dev) {
    return entry([&](state& s) -> CUresult {
        if (pi == nullptr) return CUDA_ERROR_INVALID_VALUE;
        kernel_obj* k = s.find<kernel_obj>(kernel);
        if (k == nullptr) return CUDA_ERROR_INVALID_HANDLE;
        if (!s.valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
        return get_attr(*k->attrs, attrib, *pi);
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuKernelSetAttribute(CUfunction_attribute attrib, int val, CUkernel kernel,
                                                        CUdevice dev) {
    return entry([&](state& s) -> CUresult {
        kernel_obj* k = s.find<kernel_obj>(kernel);
        if (k == nullptr) return CUDA_ERROR_INVALID_HANDLE;
        if (!s.valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
        return set_attr(*k->attrs, attrib, val);
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuKernelSetCacheConfig(CUkernel kernel, CUfunc_cache config,
                                                          CUdevice dev) {
    return entry([&](state& s) -> CUresult {
        kernel_obj* k = s.find<kernel_obj>(kernel);
        if (k == nullptr) return CUDA_ERROR_INVALID_HANDLE;
        if (!s.valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
        if (config < CU_FUNC_CACHE_PREFER_NONE || config > CU_FUNC_CACHE_PREFER_EQUAL)
            return CUDA_ERROR_INVALID_VALUE;
        k->attrs->cache = config;
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuKernelGetName(const char** name, CUkernel hfunc) {
    return entry([&](state& s) -> CUresult {
        if (name == nullptr || hfunc == nullptr) return CUDA_ERROR_INVALID_VALUE;
        kernel_obj* k = s.find<kernel_obj>(hfunc);
        if (k == nullptr) return CUDA_ERROR_INVALID_HANDLE;
        *name = k->name.c_str();
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuKernelGetParamInfo(CUkernel kernel, size_t paramIndex,
                                                        size_t* paramOffset, size_t* paramSize) {
    return entry([&](state& s) -> CUresult {
        // Measured on the real driver (580): without a current context this answers
        // CUDA_ERROR_INVALID_CONTEXT.
        context_obj* c = nullptr;
        if (CUresult r = require_context(s, c); r != CUDA_SUCCESS) return r;
        kernel_obj* k = s.find<kernel_obj>(kernel);
        if (k == nullptr) return CUDA_ERROR_INVALID_HANDLE;
        return param_info(*k->entry, paramIndex, paramOffset, paramSize);
    });
}

// --- Modules (per context).

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuModuleLoadData(CUmodule* module, const void* image) {
    return entry([&](state& s) { return load_module(s, module, image); });
}

namespace {

// JIT logs as the real driver writes them: into the buffers the options name, at most their size, the size
// options then say how much was written.
struct jit_logs {
    char* info = nullptr;
    char* error = nullptr;
    size_t info_size = 0, error_size = 0;
    void** info_size_slot = nullptr;
    void** error_size_slot = nullptr;

    jit_logs(unsigned n, CUjit_option* o, void** v) {
        for (unsigned i = 0; i < n; ++i) {
            auto size = static_cast<size_t>(reinterpret_cast<uintptr_t>(v[i]));
            switch (o[i]) {
                case CU_JIT_INFO_LOG_BUFFER:
                    info = static_cast<char*>(v[i]);
                    break;
                case CU_JIT_ERROR_LOG_BUFFER:
                    error = static_cast<char*>(v[i]);
                    break;
                case CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES:
                    info_size = size;
                    info_size_slot = &v[i];
                    break;
                case CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES:
                    error_size = size;
                    error_size_slot = &v[i];
                    break;
                default:
                    break;
            }
        }
    }
    static void put(char* buf, size_t cap, void** slot, const char* text) {
        if (!buf || cap == 0) return;
        size_t n = std::min(std::strlen(text), cap - 1);
        std::memcpy(buf, text, n);
        buf[n] = '\0';
        if (slot) *slot = reinterpret_cast<void*>(uintptr_t{n + 1});
    }
    void info_text(const char* t) { put(info, info_size, info_size_slot, t); }
    void error_text(const char* t) { put(error, error_size, error_size_slot, t); }
};

// PTX is text: the software driver "compiles" it by checking for the directive every PTX file has and for a
// line a test marks as invalid.
bool is_ptx(const void* image) {
    return std::strncmp(static_cast<const char*>(image), "//", 2) == 0 ||
           std::strncmp(static_cast<const char*>(image), ".version", 8) == 0;
}
bool valid_ptx(const char* text) {
    return std::strstr(text, ".version") && !std::strstr(text, "this is not PTX");
}

}  // namespace

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuModuleLoadDataEx(CUmodule* module, const void* image,
                                                      unsigned int numOptions, CUjit_option* options,
                                                      void** optionValues) {
    return entry([&](state& s) -> CUresult {
        if (numOptions > 0 && (options == nullptr || optionValues == nullptr))
            return CUDA_ERROR_INVALID_VALUE;
        jit_logs logs(numOptions, options, optionValues);
        if (image && is_ptx(image) && !valid_ptx(static_cast<const char*>(image))) {
            logs.error_text("soft driver: invalid PTX");
            return CUDA_ERROR_INVALID_PTX;
        }
        logs.info_text("soft driver: loaded without compiling");
        return load_module(s, module, image);
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuLinkCreate_v2(unsigned int numOptions, CUjit_option* options,
                                                   void** optionValues, CUlinkState* stateOut) {
    return entry([&](state& s) -> CUresult {
        if (!stateOut || (numOptions > 0 && (options == nullptr || optionValues == nullptr)))
            return CUDA_ERROR_INVALID_VALUE;
        context_obj* c = nullptr;
        if (CUresult r = require_context(s, c); r != CUDA_SUCCESS) return r;
        jit_logs logs(numOptions, options, optionValues);
        link_obj* l = s.create<link_obj>();
        l->info_log = logs.info;
        l->info_size = logs.info_size;
        l->error_log = logs.error;
        l->error_size = logs.error_size;
        *stateOut = to_handle<CUlinkState>(l->handle);
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuLinkAddData_v2(CUlinkState state, CUjitInputType type, void* data,
                                                    size_t size, const char*, unsigned int, CUjit_option*,
                                                    void**) {
    return entry([&](struct state& s) -> CUresult {
        link_obj* l = s.find<link_obj>(state);
        if (l == nullptr) return CUDA_ERROR_INVALID_HANDLE;
        if (data == nullptr || size == 0 || type >= CU_JIT_NUM_INPUT_TYPES) return CUDA_ERROR_INVALID_VALUE;
        if (type == CU_JIT_INPUT_PTX && !valid_ptx(static_cast<const char*>(data))) {
            jit_logs::put(l->error_log, l->error_size, nullptr, "soft driver: invalid PTX");
            return CUDA_ERROR_INVALID_PTX;
        }
        const char* b = static_cast<const char*>(data);
        l->inputs.emplace_back(b, b + size);
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuLinkComplete(CUlinkState state, void** cubinOut, size_t* sizeOut) {
    return entry([&](struct state& s) -> CUresult {
        link_obj* l = s.find<link_obj>(state);
        if (l == nullptr) return CUDA_ERROR_INVALID_HANDLE;
        if (!cubinOut || !sizeOut || l->inputs.empty()) return CUDA_ERROR_INVALID_VALUE;
        l->image = l->inputs.front();
        jit_logs::put(l->info_log, l->info_size, nullptr, "soft driver: linked");
        *cubinOut = l->image.data();
        *sizeOut = l->image.size();
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuLinkDestroy(CUlinkState state) {
    return entry([&](struct state& s) -> CUresult {
        if (s.find<link_obj>(state) == nullptr) return CUDA_ERROR_INVALID_HANDLE;
        s.erase(reinterpret_cast<uintptr_t>(state));
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuModuleLoadFatBinary(CUmodule* module, const void* fatCubin) {
    return entry([&](state& s) { return load_module(s, module, fatCubin); });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuModuleUnload(CUmodule hmod) {
    return entry([&](state& s) -> CUresult {
        module_obj* m = s.find<module_obj>(hmod);
        if (m == nullptr || m->library != 0) return CUDA_ERROR_INVALID_HANDLE;
        destroy_module(s, m->handle);
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuModuleGetFunction(CUfunction* hfunc, CUmodule hmod, const char* name) {
    return entry([&](state& s) -> CUresult {
        if (hfunc == nullptr || name == nullptr) return CUDA_ERROR_INVALID_VALUE;
        module_obj* m = s.find<module_obj>(hmod);
        if (m == nullptr) return CUDA_ERROR_INVALID_HANDLE;
        const kernel_entry* e = find_kernel(name);
        if (e == nullptr) return CUDA_ERROR_NOT_FOUND;
        *hfunc = to_handle<CUfunction>(module_function(s, *m, e)->handle);
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuModuleGetFunctionCount(unsigned int* count, CUmodule mod) {
    return entry([&](state& s) -> CUresult {
        if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
        if (s.find<module_obj>(mod) == nullptr) return CUDA_ERROR_INVALID_HANDLE;
        *count = static_cast<unsigned>(registered_kernels().size());
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuModuleEnumerateFunctions(CUfunction* functions,
                                                              unsigned int numFunctions, CUmodule mod) {
    return entry([&](state& s) -> CUresult {
        if (functions == nullptr || numFunctions == 0) return CUDA_ERROR_INVALID_VALUE;
        module_obj* m = s.find<module_obj>(mod);
        if (m == nullptr) return CUDA_ERROR_INVALID_HANDLE;
        std::vector<const kernel_entry*> all = registered_kernels();
        for (size_t i = 0; i < all.size() && i < numFunctions; ++i)
            functions[i] = to_handle<CUfunction>(module_function(s, *m, all[i])->handle);
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuModuleGetGlobal_v2(CUdeviceptr* dptr, size_t* bytes, CUmodule hmod,
                                                        const char* name) {
    return entry([&](state& s) -> CUresult {
        module_obj* m = s.find<module_obj>(hmod);
        if (m == nullptr) return CUDA_ERROR_INVALID_HANDLE;
        context_obj* c = usable_context(s, m->ctx);
        return get_global(s, globals_of(s, *m), dptr, bytes, name, c != nullptr ? c->device : 0);
    });
}

// Lazy unless CUDA_MODULE_LOADING=EAGER, like the real driver.
VCUDA_SOFT_EXPORT CUresult CUDAAPI cuModuleGetLoadingMode(CUmoduleLoadingMode* mode) {
    return entry([&](state&) -> CUresult {
        if (mode == nullptr) return CUDA_ERROR_INVALID_VALUE;
        const char* env = std::getenv("CUDA_MODULE_LOADING");
        *mode = env != nullptr && std::strcmp(env, "EAGER") == 0 ? CU_MODULE_EAGER_LOADING
                                                                 : CU_MODULE_LAZY_LOADING;
        return CUDA_SUCCESS;
    });
}

// --- Functions (CUfunction; a CUkernel cast to CUfunction is accepted where the real driver accepts it).

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuFuncGetAttribute(int* pi, CUfunction_attribute attrib,
                                                      CUfunction hfunc) {
    return entry([&](state& s) -> CUresult {
        if (pi == nullptr) return CUDA_ERROR_INVALID_VALUE;
        callable c;
        if (CUresult r = resolve_callable(s, hfunc, c); r != CUDA_SUCCESS) return r;
        return get_attr(*c.attrs, attrib, *pi);
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuFuncSetAttribute(CUfunction hfunc, CUfunction_attribute attrib,
                                                      int value) {
    return entry([&](state& s) -> CUresult {
        callable c;
        if (CUresult r = resolve_callable(s, hfunc, c); r != CUDA_SUCCESS) return r;
        return set_attr(*c.attrs, attrib, value);
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuFuncSetCacheConfig(CUfunction hfunc, CUfunc_cache config) {
    return entry([&](state& s) -> CUresult {
        callable c;
        if (CUresult r = resolve_callable(s, hfunc, c); r != CUDA_SUCCESS) return r;
        if (config < CU_FUNC_CACHE_PREFER_NONE || config > CU_FUNC_CACHE_PREFER_EQUAL)
            return CUDA_ERROR_INVALID_VALUE;
        c.attrs->cache = config;
        return CUDA_SUCCESS;
    });
}

// Checked and ignored, as cuCtxSetSharedMemConfig.
VCUDA_SOFT_EXPORT CUresult CUDAAPI cuFuncSetSharedMemConfig(CUfunction hfunc, CUsharedconfig config) {
    return entry([&](state& s) -> CUresult {
        callable c;
        if (CUresult r = resolve_callable(s, hfunc, c); r != CUDA_SUCCESS) return r;
        return config >= CU_SHARED_MEM_CONFIG_DEFAULT_BANK_SIZE &&
                       config <= CU_SHARED_MEM_CONFIG_EIGHT_BYTE_BANK_SIZE
                   ? CUDA_SUCCESS
                   : CUDA_ERROR_INVALID_VALUE;
    });
}

// Measured on the real driver: a CUkernel cast to CUfunction answers CUDA_ERROR_INVALID_HANDLE here.
VCUDA_SOFT_EXPORT CUresult CUDAAPI cuFuncGetParamInfo(CUfunction func, size_t paramIndex, size_t* paramOffset,
                                                      size_t* paramSize) {
    return entry([&](state& s) -> CUresult {
        function_obj* f = s.find<function_obj>(func);
        if (f == nullptr) return CUDA_ERROR_INVALID_HANDLE;
        return param_info(*f->entry, paramIndex, paramOffset, paramSize);
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuFuncGetName(const char** name, CUfunction hfunc) {
    return entry([&](state& s) -> CUresult {
        if (name == nullptr || hfunc == nullptr) return CUDA_ERROR_INVALID_VALUE;
        callable c;
        if (CUresult r = resolve_callable(s, hfunc, c); r != CUDA_SUCCESS) return r;
        *name = c.name->c_str();
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuFuncGetModule(CUmodule* hmod, CUfunction hfunc) {
    return entry([&](state& s) -> CUresult {
        if (hmod == nullptr) return CUDA_ERROR_INVALID_VALUE;
        function_obj* f = s.find<function_obj>(hfunc);
        if (f == nullptr) return CUDA_ERROR_INVALID_HANDLE;
        *hmod = to_handle<CUmodule>(f->module);
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuFuncIsLoaded(CUfunctionLoadingState* state_out, CUfunction function) {
    return entry([&](state& s) -> CUresult {
        if (state_out == nullptr) return CUDA_ERROR_INVALID_VALUE;
        callable c;
        if (CUresult r = resolve_callable(s, function, c); r != CUDA_SUCCESS) return r;
        *state_out = CU_FUNCTION_LOADING_STATE_LOADED;
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuFuncLoad(CUfunction function) {
    return entry([&](state& s) -> CUresult {
        callable c;
        return resolve_callable(s, function, c);
    });
}

// --- Occupancy.

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
    int* numBlocks, CUfunction func, int blockSize, size_t dynamicSMemSize, unsigned int flags) {
    return entry([&](state& s) -> CUresult {
        if (numBlocks == nullptr || blockSize <= 0) return CUDA_ERROR_INVALID_VALUE;
        if (flags != CU_OCCUPANCY_DEFAULT && flags != CU_OCCUPANCY_DISABLE_CACHING_OVERRIDE)
            return CUDA_ERROR_INVALID_VALUE;
        callable c;
        if (CUresult r = resolve_callable(s, func, c); r != CUDA_SUCCESS) return r;
        *numBlocks = blocks_per_sm(*c.attrs, blockSize, dynamicSMemSize);
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuOccupancyMaxActiveBlocksPerMultiprocessor(int* numBlocks,
                                                                               CUfunction func, int blockSize,
                                                                               size_t dynamicSMemSize) {
    return cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(numBlocks, func, blockSize, dynamicSMemSize,
                                                                CU_OCCUPANCY_DEFAULT);
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuOccupancyMaxPotentialBlockSizeWithFlags(
    int* minGridSize, int* blockSize, CUfunction func, CUoccupancyB2DSize blockSizeToDynamicSMemSize,
    size_t dynamicSMemSize, int blockSizeLimit, unsigned int flags) {
    return entry_then([&](state& s, work& w) {
        return max_potential_block_size(s, w, minGridSize, blockSize, func, blockSizeToDynamicSMemSize,
                                        dynamicSMemSize, blockSizeLimit, flags);
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuOccupancyMaxPotentialBlockSize(
    int* minGridSize, int* blockSize, CUfunction func, CUoccupancyB2DSize blockSizeToDynamicSMemSize,
    size_t dynamicSMemSize, int blockSizeLimit) {
    return cuOccupancyMaxPotentialBlockSizeWithFlags(minGridSize, blockSize, func, blockSizeToDynamicSMemSize,
                                                     dynamicSMemSize, blockSizeLimit, CU_OCCUPANCY_DEFAULT);
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuOccupancyAvailableDynamicSMemPerBlock(size_t* dynamicSmemSize,
                                                                           CUfunction func, int numBlocks,
                                                                           int blockSize) {
    return entry([&](state& s) -> CUresult {
        if (dynamicSmemSize == nullptr || numBlocks <= 0 || blockSize <= 0) return CUDA_ERROR_INVALID_VALUE;
        callable c;
        if (CUresult r = resolve_callable(s, func, c); r != CUDA_SUCCESS) return r;
        func_attrs unlimited = *c.attrs;
        unlimited.max_dynamic_shared = shared_per_block_optin;
        if (blocks_per_sm(unlimited, blockSize, 0) < numBlocks) {
            *dynamicSmemSize = 0;
            return CUDA_SUCCESS;
        }
        long per_block = shared_per_sm / numBlocks - reserved_shared_per_block;
        per_block = std::clamp(per_block, 0L, static_cast<long>(shared_per_block_optin));
        *dynamicSmemSize = static_cast<size_t>(per_block);
        return CUDA_SUCCESS;
    });
}

namespace {

// The cluster a launch configuration asks for: its attribute, else the function's required size, else 1.
CUresult config_cluster(const CUlaunchConfig* config, const func_attrs& a, unsigned& size) {
    unsigned x = a.cluster_w > 0 ? static_cast<unsigned>(a.cluster_w) : 1;
    unsigned y = a.cluster_h > 0 ? static_cast<unsigned>(a.cluster_h) : 1;
    unsigned z = a.cluster_d > 0 ? static_cast<unsigned>(a.cluster_d) : 1;
    if (config->numAttrs > 0 && config->attrs == nullptr) return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < config->numAttrs; ++i) {
        if (config->attrs[i].id == CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION) {
            x = config->attrs[i].value.clusterDim.x;
            y = config->attrs[i].value.clusterDim.y;
            z = config->attrs[i].value.clusterDim.z;
        }
    }
    if (x == 0 || y == 0 || z == 0) return CUDA_ERROR_INVALID_CLUSTER_SIZE;
    size = x * y * z;
    if (size > (a.non_portable_cluster != 0 ? 16u : 8u)) return CUDA_ERROR_INVALID_CLUSTER_SIZE;
    return CUDA_SUCCESS;
}

}  // namespace

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuOccupancyMaxActiveClusters(int* numClusters, CUfunction func,
                                                                const CUlaunchConfig* config) {
    return entry([&](state& s) -> CUresult {
        if (numClusters == nullptr || config == nullptr) return CUDA_ERROR_INVALID_VALUE;
        callable c;
        if (CUresult r = resolve_callable(s, func, c); r != CUDA_SUCCESS) return r;
        unsigned size = 1;
        if (CUresult r = config_cluster(config, *c.attrs, size); r != CUDA_SUCCESS) return r;
        long block = static_cast<long>(config->blockDimX) * config->blockDimY * config->blockDimZ;
        long blocks = static_cast<long>(blocks_per_sm(*c.attrs, block, config->sharedMemBytes)) * sm_count;
        *numClusters = static_cast<int>(blocks / size);
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuOccupancyMaxPotentialClusterSize(int* clusterSize, CUfunction func,
                                                                      const CUlaunchConfig* config) {
    return entry([&](state& s) -> CUresult {
        if (clusterSize == nullptr || config == nullptr) return CUDA_ERROR_INVALID_VALUE;
        callable c;
        if (CUresult r = resolve_callable(s, func, c); r != CUDA_SUCCESS) return r;
        *clusterSize = c.attrs->non_portable_cluster != 0 ? 16 : 8;
        return CUDA_SUCCESS;
    });
}

// --- Launches.

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                                  unsigned int gridDimZ, unsigned int blockDimX,
                                                  unsigned int blockDimY, unsigned int blockDimZ,
                                                  unsigned int sharedMemBytes, CUstream hStream,
                                                  void** kernelParams, void** extra) {
    return entry_then([&](state& s, work& w) {
        launch_request q;
        q.f = f;
        q.grid = {gridDimX, gridDimY, gridDimZ};
        q.block = {blockDimX, blockDimY, blockDimZ};
        q.shared = sharedMemBytes;
        q.stream = hStream;
        q.kernel_params = kernelParams;
        q.extra = extra;
        return prepare_launch(s, w, q);
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuLaunchCooperativeKernel(CUfunction f, unsigned int gridDimX,
                                                             unsigned int gridDimY, unsigned int gridDimZ,
                                                             unsigned int blockDimX, unsigned int blockDimY,
                                                             unsigned int blockDimZ,
                                                             unsigned int sharedMemBytes, CUstream hStream,
                                                             void** kernelParams) {
    return entry_then([&](state& s, work& w) {
        launch_request q;
        q.f = f;
        q.grid = {gridDimX, gridDimY, gridDimZ};
        q.block = {blockDimX, blockDimY, blockDimZ};
        q.shared = sharedMemBytes;
        q.stream = hStream;
        q.kernel_params = kernelParams;
        q.cooperative = true;
        return prepare_launch(s, w, q);
    });
}

// Attributes are checked, and honoured where they change what is valid (cooperative, cluster dimension).
VCUDA_SOFT_EXPORT CUresult CUDAAPI cuLaunchKernelEx(const CUlaunchConfig* config, CUfunction f,
                                                    void** kernelParams, void** extra) {
    return entry_then([&](state& s, work& w) -> CUresult {
        if (config == nullptr) return CUDA_ERROR_INVALID_VALUE;
        if (config->numAttrs > 0 && config->attrs == nullptr) return CUDA_ERROR_INVALID_VALUE;
        launch_request q;
        q.f = f;
        q.grid = {config->gridDimX, config->gridDimY, config->gridDimZ};
        q.block = {config->blockDimX, config->blockDimY, config->blockDimZ};
        q.shared = config->sharedMemBytes;
        q.stream = config->hStream;
        q.kernel_params = kernelParams;
        q.extra = extra;
        std::vector<CUevent> events;  // recorded by the launch
        for (unsigned i = 0; i < config->numAttrs; ++i) {
            const CUlaunchAttribute& a = config->attrs[i];
            switch (a.id) {
                case CU_LAUNCH_ATTRIBUTE_COOPERATIVE:
                    q.cooperative = a.value.cooperative != 0;
                    break;
                case CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION:
                    q.cluster_x = a.value.clusterDim.x;
                    q.cluster_y = a.value.clusterDim.y;
                    q.cluster_z = a.value.clusterDim.z;
                    if (q.cluster_x == 0) return CUDA_ERROR_INVALID_CLUSTER_SIZE;
                    break;
                case CU_LAUNCH_ATTRIBUTE_PRIORITY:
                case CU_LAUNCH_ATTRIBUTE_IGNORE:
                case CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW:
                case CU_LAUNCH_ATTRIBUTE_SYNCHRONIZATION_POLICY:
                case CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE:
                case CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION:
                case CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP:
                case CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN:
                case CU_LAUNCH_ATTRIBUTE_PREFERRED_CLUSTER_DIMENSION:
                case CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE:
                case CU_LAUNCH_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT:
                case CU_LAUNCH_ATTRIBUTE_NVLINK_UTIL_CENTRIC_SCHEDULING:
                    break;
                case CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_EVENT:  // the kernel ran by the time the call returns
                    events.push_back(a.value.programmaticEvent.event);
                    break;
                case CU_LAUNCH_ATTRIBUTE_LAUNCH_COMPLETION_EVENT:
                    events.push_back(a.value.launchCompletionEvent.event);
                    break;
                default:
                    return CUDA_ERROR_INVALID_VALUE;
            }
        }
        for (CUevent e : events)
            if (s.find<event_obj>(e) == nullptr) return CUDA_ERROR_INVALID_HANDLE;
        if (CUresult r = prepare_launch(s, w, q); r != CUDA_SUCCESS) return r;
        for (CUevent e : events)
            if (CUresult r = record_event(s, e, q.stream); r != CUDA_SUCCESS) return r;
        return CUDA_SUCCESS;
    });
}
