// Green contexts (SM partitions): the device's SM resource, its split, a descriptor of the parts, and green
// contexts made from it. A green context is a session handle; its CUcontext (cuCtxFromGreenCtx) is kept with
// it (session::green_contexts), and a call whose client names it (Call.green_ctx) runs with that context
// current (server/server.cpp), so the streams, events and launches made under it are the partition's. A
// session holding one is not suspended or moved (server/session_image.cpp: not made again yet).
#include <cstring>

#include "server/call_context.hpp"
#include "server/dispatch.hpp"
#include "server/session.hpp"

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

// args {what: 0 a device (arg 1: the session's device index), 1 a green context (arg 1: its handle), 2 the
// session's context of a device (arg 1: its index); resource type} -> blob the CUdevResource.
CUresult handle_dev_resource(call_context& cx) {
    auto& d = cx.drv();
    if (!green_api(d)) return cx.unsupported("cuDeviceGetDevResource");
    if (!cx.expect_args(3)) return cx.bad_arguments();
    const auto type = static_cast<CUdevResourceType>(cx.arg(2));
    CUdevResource r{};
    CUresult rc = CUDA_SUCCESS;
    switch (cx.arg(0)) {
        case 0: {
            CUdevice dev = 0;
            if ((rc = cx.device(1, dev)) != CUDA_SUCCESS) return rc;
            rc = d.cuDeviceGetDevResource(dev, &r, type);
            break;
        }
        case 1: {
            CUgreenCtx g = nullptr;
            if ((rc = cx.handle(1, handle_kind::green_ctx, g)) != CUDA_SUCCESS) return rc;
            rc = d.cuGreenCtxGetDevResource(g, &r, type);
            break;
        }
        case 2: {
            if (cx.arg(1) >= 64 || !cx.sess.allowed(static_cast<size_t>(cx.arg(1))))
                return cx.fail(CUDA_ERROR_INVALID_CONTEXT, "no such device in this session");
            CUcontext ctx = cx.sess.context(static_cast<size_t>(cx.arg(1)), rc);
            if (!ctx) return rc;
            rc = d.cuCtxGetDevResource(ctx, &r, type);
            break;
        }
        default:
            return cx.bad_arguments();
    }
    if (rc != CUDA_SUCCESS) return rc;
    cx.out_blob(bytes_of(r));
    return CUDA_SUCCESS;
}

// args {groups asked for (0 with no result array: how many the split would make), useFlags, minCount, whether
// the caller wants the remaining part}; blob the input resource -> outs {groups}, blobs the groups' resources
// (each a CUdevResource) and the remaining one.
CUresult handle_sm_resource_split(call_context& cx) {
    auto& d = cx.drv();
    if (!green_api(d)) return cx.unsupported("cuDevSmResourceSplitByCount");
    if (!cx.expect_args(4) || cx.blob_count() != 1 || cx.blob(0).size() != sizeof(CUdevResource) ||
        cx.arg(0) > 1024)
        return cx.bad_arguments();
    CUdevResource input{};
    std::memcpy(&input, cx.blob(0).data(), sizeof input);
    auto groups = static_cast<unsigned>(cx.arg(0));
    std::vector<CUdevResource> result(groups);
    CUdevResource remaining{};
    if (CUresult rc = d.cuDevSmResourceSplitByCount(
            groups ? result.data() : nullptr, &groups, &input, cx.arg(3) ? &remaining : nullptr,
            static_cast<unsigned>(cx.arg(1)), static_cast<unsigned>(cx.arg(2)));
        rc != CUDA_SUCCESS)
        return rc;
    cx.out(static_cast<uint64_t>(groups));
    result.resize(std::min<size_t>(result.size(), groups));
    cx.out_blob({reinterpret_cast<const std::byte*>(result.data()), result.size() * sizeof(CUdevResource)});
    cx.out_blob(bytes_of(remaining));
    return CUDA_SUCCESS;
}

// blob the resources (CUdevResource each) -> a resource descriptor handle.
CUresult handle_resource_desc(call_context& cx) {
    auto& d = cx.drv();
    if (!green_api(d)) return cx.unsupported("cuDevResourceGenerateDesc");
    if (!cx.expect_args(0) || cx.blob_count() != 1) return cx.bad_arguments();
    const auto in = cx.blob(0);
    if (in.empty() || in.size() % sizeof(CUdevResource) != 0 || in.size() / sizeof(CUdevResource) > 1024)
        return cx.bad_arguments();
    std::vector<CUdevResource> resources(in.size() / sizeof(CUdevResource));
    std::memcpy(resources.data(), in.data(), in.size());
    CUdevResourceDesc desc = nullptr;
    if (CUresult rc =
            d.cuDevResourceGenerateDesc(&desc, resources.data(), static_cast<unsigned>(resources.size()));
        rc != CUDA_SUCCESS)
        return rc;
    cx.out_handle(handle_kind::resource_desc, desc);
    return CUDA_SUCCESS;
}

// args {descriptor, device (the session's index), flags} -> a green context handle.
CUresult handle_green_ctx_create(call_context& cx) {
    auto& d = cx.drv();
    if (!green_api(d)) return cx.unsupported("cuGreenCtxCreate");
    if (!cx.expect_args(3)) return cx.bad_arguments();
    CUdevResourceDesc desc = nullptr;
    if (CUresult rc = cx.handle(0, handle_kind::resource_desc, desc); rc != CUDA_SUCCESS) return rc;
    CUdevice dev = 0;
    if (CUresult rc = cx.device(1, dev); rc != CUDA_SUCCESS) return rc;
    CUgreenCtx g = nullptr;
    if (CUresult rc = d.cuGreenCtxCreate(&g, desc, dev, static_cast<unsigned>(cx.arg(2))); rc != CUDA_SUCCESS)
        return rc;
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
        e->device = static_cast<int>(cx.arg(1));
    return CUDA_SUCCESS;
}

// args {green context}.
CUresult handle_green_ctx_destroy(call_context& cx) {
    if (!cx.expect_args(1)) return cx.bad_arguments();
    CUgreenCtx g = nullptr;
    if (CUresult rc = cx.handle(0, handle_kind::green_ctx, g); rc != CUDA_SUCCESS) return rc;
    if (CUresult rc = cx.drv().cuGreenCtxDestroy(g); rc != CUDA_SUCCESS) return rc;
    {
        std::lock_guard lock(cx.sess.mu);
        cx.sess.green_contexts.erase(cx.arg(0));
    }
    cx.forget_handle(0);
    return CUDA_SUCCESS;
}

// args {green context, flags, priority} -> a stream of that context.
CUresult handle_green_stream_create(call_context& cx) {
    auto& d = cx.drv();
    if (!d.cuGreenCtxStreamCreate) return cx.unsupported("cuGreenCtxStreamCreate");
    if (!cx.expect_args(3)) return cx.bad_arguments();
    CUgreenCtx g = nullptr;
    if (CUresult rc = cx.handle(0, handle_kind::green_ctx, g); rc != CUDA_SUCCESS) return rc;
    CUstream s = nullptr;
    if (CUresult rc = d.cuGreenCtxStreamCreate(&s, g, static_cast<unsigned>(cx.arg(1)), cx.scalar<int>(2));
        rc != CUDA_SUCCESS)
        return rc;
    cx.out_handle(handle_kind::stream, s);
    return CUDA_SUCCESS;
}

}  // namespace vcuda::server
