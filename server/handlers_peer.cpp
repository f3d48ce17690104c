// Peer devices of one session: whether one can reach the other, peer access between the session's contexts on
// them, and peer copies, which the driver makes between those contexts (protocol/spec/driver.spec, ops
// peer_access, peer_can_access and copy_peer). runs on: the lane's thread.
#include "server/call_context.hpp"
#include "server_ops.hpp"

namespace vcuda::server {

namespace {
// The session's context on its device `index`, created on first use.
CUresult session_context(call_context& cx, size_t index, CUcontext& out) {
    CUresult rc = CUDA_SUCCESS;
    out = cx.sess.context(index, rc);
    return out ? CUDA_SUCCESS : rc;
}
}  // namespace

CUresult handle_peer_can_access(call_context& cx, const peer_can_access_args& a) {
    auto& d = cx.drv();
    if (!d.cuDeviceCanAccessPeer) return cx.unsupported("cuDeviceCanAccessPeer");
    int can = 0;
    if (CUresult rc = d.cuDeviceCanAccessPeer(&can, a.dev, a.peer); rc != CUDA_SUCCESS) return rc;
    cx.out(uint64_t{can != 0});
    return CUDA_SUCCESS;
}

// Acts on the context of `dev` (the lane's current one), towards that of `peer`.
CUresult handle_peer_access(call_context& cx, const peer_access_args& a) {
    auto& d = cx.drv();
    if (a.enable ? !d.cuCtxEnablePeerAccess : !d.cuCtxDisablePeerAccess)
        return cx.unsupported(a.enable ? "cuCtxEnablePeerAccess" : "cuCtxDisablePeerAccess");
    if (cx.device_index() < 0 || static_cast<size_t>(cx.device_index()) != a.dev_index)
        return cx.fail(CUDA_ERROR_INVALID_CONTEXT,
                       "peer access is changed from the current context's device");
    CUcontext peer;
    if (CUresult rc = session_context(cx, a.peer_index, peer); rc != CUDA_SUCCESS) return rc;
    return a.enable ? d.cuCtxEnablePeerAccess(peer, a.flags) : d.cuCtxDisablePeerAccess(peer);
}

// The driver's peer copy between the session's contexts on the two devices, both ranges the session's.
// Queued (cuMemcpyPeerAsync on the stream) when the application's call was asynchronous, else cuMemcpyPeer.
CUresult handle_copy_peer(call_context& cx, const copy_peer_args& a) {
    auto& d = cx.drv();
    if (cx.queued() ? !d.cuMemcpyPeerAsync : !d.cuMemcpyPeer)
        return cx.unsupported(cx.queued() ? "cuMemcpyPeerAsync" : "cuMemcpyPeer");
    CUdeviceptr dst = a.dst, src = a.src;
    const uint64_t n = a.bytes;
    CUcontext dst_ctx, src_ctx;
    if (CUresult rc = session_context(cx, a.dst_dev_index, dst_ctx); rc != CUDA_SUCCESS) return rc;
    if (CUresult rc = session_context(cx, a.src_dev_index, src_ctx); rc != CUDA_SUCCESS) return rc;
    if (n == 0) return CUDA_SUCCESS;
    if (CUresult rc = cx.device_range_now(dst, n); rc != CUDA_SUCCESS) return rc;
    if (CUresult rc = cx.device_range_now(src, n); rc != CUDA_SUCCESS) return rc;
    return cx.queued() ? d.cuMemcpyPeerAsync(dst, dst_ctx, src, src_ctx, n, a.stream)
                       : d.cuMemcpyPeer(dst, dst_ctx, src, src_ctx, n);
}

}  // namespace vcuda::server
