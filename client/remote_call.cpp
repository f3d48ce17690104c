#include "client/remote_call.hpp"

namespace vcuda::client {

int current_server_device() {
    int d = current_device();
    return d < 0 ? -1 : state::get().device(d).server_index;
}

CUresult remote(op o, std::initializer_list<uint64_t> args, mode m, call_reply* reply, std::span<const std::byte> payload,
                std::initializer_list<std::span<const std::byte>> blobs) {
    VCUDA_REQUIRE_INIT();
    lane* l = state::get().remote().this_thread_lane();
    if (!l) return static_cast<CUresult>(connection_lost_result);
    call_request rq;
    rq.operation = o;
    rq.device = current_server_device();
    rq.args = {args.begin(), args.size()};
    rq.blobs = {blobs.begin(), blobs.size()};
    rq.payload = payload;
    if (m == mode::post) return static_cast<CUresult>(l->post(rq));
    call_reply local;
    return static_cast<CUresult>(l->call(rq, reply ? *reply : local));
}

}  // namespace vcuda::client
