#include "client/plain_call.hpp"

namespace vcuda::client {

bool valid_handle(uint64_t h, handle_kind k) {
    if (k == handle_kind::stream && (h == stream_null || h == stream_legacy || h == stream_per_thread)) return true;
    handle_info info;
    if (!state::get().lookup(h, info)) return false;
    if (info.kind == k) return true;
    return k == handle_kind::function && info.kind == handle_kind::kernel;
}

call_request plain_call::request() {
    call_request rq;
    rq.operation = op_;
    int d = current_device();
    rq.device = d < 0 ? -1 : state::get().device(d).server_index;
    rq.args = {args_.data(), n_};
    return rq;
}

CUresult plain_call::send_sync() {
    VCUDA_REQUIRE_INIT();
    if (error_ != CUDA_SUCCESS) return error_;
    lane* l = state::get().remote().this_thread_lane();
    if (!l) return static_cast<CUresult>(connection_lost_result);
    return static_cast<CUresult>(l->call(request(), reply_));
}

CUresult plain_call::send_async() {
    VCUDA_REQUIRE_INIT();
    if (error_ != CUDA_SUCCESS) return error_;
    lane* l = state::get().remote().this_thread_lane();
    if (!l) return static_cast<CUresult>(connection_lost_result);
    return static_cast<CUresult>(l->post(request()));
}

void plain_call::adopt_handle(uint64_t id, handle_kind k) {
    handle_info info;
    info.kind = k;
    info.ctx = current_context();
    info.device = current_device();
    state::get().adopt(id, std::move(info));
}

}  // namespace vcuda::client
