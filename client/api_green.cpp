// Green contexts (SM partitions): the resource queries, splits and descriptors travel as the driver's own
// structures (the server's driver made them; their internal bytes mean nothing here), green contexts are
// session handles, and the CUcontext of one (cuCtxFromGreenCtx) is a context of the mirror whose calls name
// it, so that the server runs them in it (server/handlers_green.cpp). Events on a green context and the green
// context of a stream are with those of contexts and streams (client/api_stream.cpp).
#include <cstring>
#include <span>
#include <vector>

#include "client/entry_point.hpp"
#include "client/plain_call.hpp"
#include "client/state.hpp"
#include "client/trace.hpp"
#include "client/unsupported.hpp"
#include "client_ops.hpp"

using namespace vcuda;
using namespace vcuda::client;

namespace {

std::span<const std::byte> bytes_of(const void* p, size_t n) { return {static_cast<const std::byte*>(p), n}; }

// A reply's blob into `out`, which must be exactly its size.
CUresult take_blob(std::span<const std::byte> blob, void* out, size_t n) {
    if (blob.size() != n) return CUDA_ERROR_UNKNOWN;
    if (n) std::memcpy(out, blob.data(), n);
    return CUDA_SUCCESS;
}

// Green contexts are served on the first server's GPUs only: their calls go to its session.
bool served_here(int ordinal) {
    auto& st = state::get();
    if (st.device(ordinal).owner == &st.remote()) return true;
    unsupported("green contexts on a GPU of a second vcuda server");
    return false;
}

// what: 0 a device, 1 a green context, 2 the session's context of a device (server/handlers_green.cpp).
CUresult get_resource(int ordinal, unsigned what, uint64_t which, CUdevResource* resource,
                      CUdevResourceType type) {
    if (!resource) return CUDA_ERROR_INVALID_VALUE;
    if (!served_here(ordinal)) return CUDA_ERROR_NOT_SUPPORTED;
    dev_resource_call c("cuDeviceGetDevResource", what, which, static_cast<unsigned>(type));
    if (CUresult rc = c.send_sync(); rc != CUDA_SUCCESS) return rc;
    return take_blob(c.resource(), resource, sizeof *resource);
}

// Enters what a call made (`id`, 0 when the reply had none) in the mirror as a handle of `device` made under
// mirror context `ctx`, rather than under the calling thread's current ones.
template <class H>
CUresult adopt_made(uint64_t id, handle_kind k, int device, uint64_t ctx, H* out) {
    if (!id) return CUDA_ERROR_UNKNOWN;
    handle_info info;
    info.kind = k;
    info.device = device;
    info.ctx = ctx;
    state::get().adopt(id, std::move(info));
    *out = reinterpret_cast<H>(id);
    return CUDA_SUCCESS;
}

bool green_info(CUgreenCtx g, handle_info& info) {
    return state::get().lookup(reinterpret_cast<uint64_t>(g), info) && info.kind == handle_kind::green_ctx;
}

}  // namespace

VCUDA_API cuDeviceGetDevResource(CUdevice device, CUdevResource* resource, CUdevResourceType type) noexcept {
    VCUDA_TRACE_HOOK(cuDeviceGetDevResource, device, resource, type);
    VCUDA_REQUIRE_INIT();
    if (device < 0 || device >= state::get().device_count()) return CUDA_ERROR_INVALID_DEVICE;
    return get_resource(device, 0, static_cast<uint64_t>(state::get().device(device).server_index), resource,
                        type);
}

VCUDA_API cuGreenCtxGetDevResource(CUgreenCtx hCtx, CUdevResource* resource,
                                   CUdevResourceType type) noexcept {
    VCUDA_TRACE_HOOK(cuGreenCtxGetDevResource, hCtx, resource, type);
    VCUDA_REQUIRE_INIT();
    handle_info info;
    if (!green_info(hCtx, info)) return CUDA_ERROR_INVALID_HANDLE;
    return get_resource(info.device, 1, reinterpret_cast<uint64_t>(hCtx), resource, type);
}

VCUDA_API cuCtxGetDevResource(CUcontext hCtx, CUdevResource* resource, CUdevResourceType type) noexcept {
    VCUDA_TRACE_HOOK(cuCtxGetDevResource, hCtx, resource, type);
    VCUDA_REQUIRE_INIT();
    auto& st = state::get();
    const uint64_t id = hCtx ? reinterpret_cast<uint64_t>(hCtx) : current_context();
    int device = 0;
    uint64_t green = 0;
    {
        std::shared_lock lock(st.mu);
        const context_info* c = st.find_context(id);
        if (!c) return CUDA_ERROR_INVALID_CONTEXT;
        device = c->device;
        green = c->green;
    }
    if (green) return get_resource(device, 1, green, resource, type);
    return get_resource(device, 2, static_cast<uint64_t>(st.device(device).server_index), resource, type);
}

