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
// Beside them, the setters in effect: by target (op, device, arguments but the value) the last successful call.
struct reply_cache {
    std::mutex mu;
    std::unordered_map<std::string, std::vector<uint64_t>> answers;
    std::unordered_map<std::string, std::string> setters;
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
    c.setters.clear();
}

std::string plain_call::cache_key() const {
    std::string key(sizeof(uint32_t) + sizeof(int) + n_ * sizeof(uint64_t), '\0');
    auto o = static_cast<uint32_t>(op_);
    int device = current_device();
    std::memcpy(key.data(), &o, sizeof o);
    std::memcpy(key.data() + sizeof o, &device, sizeof device);
    std::memcpy(key.data() + sizeof o + sizeof device, args_.data(), n_ * sizeof(uint64_t));
    key.append(reinterpret_cast<const char*>(blob_.data()), blob_.size());
    return key;
}

CUresult plain_call::send_cached() {
    VCUDA_REQUIRE_INIT();
    if (error_ != CUDA_SUCCESS) return error_;
    std::string key = cache_key();
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

bool plain_call::known_to_succeed() const {
    auto& c = cache();
    std::string key = cache_key();
    std::lock_guard lock(c.mu);
    return c.answers.count(key) != 0;
}

void plain_call::note_success() const {
    auto& c = cache();
    std::string key = cache_key();
    std::lock_guard lock(c.mu);
    c.answers.emplace(std::move(key), std::vector<uint64_t>{});
}

// A setter repeated with the value already in effect changes nothing: it is answered here and the cached answers
// stand (PyTorch sets the same kernel attributes every step). Any other setter drops the cached answers and what
// is known of setters of other ops (a function's attribute can be set through its kernel too); setters of the same
// op on other targets stay known.
CUresult plain_call::send_uncaching(size_t value_index) {
    VCUDA_REQUIRE_INIT();
    if (error_ != CUDA_SUCCESS) return error_;
    std::string full = cache_key();
    std::string target = full;
    if (value_index < n_) std::memset(target.data() + sizeof(uint32_t) + sizeof(int) + value_index * sizeof(uint64_t), 0, sizeof(uint64_t));
    auto& c = cache();
    {
        std::lock_guard lock(c.mu);
        if (auto it = c.setters.find(target); it != c.setters.end() && it->second == full) {
            reply_.result = CUDA_SUCCESS;
            reply_.outs.clear();
            return CUDA_SUCCESS;
        }
        c.answers.clear();
        std::erase_if(c.setters, [&](const auto& kv) { return kv.first.compare(0, sizeof(uint32_t), target, 0, sizeof(uint32_t)) != 0; });
        c.setters.erase(target);
    }
    CUresult rc = send_sync();
    if (rc == CUDA_SUCCESS) {
        std::lock_guard lock(c.mu);
        c.setters[std::move(target)] = std::move(full);
    }
    return rc;
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
