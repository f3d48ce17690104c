// Host functions (cuLaunchHostFunc, cuStreamAddCallback) run here, in the application's process, in stream
// order: the server holds the stream at the function's place until this process has run it
// (server/handlers_hostfn.cpp). One thread per session waits for functions whose turn has come and runs them.
#include <unistd.h>

#include <mutex>
#include <set>
#include <thread>
#include <unordered_map>

#include "client/entry_point.hpp"
#include "client/plain_call.hpp"
#include "client/remote_call.hpp"
#include "client/state.hpp"
#include "client/trace.hpp"
#include "common/log.hpp"

using namespace vcuda;
using namespace vcuda::client;

namespace {

struct host_call {
    void (*fn)(void*) = nullptr;
    void* data = nullptr;
    // cuStreamAddCallback's form: fn(stream, status, data).
    CUstreamCallback callback = nullptr;
    CUstream stream = nullptr;
};

struct host_functions {
    std::mutex mu;
    std::unordered_map<uint64_t, host_call> pending;
    uint64_t next_id = 1;
    std::set<session*> watched;  // sessions whose host-function thread runs
    pid_t pid = 0;               // the process those threads belong to (a forked child starts its own)
};
host_functions& registry() {
    static auto* r = new host_functions();  // never destroyed: the threads may outlive static destruction
    return *r;
}

// Runs host functions of session `s` as their turn comes, until the session ends.
void run_host_functions(session* s) {
    lane* l = s->this_thread_lane();
    if (!l) return;
    for (;;) {
        call_request rq;
        rq.operation = op::host_func_next;
        call_reply rp;
        if (l->call(rq, rp) != CUDA_SUCCESS || rp.outs.empty()) return;
        uint64_t id = rp.outs[0];
        host_call c;
        {
            auto& r = registry();
            std::lock_guard lock(r.mu);
            auto it = r.pending.find(id);
            if (it != r.pending.end()) {
                c = it->second;
                // One captured into a graph runs again at each launch of the graph: kept (for the process's
                // life, as graphs give no sign of their end here).
                if (rp.outs.size() < 2 || rp.outs[1] == 0) r.pending.erase(it);
            }
        }
        if (c.fn)
            c.fn(c.data);
        else if (c.callback)
            c.callback(c.stream, CUDA_SUCCESS, c.data);
        uint64_t arg = id;
        call_request done;
        done.operation = op::host_func_done;
        done.args = {&arg, 1};
        if (l->post(done) != CUDA_SUCCESS) return;
    }
}

CUresult enqueue(CUstream stream, const host_call& c) {
    VCUDA_REQUIRE_INIT();
    if (!valid_handle(reinterpret_cast<uint64_t>(stream), handle_kind::stream))
        return CUDA_ERROR_INVALID_HANDLE;
    session* s = &state::get().remote();
    uint64_t id;
    {
        auto& r = registry();
        std::lock_guard lock(r.mu);
        if (r.pid != getpid()) {  // first use, or a forked child: the parent's threads stayed behind
            r.watched.clear();
            r.pending.clear();
            r.pid = getpid();
        }
        if (r.watched.insert(s).second) std::thread(run_host_functions, s).detach();
        id = r.next_id++;
        r.pending[id] = c;
    }
    CUresult rc = remote(op::host_func, {reinterpret_cast<uint64_t>(stream), id}, mode::post);
    if (rc != CUDA_SUCCESS) {
        auto& r = registry();
        std::lock_guard lock(r.mu);
        r.pending.erase(id);
    }
    return rc;
}

}  // namespace

VCUDA_API cuLaunchHostFunc(CUstream hStream, CUhostFn fn, void* userData) noexcept {
    VCUDA_TRACE_HOOK(cuLaunchHostFunc, hStream, fn, userData);
    if (!fn) return CUDA_ERROR_INVALID_VALUE;
    host_call c;
    c.fn = fn;
    c.data = userData;
    return enqueue(hStream, c);
}

VCUDA_API cuStreamAddCallback(CUstream hStream, CUstreamCallback callback, void* userData,
                              unsigned int flags) noexcept {
    VCUDA_TRACE_HOOK(cuStreamAddCallback, hStream, callback, userData, flags);
    if (!callback || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    host_call c;
    c.callback = callback;
    c.data = userData;
    c.stream = hStream;
    return enqueue(hStream, c);
}
