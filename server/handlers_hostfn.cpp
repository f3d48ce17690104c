// Host functions (cuLaunchHostFunc, cuStreamAddCallback) run in the client, in stream order: the server
// enqueues a callback of its own on the real stream; when the stream reaches it, the callback hands the
// function's id to the client's host-function thread (op host_func_next) and waits until the client says it
// ran (op host_func_done), so that later work on the stream waits for the function as with the real driver.
#include <memory>

#include "server/call_context.hpp"

namespace vcuda::server {

namespace {
struct pending_host_func {
    std::weak_ptr<session> sess;
    uint64_t id = 0;
};

void CUDA_CB run_in_client(void* data) {
    std::unique_ptr<pending_host_func> p(static_cast<pending_host_func*>(data));
    auto s = p->sess.lock();
    if (!s) return;  // the session is gone: nothing to wait for
    s->host_func_started(p->id);
    s->host_func_wait(p->id);
}
}  // namespace

// args {stream, id}. Queued.
CUresult handle_host_func(call_context& cx) {
    if (!cx.expect_args(2)) return cx.bad_arguments();
    CUstream s;
    if (CUresult rc = cx.handle(0, handle_kind::stream, s); rc != CUDA_SUCCESS) return rc;
    auto* p = new pending_host_func{cx.sess.weak_from_this(), cx.arg(1)};
    CUresult rc = cx.drv().cuLaunchHostFunc(s, &run_in_client, p);
    if (rc != CUDA_SUCCESS) delete p;
    return rc;
}

// args {}. Out {id}: waits until a host function's turn has come on its stream.
CUresult handle_host_func_next(call_context& cx) {
    if (!cx.expect_args(0)) return cx.bad_arguments();
    uint64_t id;
    // The client's host-function thread waits in this call for as long as its process lives; when the process
    // ends, this lane must notice (it reads nothing meanwhile), or the session would never end.
    frame_stream* fs = cx.lane.stream;
    if (!cx.sess.host_func_next(id, [fs] { return fs && fs->raw().peer_gone(); }))
        return cx.fail(CUDA_ERROR_DEINITIALIZED, "session ending");
    cx.out(id);
    return CUDA_SUCCESS;
}

// args {id}. Queued: the client ran it; its stream goes on.
CUresult handle_host_func_done(call_context& cx) {
    if (!cx.expect_args(1)) return cx.bad_arguments();
    cx.sess.host_func_done(cx.arg(0));
    return CUDA_SUCCESS;
}

}  // namespace vcuda::server
