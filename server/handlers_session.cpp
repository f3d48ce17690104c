// Hand-written ops: the session's view of the GPUs, context synchronize and reset.
#include "server/call_context.hpp"
#include "server_ops.hpp"

namespace vcuda::server {

// The GPUs this session may use: outs = {n, (device index, memory) per GPU}; blobs = {name, uuid, attributes}
// per GPU. The memory is the session's quota there. The client names each by its device index in later calls
// (the server's GPU index, unless the session moved here from a GPU of another index: session::gpu_of).
CUresult handle_session_info(call_context& cx) {
    if (!cx.expect_args(0)) return cx.bad_arguments();
    auto& gpus = cx.sess.drv().gpus();
    std::vector<size_t> mine;
    for (size_t i = 0; i < cx.sess.device_count(); ++i)
        if (cx.sess.allowed(i)) mine.push_back(i);
    cx.out(static_cast<uint64_t>(mine.size()));
    for (size_t i : mine) {
        cx.out(static_cast<uint64_t>(i));
        cx.out(cx.sess.quota(i));
    }
    for (size_t i : mine) {
        auto& g = gpus[cx.sess.gpu_of(i)];
        cx.out_blob({reinterpret_cast<const std::byte*>(g.name.data()), g.name.size()});
        cx.out_blob({reinterpret_cast<const std::byte*>(g.uuid.bytes), 16});
        cx.out_blob(
            {reinterpret_cast<const std::byte*>(g.attributes.data()), g.attributes.size() * sizeof(int)});
    }
    return CUDA_SUCCESS;
}

// Runs nothing: a client's lane that posted calls and is about to close asks it, so that its reply (or, for a
// session that moved, the answer saying where) covers every call it posted.
CUresult handle_lane_sync(call_context&, const lane_sync_args&) { return CUDA_SUCCESS; }

CUresult handle_ctx_synchronize(call_context& cx, const ctx_synchronize_args&) {
    return cx.drv().cuCtxSynchronize();
}

CUresult handle_ctx_reset(call_context& cx, const ctx_reset_args& a) {
    cx.sess.release_device(a.dev_index);
    cx.lane.current_device = -2;  // the context this lane had current is gone
    return CUDA_SUCCESS;
}

}  // namespace vcuda::server
