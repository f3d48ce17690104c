// The software test driver: contexts. One primary context per device (a fixed handle, active while retained)
// and any number of created ones; a per-thread stack of current contexts, as in the real driver. Destroying a
// context, or releasing a primary one for the last time, frees everything it owns (streams, events, modules,
// allocations): a server session that drops its context leaks nothing.
#include <algorithm>

#include "soft_state.hpp"

namespace vcuda::soft {

std::array<size_t, CU_LIMIT_MAX> default_limits() {
    std::array<size_t, CU_LIMIT_MAX> l{};
    l[CU_LIMIT_STACK_SIZE] = 1024;
    l[CU_LIMIT_PRINTF_FIFO_SIZE] = 1048576;
    l[CU_LIMIT_MALLOC_HEAP_SIZE] = 8388608;
    l[CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH] = 2;
    l[CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT] = 2048;
    l[CU_LIMIT_MAX_L2_FETCH_GRANULARITY] = 64;
    l[CU_LIMIT_PERSISTING_L2_CACHE_SIZE] = 0;
    return l;
}

namespace {

thread_local std::vector<uint64_t> ctx_stack;

bool valid_ctx_flags(unsigned flags) {
    if ((flags & ~static_cast<unsigned>(CU_CTX_FLAGS_MASK)) != 0) return false;
    unsigned sched = flags & CU_CTX_SCHED_MASK;
    return sched == CU_CTX_SCHED_AUTO || sched == CU_CTX_SCHED_SPIN || sched == CU_CTX_SCHED_YIELD ||
           sched == CU_CTX_SCHED_BLOCKING_SYNC;
}

void reset_context_settings(context_obj& c) {
    c.limits = default_limits();
    c.cache_config = CU_FUNC_CACHE_PREFER_NONE;
}

void forget_on_this_thread(uint64_t h) {
    ctx_stack.erase(std::remove(ctx_stack.begin(), ctx_stack.end(), h), ctx_stack.end());
}

CUresult create_context(state& s, CUcontext* pctx, unsigned flags, CUdevice dev, unsigned api_version) {
    if (pctx == nullptr || !valid_ctx_flags(flags)) return CUDA_ERROR_INVALID_VALUE;
    if (!s.valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
    context_obj* c = s.create<context_obj>();
    c->device = dev;
    c->flags = flags;
    c->id = s.next_ctx_id++;
    c->api_version = api_version;
    reset_context_settings(*c);
    ctx_stack.push_back(c->handle);
    *pctx = to_handle<CUcontext>(c->handle);
    return CUDA_SUCCESS;
}

// The context a call names, or the current one when it names none.
CUresult named_or_current(state& s, CUcontext ctx, context_obj*& out) {
    if (ctx == nullptr) return require_context(s, out);
    out = usable_context(s, from_handle(ctx));
    return out != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

}  // namespace

void create_primary_contexts(state& s) {
    for (size_t i = 0; i < s.devices.size(); ++i) {
        context_obj* c = s.create<context_obj>();
        c->device = static_cast<int>(i);
        c->primary = true;
        c->active = false;
        c->id = s.next_ctx_id++;
        reset_context_settings(*c);
        s.devices[i].primary_ctx = c->handle;
    }
}

context_obj* usable_context(state& s, uint64_t h) {
    context_obj* c = s.find<context_obj>(h);
    if (c == nullptr || (c->primary && !c->active)) return nullptr;
    return c;
}

context_obj* current_context(state& s) {
    if (ctx_stack.empty()) return nullptr;
    return usable_context(s, ctx_stack.back());
}

uint64_t current_context_handle() { return ctx_stack.empty() ? 0 : ctx_stack.back(); }

CUresult require_context(state& s, context_obj*& out) {
    out = current_context(s);
    return out != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

void release_context_resources(state& s, context_obj& c) {
    std::vector<uint64_t> modules, functions, execs, others;
    for (auto& [h, obj] : s.objects) {
        switch (obj->k) {
            case kind::module:
                if (static_cast<module_obj*>(obj.get())->ctx == c.handle) modules.push_back(h);
                break;
            case kind::function:
                if (static_cast<function_obj*>(obj.get())->ctx == c.handle) functions.push_back(h);
                break;
            case kind::stream:
                if (static_cast<stream_obj*>(obj.get())->ctx == c.handle) others.push_back(h);
                break;
            case kind::event:
                if (static_cast<event_obj*>(obj.get())->ctx == c.handle) others.push_back(h);
                break;
            case kind::graph_exec:
                if (static_cast<graph_exec_obj*>(obj.get())->ctx == c.handle) execs.push_back(h);
                break;
            default:
                break;
        }
    }
    end_captures_of(s, c.handle);
    forget_context_objects(c.handle);
    for (uint64_t h : modules) destroy_module(s, h);
    for (uint64_t h : functions)
        if (s.find<function_obj>(h) != nullptr) destroy_function(s, h);
    for (uint64_t h : execs) destroy_graph_exec(s, h);
    for (uint64_t h : others) s.erase(h);

    std::vector<uintptr_t> owned;
    for (auto& [base, r] : s.ranges)
        if (r.ctx == c.handle) owned.push_back(base);
    for (uintptr_t base : owned) free_range(s, base);
    reset_context_settings(c);
}

}  // namespace vcuda::soft

using namespace vcuda::soft;

// --- Primary contexts.

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
    return entry([&](state& s) -> CUresult {
        if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
        if (!s.valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
        context_obj* c = s.find<context_obj>(s.devices[static_cast<size_t>(dev)].primary_ctx);
        if (!c->active) {
            c->active = true;
            reset_context_settings(*c);
        }
        ++c->refcount;
        *pctx = to_handle<CUcontext>(c->handle);
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
    return entry([&](state& s) -> CUresult {
        if (!s.valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
        context_obj* c = s.find<context_obj>(s.devices[static_cast<size_t>(dev)].primary_ctx);
        if (c->refcount == 0) return CUDA_ERROR_INVALID_CONTEXT;
        if (--c->refcount == 0) {
            release_context_resources(s, *c);
            c->active = false;
        }
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxReset_v2(CUdevice dev) {
    return entry([&](state& s) -> CUresult {
        if (!s.valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
        context_obj* c = s.find<context_obj>(s.devices[static_cast<size_t>(dev)].primary_ctx);
        release_context_resources(s, *c);
        c->refcount = 0;
        c->active = false;
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int* flags,
                                                              int* active) {
    return entry([&](state& s) -> CUresult {
        if (flags == nullptr || active == nullptr) return CUDA_ERROR_INVALID_VALUE;
        if (!s.valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
        context_obj* c = s.find<context_obj>(s.devices[static_cast<size_t>(dev)].primary_ctx);
        *flags = c->flags;
        *active = c->active ? 1 : 0;
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags) {
    return entry([&](state& s) -> CUresult {
        if (!s.valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
        if (!valid_ctx_flags(flags)) return CUDA_ERROR_INVALID_VALUE;
        s.find<context_obj>(s.devices[static_cast<size_t>(dev)].primary_ctx)->flags = flags;
        return CUDA_SUCCESS;
    });
}

// The pre-11.0 names of the three calls above have the same signatures; cuda.h maps them to _v2.
#undef cuDevicePrimaryCtxRelease
#undef cuDevicePrimaryCtxReset
#undef cuDevicePrimaryCtxSetFlags
VCUDA_SOFT_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice dev);
VCUDA_SOFT_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxReset(CUdevice dev);
VCUDA_SOFT_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxSetFlags(CUdevice dev, unsigned int flags);
CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice dev) { return cuDevicePrimaryCtxRelease_v2(dev); }
CUresult CUDAAPI cuDevicePrimaryCtxReset(CUdevice dev) { return cuDevicePrimaryCtxReset_v2(dev); }
CUresult CUDAAPI cuDevicePrimaryCtxSetFlags(CUdevice dev, unsigned int flags) {
    return cuDevicePrimaryCtxSetFlags_v2(dev, flags);
}

// --- Created contexts. cuda.h declares only the newest cuCtxCreate; the older signatures are declared here.

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuCtxCreate_v2(CUcontext* pctx, unsigned int flags, CUdevice dev);
VCUDA_SOFT_EXPORT CUresult CUDAAPI cuCtxCreate_v3(CUcontext* pctx, CUexecAffinityParam* paramsArray,
                                                  int numParams, unsigned int flags, CUdevice dev);

CUresult CUDAAPI cuCtxCreate_v2(CUcontext* pctx, unsigned int flags, CUdevice dev) {
    return entry([&](state& s) { return create_context(s, pctx, flags, dev, 3020); });
}

CUresult CUDAAPI cuCtxCreate_v3(CUcontext* pctx, CUexecAffinityParam* paramsArray, int numParams,
                                unsigned int flags, CUdevice dev) {
    return entry([&](state& s) -> CUresult {
        if (numParams < 0 || (numParams > 0 && paramsArray == nullptr)) return CUDA_ERROR_INVALID_VALUE;
        if (numParams > 0) return CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY;
        return create_context(s, pctx, flags, dev, 3020);
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuCtxCreate_v4(CUcontext* pctx, CUctxCreateParams* ctxCreateParams,
                                                  unsigned int flags, CUdevice dev) {
    return entry([&](state& s) -> CUresult {
        if (ctxCreateParams != nullptr) {
            bool affinity =
                ctxCreateParams->execAffinityParams != nullptr || ctxCreateParams->numExecAffinityParams != 0;
            if (affinity && ctxCreateParams->cigParams != nullptr) return CUDA_ERROR_INVALID_VALUE;
            if (ctxCreateParams->numExecAffinityParams < 0) return CUDA_ERROR_INVALID_VALUE;
            if (affinity) return CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY;
            if (ctxCreateParams->cigParams != nullptr) return CUDA_ERROR_NOT_SUPPORTED;
        }
        return create_context(s, pctx, flags, dev, 3020);
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuCtxDestroy_v2(CUcontext ctx) {
    return entry([&](state& s) -> CUresult {
        context_obj* c = s.find<context_obj>(from_handle(ctx));
        if (c == nullptr || c->primary) return CUDA_ERROR_INVALID_CONTEXT;
        release_context_resources(s, *c);
        forget_on_this_thread(c->handle);
        s.erase(c->handle);
        return CUDA_SUCCESS;
    });
}

// --- The current context.

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx) {
    return entry([&](state& s) -> CUresult {
        if (ctx == nullptr) {
            if (!ctx_stack.empty()) ctx_stack.pop_back();
            return CUDA_SUCCESS;
        }
        if (s.find<context_obj>(from_handle(ctx)) == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
        if (ctx_stack.empty())
            ctx_stack.push_back(from_handle(ctx));
        else
            ctx_stack.back() = from_handle(ctx);
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuCtxGetCurrent(CUcontext* pctx) {
    return entry([&](state& s) -> CUresult {
        if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
        uint64_t h = ctx_stack.empty() ? 0 : ctx_stack.back();
        *pctx = h != 0 && s.find<context_obj>(h) != nullptr ? to_handle<CUcontext>(h) : nullptr;
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuCtxPushCurrent_v2(CUcontext ctx) {
    return entry([&](state& s) -> CUresult {
        if (ctx == nullptr || s.find<context_obj>(from_handle(ctx)) == nullptr)
            return CUDA_ERROR_INVALID_CONTEXT;
        ctx_stack.push_back(from_handle(ctx));
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuCtxPopCurrent_v2(CUcontext* pctx) {
    return entry([&](state&) -> CUresult {
        if (ctx_stack.empty()) return CUDA_ERROR_INVALID_CONTEXT;
        uint64_t h = ctx_stack.back();
        ctx_stack.pop_back();
        if (pctx != nullptr) *pctx = to_handle<CUcontext>(h);
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuCtxGetDevice(CUdevice* device) {
    return entry([&](state& s) -> CUresult {
        if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
        context_obj* c = nullptr;
        if (CUresult r = require_context(s, c); r != CUDA_SUCCESS) return r;
        *device = c->device;
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuCtxGetDevice_v2(CUdevice* device, CUcontext ctx) {
    return entry([&](state& s) -> CUresult {
        if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
        context_obj* c = nullptr;
        if (CUresult r = named_or_current(s, ctx, c); r != CUDA_SUCCESS) return r;
        *device = c->device;
        return CUDA_SUCCESS;
    });
}

// Work runs synchronously, so there is never anything to wait for.
VCUDA_SOFT_EXPORT CUresult CUDAAPI cuCtxSynchronize(void) {
    return entry([&](state& s) -> CUresult {
        context_obj* c = nullptr;
        return require_context(s, c);
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuCtxSynchronize_v2(CUcontext ctx) {
    return entry([&](state& s) -> CUresult {
        context_obj* c = nullptr;
        return named_or_current(s, ctx, c);
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuCtxGetApiVersion(CUcontext ctx, unsigned int* version) {
    return entry([&](state& s) -> CUresult {
        if (version == nullptr) return CUDA_ERROR_INVALID_VALUE;
        context_obj* c = nullptr;
        if (CUresult r = named_or_current(s, ctx, c); r != CUDA_SUCCESS) return r;
        *version = c->api_version;
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuCtxGetId(CUcontext ctx, unsigned long long* ctxId) {
    return entry([&](state& s) -> CUresult {
        if (ctxId == nullptr) return CUDA_ERROR_INVALID_VALUE;
        context_obj* c = nullptr;
        if (CUresult r = named_or_current(s, ctx, c); r != CUDA_SUCCESS) return r;
        *ctxId = c->id;
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuCtxSetLimit(CUlimit limit, size_t value) {
    return entry([&](state& s) -> CUresult {
        context_obj* c = nullptr;
        if (CUresult r = require_context(s, c); r != CUDA_SUCCESS) return r;
        if (limit < 0 || limit >= CU_LIMIT_MAX) return CUDA_ERROR_INVALID_VALUE;
        switch (limit) {
            case CU_LIMIT_SHMEM_SIZE:
            case CU_LIMIT_CIG_ENABLED:
            case CU_LIMIT_CIG_SHMEM_FALLBACK_ENABLED:
                return CUDA_ERROR_UNSUPPORTED_LIMIT;
            case CU_LIMIT_MAX_L2_FETCH_GRANULARITY:
                if (value > 128) value = 128;
                break;
            case CU_LIMIT_PERSISTING_L2_CACHE_SIZE:
                if (value > 39321600) value = 39321600;
                break;
            default:
                break;
        }
        c->limits[static_cast<size_t>(limit)] = value;
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuCtxGetLimit(size_t* pvalue, CUlimit limit) {
    return entry([&](state& s) -> CUresult {
        if (pvalue == nullptr) return CUDA_ERROR_INVALID_VALUE;
        context_obj* c = nullptr;
        if (CUresult r = require_context(s, c); r != CUDA_SUCCESS) return r;
        if (limit < 0 || limit >= CU_LIMIT_MAX) return CUDA_ERROR_INVALID_VALUE;
        *pvalue = c->limits[static_cast<size_t>(limit)];
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuCtxGetFlags(unsigned int* flags) {
    return entry([&](state& s) -> CUresult {
        if (flags == nullptr) return CUDA_ERROR_INVALID_VALUE;
        context_obj* c = nullptr;
        if (CUresult r = require_context(s, c); r != CUDA_SUCCESS) return r;
        *flags = c->flags;
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuCtxSetFlags(unsigned int flags) {
    return entry([&](state& s) -> CUresult {
        context_obj* c = nullptr;
        if (CUresult r = require_context(s, c); r != CUDA_SUCCESS) return r;
        if (!valid_ctx_flags(flags)) return CUDA_ERROR_INVALID_VALUE;
        c->flags = flags;
        return CUDA_SUCCESS;
    });
}

// H100 answers least 0, greatest -5. Either pointer may be NULL.
VCUDA_SOFT_EXPORT CUresult CUDAAPI cuCtxGetStreamPriorityRange(int* leastPriority, int* greatestPriority) {
    return entry([&](state&) -> CUresult {
        if (leastPriority != nullptr) *leastPriority = least_stream_priority;
        if (greatestPriority != nullptr) *greatestPriority = greatest_stream_priority;
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuCtxSetCacheConfig(CUfunc_cache config) {
    return entry([&](state& s) -> CUresult {
        context_obj* c = nullptr;
        if (CUresult r = require_context(s, c); r != CUDA_SUCCESS) return r;
        if (config < CU_FUNC_CACHE_PREFER_NONE || config > CU_FUNC_CACHE_PREFER_EQUAL)
            return CUDA_ERROR_INVALID_VALUE;
        c->cache_config = config;
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuCtxGetCacheConfig(CUfunc_cache* pconfig) {
    return entry([&](state& s) -> CUresult {
        if (pconfig == nullptr) return CUDA_ERROR_INVALID_VALUE;
        context_obj* c = nullptr;
        if (CUresult r = require_context(s, c); r != CUDA_SUCCESS) return r;
        *pconfig = c->cache_config;
        return CUDA_SUCCESS;
    });
}

// Shared memory banks are four bytes wide on every device the driver supports: a setting is checked and
// ignored.
VCUDA_SOFT_EXPORT CUresult CUDAAPI cuCtxSetSharedMemConfig(CUsharedconfig config) {
    return entry([&](state& s) -> CUresult {
        context_obj* c = nullptr;
        if (CUresult r = require_context(s, c); r != CUDA_SUCCESS) return r;
        return config >= CU_SHARED_MEM_CONFIG_DEFAULT_BANK_SIZE &&
                       config <= CU_SHARED_MEM_CONFIG_EIGHT_BYTE_BANK_SIZE
                   ? CUDA_SUCCESS
                   : CUDA_ERROR_INVALID_VALUE;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuCtxGetSharedMemConfig(CUsharedconfig* pConfig) {
    return entry([&](state& s) -> CUresult {
        if (pConfig == nullptr) return CUDA_ERROR_INVALID_VALUE;
        context_obj* c = nullptr;
        if (CUresult r = require_context(s, c); r != CUDA_SUCCESS) return r;
        *pConfig = CU_SHARED_MEM_CONFIG_FOUR_BYTE_BANK_SIZE;
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuCtxResetPersistingL2Cache(void) {
    return entry([&](state& s) -> CUresult {
        context_obj* c = nullptr;
        return require_context(s, c);
    });
}

// Peer access: from the current context to a context on another device (host memory is every device's here,
// so it changes nothing but what these answer).
VCUDA_SOFT_EXPORT CUresult CUDAAPI cuCtxEnablePeerAccess(CUcontext peerContext, unsigned int Flags) {
    return entry([&](state& s) -> CUresult {
        context_obj* c = nullptr;
        if (CUresult r = require_context(s, c); r != CUDA_SUCCESS) return r;
        context_obj* p = usable_context(s, from_handle(peerContext));
        if (p == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
        if (Flags != 0) return CUDA_ERROR_INVALID_VALUE;
        if (p->device == c->device) return CUDA_ERROR_INVALID_DEVICE;
        if (std::find(c->peers.begin(), c->peers.end(), p->handle) != c->peers.end())
            return CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
        c->peers.push_back(p->handle);
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuCtxDisablePeerAccess(CUcontext peerContext) {
    return entry([&](state& s) -> CUresult {
        context_obj* c = nullptr;
        if (CUresult r = require_context(s, c); r != CUDA_SUCCESS) return r;
        if (usable_context(s, from_handle(peerContext)) == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
        auto it = std::find(c->peers.begin(), c->peers.end(), from_handle(peerContext));
        if (it == c->peers.end()) return CUDA_ERROR_PEER_ACCESS_NOT_ENABLED;
        c->peers.erase(it);
        return CUDA_SUCCESS;
    });
}
