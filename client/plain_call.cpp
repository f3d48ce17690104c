#include "client/plain_call.hpp"

#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace vcuda::client {

bool valid_handle(uint64_t h, handle_kind k) {
    if (k == handle_kind::stream && (h == stream_null || h == stream_legacy || h == stream_per_thread))
        return true;
    handle_kind kind;
    if (!state::get().lookup_kind(h, kind)) return false;
    if (kind == k) return true;
    return k == handle_kind::function && kind == handle_kind::kernel;
}

namespace {
std::mutex shared_mu;
std::atomic<bool> any_shared{false};  // the common case, without the lock: nothing shared
std::unordered_set<uint64_t>& shared_handles() {
    static auto* s = new std::unordered_set<uint64_t>();
    return *s;
}
}  // namespace

bool ipc_shared(uint64_t handle) {
    if (!any_shared.load(std::memory_order_acquire)) return false;
    std::lock_guard lock(shared_mu);
    return shared_handles().count(handle) != 0;
}

void mark_ipc_shared(uint64_t handle) {
    std::lock_guard lock(shared_mu);
    shared_handles().insert(handle);
    any_shared.store(true, std::memory_order_release);
}

namespace {
CUresult refuse_two_sessions() {
    return static_cast<CUresult>(refused("a call naming devices of two vcuda servers (two sessions)",
                                         CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE"));
}
}  // namespace

void plain_call::device(CUdevice d) {
    auto& st = state::get();
    if (d < 0 || d >= st.device_count()) {
        if (error_ == CUDA_SUCCESS) error_ = CUDA_ERROR_INVALID_DEVICE;
        arg(d);
        return;
    }
    session* owner = st.device(d).owner;
    if (!named_) {
        named_ = owner;
        if (owner != &st.remote()) routed_ordinal_ = d;
    } else if (owner != named_) {
        two_sessions_ = true;
    }
    arg(static_cast<CUdevice>(st.device(d).server_index));
}

int plain_call::call_device() const { return routed_ordinal_ >= 0 ? routed_ordinal_ : current_device(); }

session& plain_call::target() const {
    return routed_ordinal_ >= 0 ? *state::get().device(routed_ordinal_).owner : state::get().remote();
}

call_request plain_call::request() {
    call_request rq;
    rq.operation = op_;
    int d = call_device();
    rq.device = d < 0 ? -1 : state::get().device(d).server_index;
    rq.args = {args_.data(), n_};
    rq.blobs = {blobs_.data(), n_blobs_};
    rq.payload = payload_;
    return rq;
}

CUresult plain_call::send_sync() {
    VCUDA_REQUIRE_INIT();
    if (error_ == CUDA_SUCCESS && two_sessions_) error_ = refuse_two_sessions();
    if (error_ != CUDA_SUCCESS) return error_;
    lane* l = target().this_thread_lane();
    if (!l) return static_cast<CUresult>(connection_lost_result);
    return static_cast<CUresult>(l->call(request(), reply_));
}

namespace {

// Answers of `cached` queries, keyed by op, device, arguments, blobs and, for a query about a function or
// kernel, the state of that kernel's settable attributes (so answers under each state stay valid side by
// side: PyTorch switches a kernel's dynamic shared memory limit back and forth every step). Setters: by
// target (op, device, arguments but the value) the full call in effect, grouped by kernel (0 for context-wide
// setters); `accepted` every setter call the driver accepted once (validity is static: the same call cannot
// fail later while its handle lives).
struct reply_cache {
    std::mutex mu;
    std::unordered_map<std::string, std::vector<uint64_t>> answers;
    std::unordered_map<uint64_t, std::map<std::string, std::string>> setters;
    std::unordered_set<std::string> accepted;
    // Bumped by whatever changes answers (a setter, a drop): an answer asked for before it is not kept, since
    // the server may have run the setter first (another thread's call).
    uint64_t epoch = 0;
};
reply_cache& cache() {
    static auto* c =
        new reply_cache();  // never destroyed: atexit handlers of the application may still query
    return *c;
}

// A function made from a kernel (cuKernelGetFunction) shares its kernel's attributes.
uint64_t attribute_owner(uint64_t id) {
    handle_info info, owner;
    if (state::get().lookup(id, info) && info.kind == handle_kind::function && info.owner &&
        state::get().lookup(info.owner, owner) && owner.kind == handle_kind::kernel)
        return info.owner;
    return id;
}

}  // namespace

void drop_cached_replies() {
    auto& c = cache();
    std::lock_guard lock(c.mu);
    c.answers.clear();
    c.setters.clear();
    c.accepted.clear();
    ++c.epoch;
}

void plain_call::about(uint64_t function_or_kernel) { about_ = attribute_owner(function_or_kernel); }

std::string plain_call::cache_key() const {
    std::string key(sizeof(uint32_t) + sizeof(int) + n_ * sizeof(uint64_t), '\0');
    auto o = static_cast<uint32_t>(op_);
    int device = call_device();
    std::memcpy(key.data(), &o, sizeof o);
    std::memcpy(key.data() + sizeof o, &device, sizeof device);
    std::memcpy(key.data() + sizeof o + sizeof device, args_.data(), n_ * sizeof(uint64_t));
    for (size_t i = 0; i < n_blobs_; ++i) {
        uint64_t size = blobs_[i].size();  // lengths too: two blobs must not read as one
        key.append(reinterpret_cast<const char*>(&size), sizeof size);
        key.append(reinterpret_cast<const char*>(blobs_[i].data()), blobs_[i].size());
    }
    key.append(reinterpret_cast<const char*>(payload_.data()), payload_.size());
    return key;
}

namespace {
// The attribute state an answer about `about` is kept under (the caller holds c.mu).
std::string state_of(reply_cache& c, uint64_t about) {
    std::string st;
    if (!about) return st;
    auto it = c.setters.find(about);
    if (it == c.setters.end()) return st;
    for (auto& [target, full] : it->second) {
        st += '\x1f';
        st += full;
    }
    return st;
}
}  // namespace

CUresult plain_call::send_cached() {
    VCUDA_REQUIRE_INIT();
    if (error_ != CUDA_SUCCESS) return error_;
    std::string key = cache_key();
    auto& c = cache();
    uint64_t epoch;
    {
        std::lock_guard lock(c.mu);
        key += state_of(c, about_);
        if (auto it = c.answers.find(key); it != c.answers.end()) {
            reply_.result = CUDA_SUCCESS;
            reply_.outs = it->second;
            return CUDA_SUCCESS;
        }
        epoch = c.epoch;
    }
    CUresult rc = send_sync();
    if (rc == CUDA_SUCCESS) {
        std::lock_guard lock(c.mu);
        if (c.epoch == epoch) c.answers.emplace(std::move(key), reply_.outs);
    }
    return rc;
}

bool plain_call::known_to_succeed() const {
    auto& c = cache();
    std::string key = cache_key();
    std::lock_guard lock(c.mu);
    return c.answers.count(key + state_of(c, about_)) != 0;
}

void plain_call::note_success() const {
    auto& c = cache();
    std::string key = cache_key();
    std::lock_guard lock(c.mu);
    c.answers.emplace(key + state_of(c, about_), std::vector<uint64_t>{});
}

CUresult plain_call::send_uncaching(size_t value_index) {
    VCUDA_REQUIRE_INIT();
    if (error_ != CUDA_SUCCESS) return error_;
    std::string full = cache_key();
    std::string target = full;
    if (value_index < n_)
        std::memset(target.data() + sizeof(uint32_t) + sizeof(int) + value_index * sizeof(uint64_t), 0,
                    sizeof(uint64_t));
    auto& c = cache();
    auto same_op = [&](const std::string& k) {
        return k.compare(0, sizeof(uint32_t), target, 0, sizeof(uint32_t)) == 0;
    };
    bool queue = false;
    {
        std::lock_guard lock(c.mu);
        auto& group = c.setters[about_];
        if (auto it = group.find(target); it != group.end() && it->second == full) {
            reply_.result = CUDA_SUCCESS;
            reply_.outs.clear();
            return CUDA_SUCCESS;
        }
        // The same attribute may be set through the kernel or through its function: what the other op set is
        // no longer known to be in effect.
        std::erase_if(group, [&](const auto& kv) { return !same_op(kv.first); });
        group.erase(target);
        ++c.epoch;
        if (!about_) {
            c.answers.clear();  // context-wide: limits and cache configuration bear on every answer
            for (auto& [k, g] : c.setters)
                if (k) g.clear();
        }
        // Only a kernel's attributes: a context limit accepted once may still fail later (memory for the
        // stack).
        queue = about_ != 0 && c.accepted.count(full) != 0;
        if (queue) group[target] = full;  // in effect once the queued call runs, before any later call
    }
    if (queue) return send_async();
    CUresult rc = send_sync();
    if (rc == CUDA_SUCCESS) {
        std::lock_guard lock(c.mu);
        c.setters[about_][target] = full;
        c.accepted.insert(std::move(full));
        ++c.epoch;
    }
    return rc;
}

CUresult plain_call::send_async() {
    VCUDA_REQUIRE_INIT();
    if (error_ == CUDA_SUCCESS && two_sessions_) error_ = refuse_two_sessions();
    if (error_ != CUDA_SUCCESS) return error_;
    lane* l = target().this_thread_lane();
    if (!l) return static_cast<CUresult>(connection_lost_result);
    return static_cast<CUresult>(l->post(request()));
}

void plain_call::adopt_handle(uint64_t id, handle_kind k, uint64_t owner) {
    handle_info info;
    info.kind = k;
    info.owner = owner;
    info.ctx = current_context();
    info.device = current_device();
    state::get().adopt(id, std::move(info));
}

}  // namespace vcuda::client