VCUDA_API cuDevSmResourceSplitByCount(CUdevResource* result, unsigned int* nbGroups,
                                      const CUdevResource* input, CUdevResource* remaining,
                                      unsigned int useFlags, unsigned int minCount) noexcept {
    VCUDA_TRACE_HOOK(cuDevSmResourceSplitByCount, result, nbGroups, input, remaining, useFlags, minCount);
    VCUDA_REQUIRE_INIT();
    if (!nbGroups || !input) return CUDA_ERROR_INVALID_VALUE;
    const unsigned asked = result ? *nbGroups : 0;
    sm_resource_split_call c("cuDevSmResourceSplitByCount", asked, useFlags, minCount, remaining != nullptr,
                             bytes_of(input, sizeof *input));
    if (CUresult rc = c.send_sync(); rc != CUDA_SUCCESS) return rc;
    const auto results = c.results();
    if (results.size() % sizeof(CUdevResource) != 0 || results.size() / sizeof(CUdevResource) > asked)
        return CUDA_ERROR_UNKNOWN;
    *nbGroups = c.made();
    if (result && !results.empty()) std::memcpy(result, results.data(), results.size());
    if (remaining) return take_blob(c.rest(), remaining, sizeof *remaining);
    return CUDA_SUCCESS;
}

VCUDA_API cuDevResourceGenerateDesc(CUdevResourceDesc* phDesc, CUdevResource* resources,
                                    unsigned int nbResources) noexcept {
    VCUDA_TRACE_HOOK(cuDevResourceGenerateDesc, phDesc, resources, nbResources);
    VCUDA_REQUIRE_INIT();
    if (!phDesc || !resources || nbResources == 0) return CUDA_ERROR_INVALID_VALUE;
    resource_desc_call c("cuDevResourceGenerateDesc",
                         bytes_of(resources, size_t{nbResources} * sizeof(CUdevResource)));
    if (CUresult rc = c.send_sync(); rc != CUDA_SUCCESS) return rc;
    *phDesc = c.desc();
    return CUDA_SUCCESS;
}

VCUDA_API cuGreenCtxCreate(CUgreenCtx* phCtx, CUdevResourceDesc desc, CUdevice dev,
                           unsigned int flags) noexcept {
    VCUDA_TRACE_HOOK(cuGreenCtxCreate, phCtx, desc, dev, flags);
    VCUDA_REQUIRE_INIT();
    if (!phCtx) return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= state::get().device_count()) return CUDA_ERROR_INVALID_DEVICE;
    if (!served_here(dev)) return CUDA_ERROR_NOT_SUPPORTED;
    green_ctx_create_call c("cuGreenCtxCreate", desc, dev, flags);
    if (CUresult rc = c.send_sync(); rc != CUDA_SUCCESS) return rc;
    return adopt_made(c.green_id(), handle_kind::green_ctx, dev, current_context(), phCtx);
}

VCUDA_API cuCtxFromGreenCtx(CUcontext* pContext, CUgreenCtx hCtx) noexcept {
    VCUDA_TRACE_HOOK(cuCtxFromGreenCtx, pContext, hCtx);
    VCUDA_REQUIRE_INIT();
    if (!pContext) return CUDA_ERROR_INVALID_VALUE;
    handle_info info;
    if (!green_info(hCtx, info)) return CUDA_ERROR_INVALID_CONTEXT;
    *pContext = reinterpret_cast<CUcontext>(
        state::get().green_context(reinterpret_cast<uint64_t>(hCtx), info.device));
    return CUDA_SUCCESS;
}

VCUDA_API cuGreenCtxDestroy(CUgreenCtx hCtx) noexcept {
    VCUDA_TRACE_HOOK(cuGreenCtxDestroy, hCtx);
    VCUDA_REQUIRE_INIT();
    handle_info info;
    if (!green_info(hCtx, info)) return CUDA_ERROR_INVALID_CONTEXT;
    green_ctx_destroy_call c("cuGreenCtxDestroy", hCtx);
    if (CUresult rc = c.send_sync(); rc != CUDA_SUCCESS) return rc;
    state::get().forget_green_context(reinterpret_cast<uint64_t>(hCtx));
    c.forget_destroyed();
    return CUDA_SUCCESS;
}

// The id of the mirror context that stands for it: unique in the process, as the driver's.
VCUDA_API cuGreenCtxGetId(CUgreenCtx greenCtx, unsigned long long* greenCtxId) noexcept {
    VCUDA_TRACE_HOOK(cuGreenCtxGetId, greenCtx, greenCtxId);
    VCUDA_REQUIRE_INIT();
    if (!greenCtxId) return CUDA_ERROR_INVALID_VALUE;
    handle_info info;
    if (!green_info(greenCtx, info)) return CUDA_ERROR_INVALID_HANDLE;
    auto& st = state::get();
    const uint64_t ctx = st.green_context(reinterpret_cast<uint64_t>(greenCtx), info.device);
    std::shared_lock lock(st.mu);
    const context_info* c = st.find_context(ctx);
    if (!c) return CUDA_ERROR_INVALID_HANDLE;
    *greenCtxId = c->uid;
    return CUDA_SUCCESS;
}

VCUDA_API cuGreenCtxStreamCreate(CUstream* phStream, CUgreenCtx greenCtx, unsigned int flags,
                                 int priority) noexcept {
    VCUDA_TRACE_HOOK(cuGreenCtxStreamCreate, phStream, greenCtx, flags, priority);
    VCUDA_REQUIRE_INIT();
    if (!phStream) return CUDA_ERROR_INVALID_VALUE;
    handle_info info;
    if (!green_info(greenCtx, info)) return CUDA_ERROR_INVALID_CONTEXT;
    green_stream_create_call c("cuGreenCtxStreamCreate", greenCtx, flags, priority);
    if (CUresult rc = c.send_sync(); rc != CUDA_SUCCESS) return rc;
    return adopt_made(c.stream_id(), handle_kind::stream, info.device,
                      state::get().green_context(reinterpret_cast<uint64_t>(greenCtx), info.device),
                      phStream);
}
