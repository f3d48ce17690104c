// Contexts are client-side objects over the session's one server context per device: creating, pushing,
// popping and querying them costs no message. Synchronize and reset go to the server.
#include "client/deferred_copies.hpp"
#include "client/entry_point.hpp"
#include "client/peer.hpp"
#include "client/plain_call.hpp"
#include "client/state.hpp"
#include "client/trace.hpp"
#include "client_ops.hpp"

using namespace vcuda;
using namespace vcuda::client;

namespace {

bool valid_device(CUdevice d) { return d >= 0 && d < state::get().device_count(); }

uint64_t id_of(CUcontext c) { return reinterpret_cast<uint64_t>(c); }
CUcontext ctx_of(uint64_t id) { return reinterpret_cast<CUcontext>(id); }

bool context_exists(uint64_t id) {
    auto& st = state::get();
    std::shared_lock lock(st.mu);
    return st.find_context(id) != nullptr;
}

// Primary-context bookkeeping: retain count, flags, active.
struct primary_state {
    int refs = 0;
    unsigned flags = 0;
};
std::mutex primary_mu;
std::vector<primary_state>& primaries() {
    static auto* p = new std::vector<primary_state>(64);
    return *p;
}

CUresult server_sync(int device) {
    (void)device;
    CUresult rc = ctx_synchronize_call("cuCtxSynchronize").send_sync();
    if (rc == CUDA_SUCCESS) settle_finished();  // copies left under way land before it returns
    return rc;
}

}  // namespace

VCUDA_API cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) noexcept {
    VCUDA_TRACE_HOOK(cuDevicePrimaryCtxRetain, pctx, dev);
    VCUDA_REQUIRE_INIT();
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
    *pctx = ctx_of(state::get().primary_context(dev));
    std::lock_guard lock(primary_mu);
    ++primaries()[dev].refs;
    return CUDA_SUCCESS;
}

VCUDA_API cuDevicePrimaryCtxRelease_v2(CUdevice dev) noexcept {
    VCUDA_TRACE_HOOK(cuDevicePrimaryCtxRelease_v2, dev);
    VCUDA_REQUIRE_INIT();
    if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
    std::lock_guard lock(primary_mu);
    if (primaries()[dev].refs == 0) return CUDA_ERROR_INVALID_CONTEXT;
    --primaries()[dev].refs;
    return CUDA_SUCCESS;
}
VCUDA_API cuDevicePrimaryCtxRelease(CUdevice dev) noexcept {
    VCUDA_TRACE_HOOK(cuDevicePrimaryCtxRelease, dev);
    return cuDevicePrimaryCtxRelease_v2(dev);
}

VCUDA_API cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int* flags, int* active) noexcept {
    VCUDA_TRACE_HOOK(cuDevicePrimaryCtxGetState, dev, flags, active);
    VCUDA_REQUIRE_INIT();
    if (!flags || !active) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
    std::lock_guard lock(primary_mu);
    *flags = primaries()[dev].flags;
    *active = primaries()[dev].refs > 0;
    return CUDA_SUCCESS;
}

VCUDA_API cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags) noexcept {
    VCUDA_TRACE_HOOK(cuDevicePrimaryCtxSetFlags_v2, dev, flags);
    VCUDA_REQUIRE_INIT();
    if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
    std::lock_guard lock(primary_mu);
    primaries()[dev].flags = flags;
    return CUDA_SUCCESS;
}
VCUDA_API cuDevicePrimaryCtxSetFlags(CUdevice dev, unsigned int flags) noexcept {
    VCUDA_TRACE_HOOK(cuDevicePrimaryCtxSetFlags, dev, flags);
    return cuDevicePrimaryCtxSetFlags_v2(dev, flags);
}

VCUDA_API cuDevicePrimaryCtxReset_v2(CUdevice dev) noexcept {
    VCUDA_TRACE_HOOK(cuDevicePrimaryCtxReset_v2, dev);
    VCUDA_REQUIRE_INIT();
    if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
    auto& st = state::get();
    uint64_t id = st.primary_context(dev);
    {
        std::unique_lock lock(st.mu);
        auto* c = st.find_context(id);
        if (c) {
            auto copy = *c;
            c->cls.clear();
            lock.unlock();
            st.run_cls_destructors(copy);
        }
    }
    drop_cached_replies();  // the reset context's limits, functions and attributes are gone
    CUresult rc = ctx_reset_call("cuDevicePrimaryCtxReset", dev).send_sync();  // to the device's own server
    std::lock_guard lock(primary_mu);
    primaries()[dev] = {};
    return rc;
}
VCUDA_API cuDevicePrimaryCtxReset(CUdevice dev) noexcept {
    VCUDA_TRACE_HOOK(cuDevicePrimaryCtxReset, dev);
    return cuDevicePrimaryCtxReset_v2(dev);
}

