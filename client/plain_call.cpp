#include "client/plain_call.hpp"

#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

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
    if (has_blob_) rq.blobs = {&blob_, 1};
    return rq;
}

CUresult plain_call::send_sync() {
    VCUDA_REQUIRE_INIT();
    if (error_ != CUDA_SUCCESS) return error_;
    lane* l = state::get().remote().this_thread_lane();
    if (!l) return static_cast<CUresult>(connection_lost_result);
    return static_cast<CUresult>(l->call(request(), reply_));
}

namespace {

// Answers of `cached` queries, keyed by op, device and arguments. A generation stamp drops them all at once.
struct reply_cache {
    std::mutex mu;
    std::unordered_map<std::string, std::vector<uint64_t>> answers;
};
reply_cache& cache() {
    static auto* c = new reply_cache();  // never destroyed: atexit handlers of the application may still query
    return *c;
}

}  // namespace

void drop_cached_replies() {
    auto& c = cache();
    std::lock_guard lock(c.mu);
    c.answers.clear();
}

CUresult plain_call::send_cached() {
    VCUDA_REQUIRE_INIT();
    if (error_ != CUDA_SUCCESS) return error_;
    std::string key(sizeof(uint32_t) + sizeof(int) + n_ * sizeof(uint64_t), '\0');
    auto o = static_cast<uint32_t>(op_);
    int device = current_device();
    std::memcpy(key.data(), &o, sizeof o);
    std::memcpy(key.data() + sizeof o, &device, sizeof device);
    std::memcpy(key.data() + sizeof o + sizeof device, args_.data(), n_ * sizeof(uint64_t));
    key.append(reinterpret_cast<const char*>(blob_.data()), blob_.size());
    auto& c = cache();
    {
        std::lock_guard lock(c.mu);
        if (auto it = c.answers.find(key); it != c.answers.end()) {
            reply_.result = CUDA_SUCCESS;
            reply_.outs = it->second;
            return CUDA_SUCCESS;
        }
    }
    CUresult rc = send_sync();
    if (rc == CUDA_SUCCESS) {
        std::lock_guard lock(c.mu);
        c.answers.emplace(std::move(key), reply_.outs);
    }
    return rc;
}

CUresult plain_call::send_uncaching() {
    drop_cached_replies();
    return send_sync();
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
