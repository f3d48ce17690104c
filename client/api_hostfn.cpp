// Host functions (cuLaunchHostFunc, cuStreamAddCallback) run here, in the application's process, in stream
// order: the server holds the stream at the function's place until this process has run it
// (server/handlers_hostfn.cpp). One thread per session waits for functions whose turn has come and runs them.
// Graph host nodes and the host side of graph copies with this process's memory (client/host_functions.hpp)
// come the same way: at a copy's turn the thread reads or writes the copy's staging buffer on the server.
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <unordered_map>
#include <vector>

#include "client/deferred_copies.hpp"
#include "client/entry_point.hpp"
#include "client/host_functions.hpp"
#include "client/plain_call.hpp"
#include "client/remote_call.hpp"
#include "client/state.hpp"
#include "client/trace.hpp"
#include "client_ops.hpp"
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
    // A graph copy's side in this process.
    std::optional<host_copy_side> copy;
    // A user object's destructor: fn(data) once, when the server's driver destroys the object; no stream
    // waits.
    bool destructor = false;
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

// At most this many bytes of a graph copy in one call (as the server allows).
constexpr size_t host_copy_chunk = size_t{8} << 20;

// Calls at(p, len, offset) for each piece of packed bytes [off, off+n) of copy `c`: its address here, its
// length (at most the rest of its row) and its offset in the packed bytes.
template <class F>
void for_each_piece(const host_copy_side& c, size_t off, size_t n, F&& at) {
    while (n > 0) {
        const size_t row = off / c.w, in_row = off % c.w;
        const size_t y = row % c.h, z = row / c.h;
        char* p = c.base + ((c.z + z) * c.height + c.y + y) * c.pitch + c.x + in_row;
        const size_t len = std::min(n, c.w - in_row);
        at(p, len, off);
        off += len;
        n -= len;
    }
}

// Moves graph copy `id`'s bytes between its staging buffer on the server and this process's memory.
int move_copy(lane& l, uint64_t id, const host_copy_side& c) {
    const size_t total = c.w * c.h * c.depth;
    std::vector<std::byte> chunk;
    for (size_t off = 0; off < total; off += host_copy_chunk) {
        const size_t n = std::min(host_copy_chunk, total - off);
        call_request rq;
        call_reply rp;
        if (c.to_device) {
            chunk.resize(n);
            for_each_piece(c, off, n, [&](const char* p, size_t len, size_t at) {
                std::memcpy(&chunk[at - off], p, len);
            });
            uint64_t args[] = {id, off};
            rq.operation = op::host_copy_write;
            rq.args = args;
            rq.payload = chunk;
            if (int rc = l.call(rq, rp); rc != CUDA_SUCCESS) return rc;
        } else {
            uint64_t args[] = {id, off, n};
            rq.operation = op::host_copy_read;
            rq.args = args;
            if (int rc = l.call(rq, rp); rc != CUDA_SUCCESS) return rc;
            if (rp.payload.size() != n) return CUDA_ERROR_UNKNOWN;
            for_each_piece(c, off, n, [&](char* p, size_t len, size_t at) {
                std::memcpy(p, &rp.payload[at - off], len);
            });
        }
    }
    return CUDA_SUCCESS;
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
        if (c.destructor) {
            c.fn(c.data);
            continue;
        }
        // The stream's work before the function is done: copies it left under way land before it runs (and
        // before a graph copy reads or writes the same memory here).
        settle_finished();
        if (c.fn) {
            c.fn(c.data);
        } else if (c.callback) {
            c.callback(c.stream, CUDA_SUCCESS, c.data);
        } else if (c.copy) {
            // A failure leaves the copy's bytes as they were; the graph goes on, as it must (logged).
            if (int rc = move_copy(*l, id, *c.copy); rc != CUDA_SUCCESS)
                VCUDA_LOG_WARN(
                    "a graph copy with this process's memory failed (error {}): its bytes did not move", rc);
        }
        uint64_t arg = id;
        call_request done;
        done.operation = op::host_func_done;
        done.args = {&arg, 1};
        if (l->post(done) != CUDA_SUCCESS) return;
    }
}

// Registers `c` under a new id, with the current session's host-function thread running.
uint64_t add(const host_call& c) {
    session* s = &state::get().remote();
    auto& r = registry();
    std::lock_guard lock(r.mu);
    if (r.pid != getpid()) {  // first use, or a forked child: the parent's threads stayed behind
        r.watched.clear();
        r.pending.clear();
        r.pid = getpid();
    }
    if (r.watched.insert(s).second) std::thread(run_host_functions, s).detach();
    uint64_t id = r.next_id++;
    r.pending[id] = c;
    return id;
}