// cuCtxCreate, every signature version: the new context becomes current.
VCUDA_API cuCtxCreate_v2(CUcontext* pctx, unsigned int flags, CUdevice dev) noexcept {
    VCUDA_TRACE_HOOK(cuCtxCreate_v2, pctx, flags, dev);
    VCUDA_REQUIRE_INIT();
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
    uint64_t id = state::get().create_context(dev, flags);
    context_stack().push_back(id);
    *pctx = ctx_of(id);
    return CUDA_SUCCESS;
}
VCUDA_API cuCtxCreate(CUcontext* pctx, unsigned int flags, CUdevice dev) noexcept {
    VCUDA_TRACE_HOOK(cuCtxCreate, pctx, flags, dev);
    return cuCtxCreate_v2(pctx, flags, dev);
}
VCUDA_API cuCtxCreate_v3(CUcontext* pctx, CUexecAffinityParam* params, int n, unsigned int flags,
                         CUdevice dev) noexcept {
    VCUDA_TRACE_HOOK(cuCtxCreate_v3, pctx, params, n, flags, dev);
    if (n < 0 || (n > 0 && !params)) return CUDA_ERROR_INVALID_VALUE;
    return cuCtxCreate_v2(pctx, flags, dev);
}
VCUDA_API cuCtxCreate_v4(CUcontext* pctx, CUctxCreateParams* params, unsigned int flags,
                         CUdevice dev) noexcept {
    VCUDA_TRACE_HOOK(cuCtxCreate_v4, pctx, params, flags, dev);
    if (params && (params->numExecAffinityParams > 0 || params->cigParams))
        return static_cast<CUresult>(unsupported("cuCtxCreate_v4 (execution affinity / CIG parameters)"));
    return cuCtxCreate_v2(pctx, flags, dev);
}

VCUDA_API cuCtxDestroy_v2(CUcontext ctx) noexcept {
    VCUDA_TRACE_HOOK(cuCtxDestroy_v2, ctx);
    VCUDA_REQUIRE_INIT();
    uint64_t id = id_of(ctx);
    if (!context_exists(id)) return CUDA_ERROR_INVALID_CONTEXT;
    forget_peer_access(id);
    CUresult rc = state::get().destroy_context(id);
    if (rc != CUDA_SUCCESS) return rc;
    drop_cached_replies();
    auto& s = context_stack();
    std::erase(s, id);
    return CUDA_SUCCESS;
}
VCUDA_API cuCtxDestroy(CUcontext ctx) noexcept {
    VCUDA_TRACE_HOOK(cuCtxDestroy, ctx);
    return cuCtxDestroy_v2(ctx);
}

VCUDA_API cuCtxPushCurrent_v2(CUcontext ctx) noexcept {
    VCUDA_TRACE_HOOK(cuCtxPushCurrent_v2, ctx);
    VCUDA_REQUIRE_INIT();
    if (!ctx || !context_exists(id_of(ctx))) return CUDA_ERROR_INVALID_CONTEXT;
    context_stack().push_back(id_of(ctx));
    return CUDA_SUCCESS;
}
VCUDA_API cuCtxPushCurrent(CUcontext ctx) noexcept {
    VCUDA_TRACE_HOOK(cuCtxPushCurrent, ctx);
    return cuCtxPushCurrent_v2(ctx);
}

VCUDA_API cuCtxPopCurrent_v2(CUcontext* pctx) noexcept {
    VCUDA_TRACE_HOOK(cuCtxPopCurrent_v2, pctx);
    VCUDA_REQUIRE_INIT();
    auto& s = context_stack();
    if (s.empty()) return CUDA_ERROR_INVALID_CONTEXT;
    if (pctx) *pctx = ctx_of(s.back());
    s.pop_back();
    return CUDA_SUCCESS;
}
VCUDA_API cuCtxPopCurrent(CUcontext* pctx) noexcept {
    VCUDA_TRACE_HOOK(cuCtxPopCurrent, pctx);
    return cuCtxPopCurrent_v2(pctx);
}

VCUDA_API cuCtxSetCurrent(CUcontext ctx) noexcept {
    VCUDA_TRACE_HOOK(cuCtxSetCurrent, ctx);
    VCUDA_REQUIRE_INIT();
    auto& s = context_stack();
    if (!ctx) {
        if (!s.empty()) s.pop_back();
        return CUDA_SUCCESS;
    }
    if (!context_exists(id_of(ctx))) return CUDA_ERROR_INVALID_CONTEXT;
    if (s.empty())
        s.push_back(id_of(ctx));
    else
        s.back() = id_of(ctx);
    return CUDA_SUCCESS;
}

