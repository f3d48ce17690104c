// Peer devices of one session: whether one can reach the other, peer access between the session's contexts on
// them, and peer copies, which the driver makes between those contexts (protocol/spec/driver.spec, ops
// 404-405). runs on: the lane's thread.
#include "server/call_context.hpp"

namespace vcuda::server {

namespace {
enum peer_call : uint64_t { can_access = 0, enable = 1, disable = 2 };

// The session's context on device argument `i` (the session's index), created on first use.
CUresult context_arg(call_context& cx, size_t i, CUcontext& out) {
    uint64_t d = cx.arg(i);
    if (!cx.sess.allowed(d)) return cx.fail(CUDA_ERROR_INVALID_DEVICE, "no such device in this session");
    CUresult rc = CUDA_SUCCESS;
    out = cx.sess.context(d, rc);
    return out ? CUDA_SUCCESS : rc;
}
}  // namespace

// args {what (peer_call), device, peer device, flags} -> outs {can access} for can_access. Enable and disable
// act on the context of `device` (the lane's current one), towards that of `peer device`.
CUresult handle_peer(call_context& cx) {
    if (!cx.expect_args(4)) return cx.bad_arguments();
    auto& d = cx.drv();
    const uint64_t what = cx.arg(0);
    if (what == can_access) {
        if (!d.cuDeviceCanAccessPeer) return cx.unsupported("cuDeviceCanAccessPeer");
        CUdevice dev, peer;
        if (CUresult rc = cx.device(1, dev); rc != CUDA_SUCCESS) return rc;
        if (CUresult rc = cx.device(2, peer); rc != CUDA_SUCCESS) return rc;
        int can = 0;
        if (CUresult rc = d.cuDeviceCanAccessPeer(&can, dev, peer); rc != CUDA_SUCCESS) return rc;
        cx.out(static_cast<uint64_t>(can));
        return CUDA_SUCCESS;
    }
    if (what != enable && what != disable) return cx.bad_arguments();
    if (what == enable ? !d.cuCtxEnablePeerAccess : !d.cuCtxDisablePeerAccess)
        return cx.unsupported(what == enable ? "cuCtxEnablePeerAccess" : "cuCtxDisablePeerAccess");
    if (cx.device_index() < 0 || static_cast<uint64_t>(cx.device_index()) != cx.arg(1))
        return cx.fail(CUDA_ERROR_INVALID_CONTEXT,
                       "peer access is changed from the current context's device");
    CUcontext peer;
    if (CUresult rc = context_arg(cx, 2, peer); rc != CUDA_SUCCESS) return rc;
    return what == enable ? d.cuCtxEnablePeerAccess(peer, cx.scalar<unsigned>(3))
                          : d.cuCtxDisablePeerAccess(peer);
}

// args {dst, dst device, src, src device, bytes, stream}: the driver's peer copy between the session's
// contexts on the two devices, both ranges the session's. Queued (cuMemcpyPeerAsync on the stream) when the
// application's call was asynchronous, else cuMemcpyPeer.
CUresult handle_copy_peer(call_context& cx) {
    if (!cx.expect_args(6)) return cx.bad_arguments();
    auto& d = cx.drv();
    if (cx.queued() ? !d.cuMemcpyPeerAsync : !d.cuMemcpyPeer)
        return cx.unsupported(cx.queued() ? "cuMemcpyPeerAsync" : "cuMemcpyPeer");
    CUdeviceptr dst = cx.arg(0), src = cx.arg(2);
    uint64_t n = cx.arg(4);
    CUcontext dst_ctx, src_ctx;
    if (CUresult rc = context_arg(cx, 1, dst_ctx); rc != CUDA_SUCCESS) return rc;
    if (CUresult rc = context_arg(cx, 3, src_ctx); rc != CUDA_SUCCESS) return rc;
    if (n == 0) return CUDA_SUCCESS;
    if (CUresult rc = cx.device_range_now(dst, n); rc != CUDA_SUCCESS) return rc;
    if (CUresult rc = cx.device_range_now(src, n); rc != CUDA_SUCCESS) return rc;
    CUstream s;
    if (CUresult rc = cx.handle(5, handle_kind::stream, s); rc != CUDA_SUCCESS) return rc;
    return cx.queued() ? d.cuMemcpyPeerAsync(dst, dst_ctx, src, src_ctx, n, s)
                       : d.cuMemcpyPeer(dst, dst_ctx, src, src_ctx, n);
}

}  // namespace vcuda::server
