#include "client/remote_call.hpp"

#include "client/unsupported.hpp"

namespace vcuda::client {

int current_server_device() {
    int d = current_device();
    return d < 0 ? -1 : state::get().device(d).server_index;
}

CUresult remote(op o, std::initializer_list<uint64_t> args, mode m, call_reply* reply,
                std::span<const std::byte> payload, std::initializer_list<std::span<const std::byte>> blobs,
                int pass_fd) {
    VCUDA_REQUIRE_INIT();
    lane* l = state::get().remote().this_thread_lane();
    if (!l) return static_cast<CUresult>(connection_lost_result);
    call_request rq;
    rq.operation = o;
    rq.device = current_server_device();
    rq.args = {args.begin(), args.size()};
    rq.blobs = {blobs.begin(), blobs.size()};
    rq.payload = payload;
    rq.pass_fd = pass_fd;
    if (m == mode::post) return static_cast<CUresult>(l->post(rq));
    call_reply local;
    return static_cast<CUresult>(l->call(rq, reply ? *reply : local));
}

bool host_location(const CUmemLocation& loc) {
    return loc.type == CU_MEM_LOCATION_TYPE_HOST || loc.type == CU_MEM_LOCATION_TYPE_HOST_NUMA ||
           loc.type == CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT;
}

CUresult server_location(CUmemLocation& loc, bool host_ok) {
    if (host_ok && host_location(loc)) return CUDA_SUCCESS;
    if (loc.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return static_cast<CUresult>(unsupported("memory at a location other than a device"));
    auto& st = state::get();
    if (loc.id < 0 || loc.id >= st.device_count()) return CUDA_ERROR_INVALID_DEVICE;
    auto& dev = st.device(loc.id);
    if (dev.owner != &st.remote())
        return static_cast<CUresult>(
            unsupported("memory on a device of another server than the current one"));
    loc.id = dev.server_index;
    return CUDA_SUCCESS;
}

}  // namespace vcuda::client
