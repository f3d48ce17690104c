// Green contexts (SM partitions): the device's SM resource, its split, a descriptor of the parts, and green
// contexts made from it. A green context is a session handle; its CUcontext (cuCtxFromGreenCtx) is kept with
// it (session::green_contexts), and a call whose client names it (Call.green_ctx) runs with that context
// current (server/server.cpp), so the streams, events and launches made under it are the partition's. A
// session holding one is not suspended or moved (server/session_image.cpp: not made again yet).
#include <cstring>

#include "server/call_context.hpp"
#include "server/dispatch.hpp"
#include "server/session.hpp"
#include "server_ops.hpp"

namespace vcuda::server {

namespace {

bool green_api(const driver_table& d) {
    return d.cuDeviceGetDevResource && d.cuDevSmResourceSplitByCount && d.cuDevResourceGenerateDesc &&
           d.cuGreenCtxCreate && d.cuGreenCtxDestroy && d.cuCtxFromGreenCtx && d.cuGreenCtxGetDevResource &&
           d.cuCtxGetDevResource;
}

std::span<const std::byte> bytes_of(const CUdevResource& r) {
    return {reinterpret_cast<const std::byte*>(&r), sizeof r};
}

}  // namespace

CUresult handle_dev_resource(call_context& cx, const dev_resource_args& a) {
    auto& d = cx.drv();
    if (!green_api(d)) return cx.unsupported("cuDeviceGetDevResource");
    const auto type = static_cast<CUdevResourceType>(a.type);
    CUdevResource r{};
    CUresult rc = CUDA_SUCCESS;
    switch (a.what) {
        case 0: {
            CUdevice dev = 0;
            if (cx.sess.real_device(a.which, dev) != CUDA_SUCCESS)
                return cx.fail(CUDA_ERROR_INVALID_DEVICE, "no such device in this session");
            rc = d.cuDeviceGetDevResource(dev, &r, type);
            break;
        }
        case 1: {
            void* g = nullptr;
            if ((rc = cx.lookup(a.which, handle_kind::green_ctx, g)) != CUDA_SUCCESS) return rc;
            rc = d.cuGreenCtxGetDevResource(static_cast<CUgreenCtx>(g), &r, type);
            break;
        }
        case 2: {
            if (a.which >= 64 || !cx.sess.allowed(static_cast<size_t>(a.which)))
                return cx.fail(CUDA_ERROR_INVALID_CONTEXT, "no such device in this session");
            CUcontext ctx = cx.sess.context(static_cast<size_t>(a.which), rc);
            if (!ctx) return rc;
            rc = d.cuCtxGetDevResource(ctx, &r, type);
            break;
        }
        default:
            return cx.fail(CUDA_ERROR_INVALID_VALUE, "dev_resource: what is not 0, 1 or 2");
    }
    if (rc != CUDA_SUCCESS) return rc;
    cx.out_blob(bytes_of(r));
    return CUDA_SUCCESS;
}

CUresult handle_sm_resource_split(call_context& cx, const sm_resource_split_args& a) {
    auto& d = cx.drv();
    if (!green_api(d)) return cx.unsupported("cuDevSmResourceSplitByCount");
    if (a.input.size() != sizeof(CUdevResource) || a.groups > 1024) return cx.bad_arguments();
    CUdevResource input{};
    std::memcpy(&input, a.input.data(), sizeof input);
    unsigned groups = a.groups;
    std::vector<CUdevResource> result(groups);
    CUdevResource remaining{};
    if (CUresult rc = d.cuDevSmResourceSplitByCount(groups ? result.data() : nullptr, &groups, &input,
                                                    a.remaining ? &remaining : nullptr, a.flags, a.min_count);
        rc != CUDA_SUCCESS)
        return rc;
    cx.out(groups);
    result.resize(std::min<size_t>(result.size(), groups));
    cx.out_blob({reinterpret_cast<const std::byte*>(result.data()), result.size() * sizeof(CUdevResource)});
    cx.out_blob(bytes_of(remaining));
    return CUDA_SUCCESS;
}

CUresult handle_resource_desc(call_context& cx, const resource_desc_args& a) {
    auto& d = cx.drv();
    if (!green_api(d)) return cx.unsupported("cuDevResourceGenerateDesc");
    if (a.resources.empty() || a.resources.size() % sizeof(CUdevResource) != 0 ||
        a.resources.size() / sizeof(CUdevResource) > 1024)
        return cx.bad_arguments();
    std::vector<CUdevResource> resources(a.resources.size() / sizeof(CUdevResource));
    std::memcpy(resources.data(), a.resources.data(), a.resources.size());
    CUdevResourceDesc desc = nullptr;
    if (CUresult rc =
            d.cuDevResourceGenerateDesc(&desc, resources.data(), static_cast<unsigned>(resources.size()));
        rc != CUDA_SUCCESS)
        return rc;
    cx.out_handle(handle_kind::resource_desc, desc);
    return CUDA_SUCCESS;
}

CUresult handle_green_ctx_create(call_context& cx, const green_ctx_create_args& a) {
    auto& d = cx.drv();
    if (!green_api(d)) return cx.unsupported("cuGreenCtxCreate");
    CUgreenCtx g = nullptr;
    if (CUresult rc = d.cuGreenCtxCreate(&g, a.desc, a.dev, a.flags); rc != CUDA_SUCCESS) return rc;
    CUcontext ctx = nullptr;
    if (CUresult rc = d.cuCtxFromGreenCtx(&ctx, g); rc != CUDA_SUCCESS) {
        d.cuGreenCtxDestroy(g);
        return rc;
    }
    cx.out_handle(handle_kind::green_ctx, g);
    std::lock_guard lock(cx.sess.mu);
    const uint64_t id = cx.outs.back();
    cx.sess.green_contexts[id] = ctx;
    // It belongs to the device it was made on, which need not be the caller's current one.
    if (handle_entry* e = cx.sess.handles.find(id, handle_kind::green_ctx))
        e->device = static_cast<int>(a.dev_index);
    return CUDA_SUCCESS;
}

CUresult handle_green_ctx_destroy(call_context& cx, const green_ctx_destroy_args& a) {
    if (CUresult rc = cx.drv().cuGreenCtxDestroy(a.green); rc != CUDA_SUCCESS) return rc;
    std::lock_guard lock(cx.sess.mu);
    cx.sess.green_contexts.erase(a.green_id);
    return CUDA_SUCCESS;
}

CUresult handle_green_stream_create(call_context& cx, const green_stream_create_args& a) {
    auto& d = cx.drv();
    if (!d.cuGreenCtxStreamCreate) return cx.unsupported("cuGreenCtxStreamCreate");
    CUstream s = nullptr;
    if (CUresult rc = d.cuGreenCtxStreamCreate(&s, a.green, a.flags, a.priority); rc != CUDA_SUCCESS)
        return rc;
    cx.out_handle(handle_kind::stream, s);
    return CUDA_SUCCESS;
}

}  // namespace vcuda::server
