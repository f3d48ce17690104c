// Peer devices (server/handlers_peer.cpp). Devices served by one session (one server) are peers as the
// server's driver says: cuDeviceCanAccessPeer asks it, peer access is enabled between the server's contexts,
// and peer copies are the driver's own between them (3D peer copies are 3D copies under unified addressing).
// Devices of different sessions cannot reach each other: they are not peers, and a copy between them answers
// CUDA_ERROR_PEER_ACCESS_UNSUPPORTED (logged once).
//
// Contexts are the client's, over one server context per device: the mirror keeps which of the application's
// contexts enabled access to which, so that a second context of a device enabling the same peer succeeds as
// with the driver, and the server's access goes only when no context of the application still wants it.
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <utility>

#include "client/copy_paths.hpp"
#include "client/entry_point.hpp"
#include "client/managed.hpp"
#include "client/peer.hpp"
#include "client/plain_call.hpp"
#include "client/state.hpp"
#include "client/trace.hpp"
#include "client_ops.hpp"

using namespace vcuda;
using namespace vcuda::client;

namespace {

constexpr const char* across_servers = "a peer copy between devices of different vcuda servers";

// The client ordinal of context `ctx`'s device, or -1 when it is not a live context.
int context_device(uint64_t ctx) {
    auto& st = state::get();
    std::shared_lock lock(st.mu);
    const context_info* c = st.find_context(ctx);
    return c ? c->device : -1;
}

bool same_session(int a, int b) {
    auto& st = state::get();
    return st.device(a).owner == st.device(b).owner;
}

// The context a stream belongs to (the current one for NULL, legacy and per-thread streams); 0 if none.
uint64_t stream_context(CUstream s) {
    auto id = reinterpret_cast<uint64_t>(s);
    if (id == stream_null || id == stream_legacy || id == stream_per_thread) return current_context();
    handle_info info;
    return state::get().lookup(id, info) && info.kind == handle_kind::stream ? info.ctx : 0;
}

// Which of the application's contexts enabled access to which (context -> peer contexts).
std::mutex access_mu;
std::set<std::pair<uint64_t, uint64_t>>& enabled() {
    static auto* s = new std::set<std::pair<uint64_t, uint64_t>>();
    return *s;
}

// True while some pair of the application's contexts on these two devices has access enabled.
bool devices_still_enabled(int device, int peer) {
    for (const auto& [c, p] : enabled())
        if (context_device(c) == device && context_device(p) == peer) return true;
    return false;
}

// Peer access of the application's context on `device` towards its context on `peer`: on the server, between
// the session's contexts on them.
CUresult peer_access(bool enable, int device, int peer, unsigned flags) {
    return peer_access_call(enable ? "cuCtxEnablePeerAccess" : "cuCtxDisablePeerAccess", enable, device, peer,
                            flags)
        .send_sync();
}

// The devices of a peer copy's two contexts (dd, sd), and the context it runs in (`on`: `stream`'s when
// posted, else the source's): all of one session, or the copy is refused.
CUresult peer_copy_contexts(CUcontext dst_ctx, CUcontext src_ctx, CUstream stream, mode m, int& dd, int& sd,
                            uint64_t& on) {
    auto dctx = reinterpret_cast<uint64_t>(dst_ctx), sctx = reinterpret_cast<uint64_t>(src_ctx);
    dd = context_device(dctx);
    sd = context_device(sctx);
    if (dd < 0 || sd < 0) return CUDA_ERROR_INVALID_CONTEXT;
    if (m == mode::post && check_stream(stream) != CUDA_SUCCESS) return CUDA_ERROR_INVALID_HANDLE;
    on = m == mode::post ? stream_context(stream) : sctx;
    int od = context_device(on);
    if (od < 0) return CUDA_ERROR_INVALID_CONTEXT;
    if (!same_session(dd, sd) || !same_session(od, sd))
        return static_cast<CUresult>(refused(across_servers, CUDA_ERROR_PEER_ACCESS_UNSUPPORTED,
                                             "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED"));
    return CUDA_SUCCESS;
}

// The copy of `n` bytes between the two contexts' devices, on `stream`'s (m: post) or `src_ctx`'s (sync).
CUresult copy_peer(CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src, CUcontext src_ctx, size_t n,
                   CUstream stream, mode m) {
    VCUDA_REQUIRE_INIT();
    int dd = -1, sd = -1;
    uint64_t on = 0;
    if (CUresult rc = peer_copy_contexts(dst_ctx, src_ctx, stream, m, dd, sd, on); rc != CUDA_SUCCESS)
        return rc;
    if (n == 0) return CUDA_SUCCESS;
    device_allocation a;
    if (!state::get().find_allocation(dst, n, a) || !state::get().find_allocation(src, n, a))
        return CUDA_ERROR_INVALID_VALUE;
    if (CUresult rc = managed_before_device_access(src, n, false); rc != CUDA_SUCCESS) return rc;
    if (CUresult rc = managed_before_device_access(dst, n, true); rc != CUDA_SUCCESS) return rc;
    context_scope scope(on);
    copy_peer_call c(m == mode::post ? "cuMemcpyPeerAsync" : "cuMemcpyPeer", dst, dd, src, sd, n,
                     m == mode::post ? stream : nullptr);
    return m == mode::post ? c.send_async() : c.send_sync();
}

// A 3D peer copy: a 3D copy (unified addressing) in the source context, or on `stream`'s.
CUresult copy_3d_peer(const CUDA_MEMCPY3D_PEER* p, CUstream stream, mode m) {
    VCUDA_REQUIRE_INIT();
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    int dd = -1, sd = -1;
    uint64_t on = 0;
    if (CUresult rc = peer_copy_contexts(p->dstContext, p->srcContext, stream, m, dd, sd, on);
        rc != CUDA_SUCCESS)
        return rc;
    CUDA_MEMCPY3D c{};
    c.srcXInBytes = p->srcXInBytes;
    c.srcY = p->srcY;
    c.srcZ = p->srcZ;
    c.srcLOD = p->srcLOD;
    c.srcMemoryType = p->srcMemoryType;
    c.srcHost = p->srcHost;
    c.srcDevice = p->srcDevice;
    c.srcArray = p->srcArray;
    c.srcPitch = p->srcPitch;
    c.srcHeight = p->srcHeight;
    c.dstXInBytes = p->dstXInBytes;
    c.dstY = p->dstY;
    c.dstZ = p->dstZ;
    c.dstLOD = p->dstLOD;
    c.dstMemoryType = p->dstMemoryType;
    c.dstHost = p->dstHost;
    c.dstDevice = p->dstDevice;
    c.dstArray = p->dstArray;
    c.dstPitch = p->dstPitch;
    c.dstHeight = p->dstHeight;
    c.WidthInBytes = p->WidthInBytes;
    c.Height = p->Height;
    c.Depth = p->Depth;
    context_scope scope(on);
    return copy_3d(c, m == mode::post ? stream : nullptr, m);
}

}  // namespace