VCUDA_API cuCtxGetCurrent(CUcontext* pctx) noexcept {
    VCUDA_TRACE_HOOK(cuCtxGetCurrent, pctx);
    VCUDA_REQUIRE_INIT();
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    *pctx = ctx_of(current_context());
    return CUDA_SUCCESS;
}

VCUDA_API cuCtxGetDevice(CUdevice* device) noexcept {
    VCUDA_TRACE_HOOK(cuCtxGetDevice, device);
    VCUDA_REQUIRE_INIT();
    if (!device) return CUDA_ERROR_INVALID_VALUE;
    int d = current_device();
    if (d < 0) return CUDA_ERROR_INVALID_CONTEXT;
    *device = d;
    return CUDA_SUCCESS;
}

VCUDA_API cuCtxGetDevice_v2(CUdevice* device, CUcontext ctx) noexcept {
    VCUDA_TRACE_HOOK(cuCtxGetDevice_v2, device, ctx);
    VCUDA_REQUIRE_INIT();
    if (!device) return CUDA_ERROR_INVALID_VALUE;
    if (!ctx) return cuCtxGetDevice(device);
    auto& st = state::get();
    std::shared_lock lock(st.mu);
    auto* c = st.find_context(id_of(ctx));
    if (!c) return CUDA_ERROR_INVALID_CONTEXT;
    *device = c->device;
    return CUDA_SUCCESS;
}

VCUDA_API cuCtxGetFlags(unsigned int* flags) noexcept {
    VCUDA_TRACE_HOOK(cuCtxGetFlags, flags);
    VCUDA_REQUIRE_INIT();
    if (!flags) return CUDA_ERROR_INVALID_VALUE;
    auto& st = state::get();
    std::shared_lock lock(st.mu);
    auto* c = st.find_context(current_context());
    if (!c) return CUDA_ERROR_INVALID_CONTEXT;
    *flags = c->primary ? primaries()[c->device].flags : c->flags;
    return CUDA_SUCCESS;
}

VCUDA_API cuCtxSetFlags(unsigned int flags) noexcept {
    VCUDA_TRACE_HOOK(cuCtxSetFlags, flags);
    VCUDA_REQUIRE_INIT();
    auto& st = state::get();
    std::unique_lock lock(st.mu);
    auto* c = st.find_context(current_context());
    if (!c) return CUDA_ERROR_INVALID_CONTEXT;
    if (c->primary)
        primaries()[c->device].flags = flags;
    else
        c->flags = flags;
    return CUDA_SUCCESS;
}

VCUDA_API cuCtxGetId(CUcontext ctx, unsigned long long* id) noexcept {
    VCUDA_TRACE_HOOK(cuCtxGetId, ctx, id);
    VCUDA_REQUIRE_INIT();
    if (!id) return CUDA_ERROR_INVALID_VALUE;
    auto& st = state::get();
    std::shared_lock lock(st.mu);
    auto* c = st.find_context(ctx ? id_of(ctx) : current_context());
    if (!c) return CUDA_ERROR_INVALID_CONTEXT;
    *id = c->uid;
    return CUDA_SUCCESS;
}

VCUDA_API cuCtxGetApiVersion(CUcontext ctx, unsigned int* version) noexcept {
    VCUDA_TRACE_HOOK(cuCtxGetApiVersion, ctx, version);
    VCUDA_REQUIRE_INIT();
    if (!version) return CUDA_ERROR_INVALID_VALUE;
    uint64_t id = ctx ? id_of(ctx) : current_context();
    if (!context_exists(id)) return CUDA_ERROR_INVALID_CONTEXT;
    *version = 3020;  // what the real driver reports for contexts of the current API
    return CUDA_SUCCESS;
}

VCUDA_API cuCtxSynchronize() noexcept {
    VCUDA_TRACE_HOOK(cuCtxSynchronize);
    VCUDA_REQUIRE_INIT();
    int d = current_device();
    if (d < 0) return CUDA_ERROR_INVALID_CONTEXT;
    return server_sync(d);
}

VCUDA_API cuCtxSynchronize_v2(CUcontext ctx) noexcept {
    VCUDA_TRACE_HOOK(cuCtxSynchronize_v2, ctx);
    VCUDA_REQUIRE_INIT();
    if (!ctx) return cuCtxSynchronize();
    auto& st = state::get();
    int d;
    {
        std::shared_lock lock(st.mu);
        auto* c = st.find_context(id_of(ctx));
        if (!c) return CUDA_ERROR_INVALID_CONTEXT;
        d = c->device;
    }
    // Synchronize on the server with the context's device current for this call.
    auto& stack = context_stack();
    stack.push_back(id_of(ctx));
    CUresult rc = server_sync(d);
    stack.pop_back();
    return rc;
}
