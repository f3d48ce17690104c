// Host functions (cuLaunchHostFunc, cuStreamAddCallback) run in the client, in stream order: the server
// enqueues a callback of its own on the real stream; when the stream reaches it, the callback hands the
// function's id to the client's host-function thread (op host_func_next) and waits until the client says it
// ran (op host_func_done), so that later work on the stream waits for the function as with the real driver.
#include <memory>

#include "server/call_context.hpp"

namespace vcuda::server {

namespace {
// One host function as the driver's callback sees it. Launched on a stream, it runs once and is freed then;
// captured into a graph, it runs at every launch of the graph, so the session keeps it until it ends (after
// its graphs are destroyed).
struct pending_host_func : session::kept_host_func {
    std::weak_ptr<session> sess;
    uint64_t id = 0;
    bool in_graph = false;
};

void CUDA_CB run_in_client(void* data) {
    auto* p = static_cast<pending_host_func*>(data);
    std::unique_ptr<pending_host_func> once(p->in_graph ? nullptr : p);
    auto s = p->sess.lock();
    if (!s) return;  // the session is gone: nothing to wait for
    s->host_func_started(p->id, p->in_graph);
    s->host_func_wait(p->id);
}
}  // namespace

// args {stream, id}. Queued.
CUresult handle_host_func(call_context& cx) {
    if (!cx.expect_args(2)) return cx.bad_arguments();
    CUstream s;
    if (CUresult rc = cx.handle(0, handle_kind::stream, s); rc != CUDA_SUCCESS) return rc;
    auto p = std::make_unique<pending_host_func>();
    p->sess = cx.sess.weak_from_this();
    p->id = cx.arg(1);
    CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
    if (cx.drv().cuStreamIsCapturing) cx.drv().cuStreamIsCapturing(s, &capture);
    p->in_graph = capture == CU_STREAM_CAPTURE_STATUS_ACTIVE;
    CUresult rc = cx.drv().cuLaunchHostFunc(s, &run_in_client, p.get());
    if (rc != CUDA_SUCCESS) return rc;
    if (p->in_graph)
        cx.sess.keep_host_func(std::move(p));
    else
        static_cast<void>(p.release());  // run_in_client frees it after its one run
    return CUDA_SUCCESS;
}

// args {}. Out {id, in a graph}: waits until a host function's turn has come on its stream or in a graph's
// launch; one in a graph runs again at every launch, so the client keeps it.
CUresult handle_host_func_next(call_context& cx) {
    if (!cx.expect_args(0)) return cx.bad_arguments();
    uint64_t id;
    bool in_graph = false;
    // The client's host-function thread waits in this call for as long as its process lives; when the process
    // ends, this lane must notice (it reads nothing meanwhile), or the session would never end.
    frame_stream* fs = cx.lane.stream;
    if (!cx.sess.host_func_next(id, in_graph, [fs] { return fs && fs->raw().peer_gone(); }))
        return cx.fail(CUDA_ERROR_DEINITIALIZED, "session ending");
    cx.out(id);
    cx.out(uint64_t{in_graph});
    return CUDA_SUCCESS;
}

// args {id}. Queued: the client ran it; its stream goes on.
CUresult handle_host_func_done(call_context& cx) {
    if (!cx.expect_args(1)) return cx.bad_arguments();
    cx.sess.host_func_done(cx.arg(0));
    return CUDA_SUCCESS;
}

}  // namespace vcuda::server