void vcuda::client::forget_peer_access(uint64_t ctx) {
    std::vector<std::pair<int, int>> gone;
    {
        std::lock_guard lock(access_mu);
        auto& e = enabled();
        for (auto it = e.begin(); it != e.end();) {
            if (it->first == ctx || it->second == ctx) {
                int d = context_device(it->first), p = context_device(it->second);
                it = e.erase(it);
                if (d >= 0 && p >= 0 && !devices_still_enabled(d, p)) gone.emplace_back(d, p);
            } else {
                ++it;
            }
        }
    }
    // The server's context of the device stays (other contexts of the application share it): its access
    // goes now that no context of the application wants it.
    for (auto [d, p] : gone) {
        uint64_t ctx_on_d = state::get().primary_context(d);
        context_scope scope(ctx_on_d);
        peer_access(false, d, p, 0);
    }
}

VCUDA_API cuDeviceCanAccessPeer(int* can, CUdevice dev, CUdevice peer) noexcept {
    VCUDA_TRACE_HOOK(cuDeviceCanAccessPeer, can, dev, peer);
    VCUDA_REQUIRE_INIT();
    if (!can) return CUDA_ERROR_INVALID_VALUE;
    auto& st = state::get();
    if (dev < 0 || dev >= st.device_count() || peer < 0 || peer >= st.device_count())
        return CUDA_ERROR_INVALID_DEVICE;
    *can = 0;
    if (dev == peer || !same_session(dev, peer)) return CUDA_SUCCESS;  // another server: no peer access
    context_scope scope(st.primary_context(dev));
    peer_can_access_call c("cuDeviceCanAccessPeer", dev, peer);
    if (CUresult rc = c.send_cached(); rc != CUDA_SUCCESS) return rc;
    *can = c.can();
    return CUDA_SUCCESS;
}