CUresult enqueue(CUstream stream, const host_call& c) {
    VCUDA_REQUIRE_INIT();
    if (!valid_handle(reinterpret_cast<uint64_t>(stream), handle_kind::stream))
        return CUDA_ERROR_INVALID_HANDLE;
    uint64_t id = add(c);
    CUresult rc = host_func_call("cuLaunchHostFunc", stream, id).send_async();
    if (rc != CUDA_SUCCESS) forget_host_function(id);
    return rc;
}

}  // namespace

namespace vcuda::client {

uint64_t graph_host_function(CUhostFn fn, void* data) {
    host_call c;
    c.fn = fn;
    c.data = data;
    return add(c);
}

uint64_t graph_host_copy(const host_copy_side& side) {
    host_call c;
    c.copy = side;
    return add(c);
}

bool graph_host_function_of(uint64_t id, CUhostFn& fn, void*& data) {
    auto& r = registry();
    std::lock_guard lock(r.mu);
    auto it = r.pending.find(id);
    if (it == r.pending.end() || !it->second.fn) return false;
    fn = it->second.fn;
    data = it->second.data;
    return true;
}

bool graph_host_copy_of(uint64_t id, host_copy_side& side) {
    auto& r = registry();
    std::lock_guard lock(r.mu);
    auto it = r.pending.find(id);
    if (it == r.pending.end() || !it->second.copy) return false;
    side = *it->second.copy;
    return true;
}

void forget_host_function(uint64_t id) {
    auto& r = registry();
    std::lock_guard lock(r.mu);
    r.pending.erase(id);
}

}  // namespace vcuda::client

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

// User objects: the server holds the driver's object (server/handlers_hostfn.cpp); the application's
// destructor is registered here as a host function, which the host-function thread runs once the driver has
// destroyed the object. The handle is the registration's id.
VCUDA_API cuUserObjectCreate(CUuserObject* object_out, void* ptr, CUhostFn destroy,
                             unsigned int initialRefcount, unsigned int flags) noexcept {
    VCUDA_TRACE_HOOK(cuUserObjectCreate, object_out, ptr, destroy, initialRefcount, flags);
    VCUDA_REQUIRE_INIT();
    if (!object_out || !destroy || initialRefcount == 0 || flags != CU_USER_OBJECT_NO_DESTRUCTOR_SYNC)
        return CUDA_ERROR_INVALID_VALUE;
    host_call c;
    c.fn = destroy;
    c.data = ptr;
    c.destructor = true;
    const uint64_t id = add(c);
    CUresult rc = user_object_create_call("cuUserObjectCreate", id, initialRefcount).send_sync();
    if (rc != CUDA_SUCCESS) {
        forget_host_function(id);
        return rc;
    }
    *object_out = reinterpret_cast<CUuserObject>(id);
    return CUDA_SUCCESS;
}

VCUDA_API cuUserObjectRetain(CUuserObject object, unsigned int count) noexcept {
    VCUDA_TRACE_HOOK(cuUserObjectRetain, object, count);
    VCUDA_REQUIRE_INIT();
    if (!object || count == 0) return CUDA_ERROR_INVALID_VALUE;
    return user_object_refs_call("cuUserObjectRetain", reinterpret_cast<uint64_t>(object), count, true)
        .send_sync();
}

VCUDA_API cuUserObjectRelease(CUuserObject object, unsigned int count) noexcept {
    VCUDA_TRACE_HOOK(cuUserObjectRelease, object, count);
    VCUDA_REQUIRE_INIT();
    if (!object || count == 0) return CUDA_ERROR_INVALID_VALUE;
    return user_object_refs_call("cuUserObjectRelease", reinterpret_cast<uint64_t>(object), count, false)
        .send_sync();
}

VCUDA_API cuGraphRetainUserObject(CUgraph graph, CUuserObject object, unsigned int count,
                                  unsigned int flags) noexcept {
    VCUDA_TRACE_HOOK(cuGraphRetainUserObject, graph, object, count, flags);
    VCUDA_REQUIRE_INIT();
    if (!object || count == 0 || !valid_handle(reinterpret_cast<uint64_t>(graph), handle_kind::graph))
        return CUDA_ERROR_INVALID_VALUE;
    return graph_user_object_call("cuGraphRetainUserObject", graph, reinterpret_cast<uint64_t>(object), count,
                                  flags, true)
        .send_sync();
}

VCUDA_API cuGraphReleaseUserObject(CUgraph graph, CUuserObject object, unsigned int count) noexcept {
    VCUDA_TRACE_HOOK(cuGraphReleaseUserObject, graph, object, count);
    VCUDA_REQUIRE_INIT();
    if (!object || count == 0 || !valid_handle(reinterpret_cast<uint64_t>(graph), handle_kind::graph))
        return CUDA_ERROR_INVALID_VALUE;
    return graph_user_object_call("cuGraphReleaseUserObject", graph, reinterpret_cast<uint64_t>(object),
                                  count, 0, false)
        .send_sync();
}