VCUDA_API cuCtxEnablePeerAccess(CUcontext peerContext, unsigned int Flags) noexcept {
    VCUDA_TRACE_HOOK(cuCtxEnablePeerAccess, peerContext, Flags);
    VCUDA_REQUIRE_INIT();
    uint64_t cur = current_context(), peer = reinterpret_cast<uint64_t>(peerContext);
    int d = context_device(cur), p = context_device(peer);
    if (d < 0 || p < 0) return CUDA_ERROR_INVALID_CONTEXT;
    if (!same_session(d, p))
        return static_cast<CUresult>(refused("peer access between devices of different vcuda servers",
                                             CUDA_ERROR_PEER_ACCESS_UNSUPPORTED,
                                             "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED"));
    std::lock_guard lock(access_mu);
    if (enabled().count({cur, peer})) return CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
    CUresult rc = peer_access(true, d, p, Flags);
    // Another context of the application on the same device enabled it on the server's context already.
    if (rc == CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED && devices_still_enabled(d, p)) rc = CUDA_SUCCESS;
    if (rc == CUDA_SUCCESS) enabled().insert({cur, peer});
    return rc;
}

VCUDA_API cuCtxDisablePeerAccess(CUcontext peerContext) noexcept {
    VCUDA_TRACE_HOOK(cuCtxDisablePeerAccess, peerContext);
    VCUDA_REQUIRE_INIT();
    uint64_t cur = current_context(), peer = reinterpret_cast<uint64_t>(peerContext);
    int d = context_device(cur), p = context_device(peer);
    if (d < 0 || p < 0) return CUDA_ERROR_INVALID_CONTEXT;
    std::lock_guard lock(access_mu);
    if (!enabled().erase({cur, peer})) return CUDA_ERROR_PEER_ACCESS_NOT_ENABLED;
    if (devices_still_enabled(d, p)) return CUDA_SUCCESS;
    CUresult rc = peer_access(false, d, p, 0);
    if (rc != CUDA_SUCCESS) enabled().insert({cur, peer});
    return rc;
}

VCUDA_API cuMemcpyPeer(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice,
                       CUcontext srcContext, size_t ByteCount) noexcept {
    VCUDA_TRACE_HOOK(cuMemcpyPeer, dstDevice, dstContext, srcDevice, srcContext, ByteCount);
    return copy_peer(dstDevice, dstContext, srcDevice, srcContext, ByteCount, nullptr, mode::sync);
}

VCUDA_API cuMemcpyPeerAsync(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice,
                            CUcontext srcContext, size_t ByteCount, CUstream hStream) noexcept {
    VCUDA_TRACE_HOOK(cuMemcpyPeerAsync, dstDevice, dstContext, srcDevice, srcContext, ByteCount, hStream);
    return copy_peer(dstDevice, dstContext, srcDevice, srcContext, ByteCount, hStream, mode::post);
}

VCUDA_API cuMemcpy3DPeer(const CUDA_MEMCPY3D_PEER* pCopy) noexcept {
    VCUDA_TRACE_HOOK(cuMemcpy3DPeer, pCopy);
    return copy_3d_peer(pCopy, nullptr, mode::sync);
}

VCUDA_API cuMemcpy3DPeerAsync(const CUDA_MEMCPY3D_PEER* pCopy, CUstream hStream) noexcept {
    VCUDA_TRACE_HOOK(cuMemcpy3DPeerAsync, pCopy, hStream);
    return copy_3d_peer(pCopy, hStream, mode::post);
}
