// Hand-written ops for stream capture and graphs. Capture itself needs nothing here: the calls a capturing
// thread makes arrive in order on its lane, whose thread is the one the driver sees capturing. What is here keeps
// the session's handle table right: the graph a capture records into is the driver's until cuStreamEndCapture
// hands it over (entered `owned`, so never destroyed on its own), and the application's from then on.
// The plain graph calls (create, destroy, instantiate with flags, launch, upload) are generated.
#include "server/call_context.hpp"

namespace vcuda::server {

namespace {

bool valid_capture_mode(uint64_t m) { return m <= CU_STREAM_CAPTURE_MODE_RELAXED; }

// This lane's thread takes the client thread's capture mode (cuThreadExchangeStreamCaptureMode): it decides which
// calls the driver allows while a capture is under way.
CUresult set_thread_capture_mode(call_context& cx, uint64_t mode) {
    auto& d = cx.drv();
    if (!d.cuThreadExchangeStreamCaptureMode) return cx.unsupported("cuThreadExchangeStreamCaptureMode");
    auto m = static_cast<CUstreamCaptureMode>(mode);
    return d.cuThreadExchangeStreamCaptureMode(&m);
}

// The capture status and id of `s` and the graph it records into (graph may be null).
CUresult capture_info(call_context& cx, CUstream s, CUstreamCaptureStatus& status, cuuint64_t& id, CUgraph* graph) {
    auto& d = cx.drv();
    if (d.cuStreamGetCaptureInfo_v3) return d.cuStreamGetCaptureInfo_v3(s, &status, &id, graph, nullptr, nullptr, nullptr);
    if (d.cuStreamGetCaptureInfo_v2) return d.cuStreamGetCaptureInfo_v2(s, &status, &id, graph, nullptr, nullptr);
    return cx.unsupported("cuStreamGetCaptureInfo_v3");
}

}  // namespace

// args {stream, capture mode, the calling thread's capture mode} -> outs {capture id, graph}
CUresult handle_begin_capture(call_context& cx) {
    if (!cx.expect_args(3) || !valid_capture_mode(cx.arg(1)) || !valid_capture_mode(cx.arg(2))) return cx.bad_arguments();
    CUstream s;
    if (CUresult rc = cx.handle(0, handle_kind::stream, s); rc != CUDA_SUCCESS) return rc;
    auto& d = cx.drv();
    if (!d.cuStreamBeginCapture_v2 || !d.cuStreamEndCapture) return cx.unsupported("cuStreamBeginCapture_v2");
    if (CUresult rc = set_thread_capture_mode(cx, cx.arg(2)); rc != CUDA_SUCCESS) return rc;
    if (CUresult rc = d.cuStreamBeginCapture_v2(s, static_cast<CUstreamCaptureMode>(cx.arg(1))); rc != CUDA_SUCCESS)
        return rc;
    CUstreamCaptureStatus status{};
    cuuint64_t id = 0;
    CUgraph g = nullptr;
    CUresult rc = capture_info(cx, s, status, id, &g);
    if (rc != CUDA_SUCCESS || !g) {
        // Without its id and graph the client could not follow the capture: undo it.
        CUgraph undone = nullptr;
        if (d.cuStreamEndCapture(s, &undone) == CUDA_SUCCESS && undone && d.cuGraphDestroy) d.cuGraphDestroy(undone);
        return rc != CUDA_SUCCESS ? rc : cx.fail(CUDA_ERROR_UNKNOWN, "the driver named no graph for the capture");
    }
    cx.out(static_cast<uint64_t>(id));
    cx.out_handle(handle_kind::graph, g, 0, /*owned=*/true);
    return CUDA_SUCCESS;
}

// args {stream, the graph begin_capture answered (0: none known)} -> outs {graph, whether the stream still
// captures}. The second out tells the client, after a failure, whether the capture went on (wrong thread) or ended.
CUresult handle_end_capture(call_context& cx) {
    if (!cx.expect_args(2)) return cx.bad_arguments();
    CUstream s;
    if (CUresult rc = cx.handle(0, handle_kind::stream, s); rc != CUDA_SUCCESS) return rc;
    auto& d = cx.drv();
    if (!d.cuStreamEndCapture) return cx.unsupported("cuStreamEndCapture");
    CUgraph g = nullptr;
    CUresult rc = d.cuStreamEndCapture(s, &g);
    CUstreamCaptureStatus still = CU_STREAM_CAPTURE_STATUS_NONE;
    if (rc != CUDA_SUCCESS && d.cuStreamIsCapturing && d.cuStreamIsCapturing(s, &still) != CUDA_SUCCESS)
        still = CU_STREAM_CAPTURE_STATUS_NONE;
    uint64_t begun = cx.arg(1), result = 0;
    {
        std::lock_guard lock(cx.sess.mu);
        handle_entry* e = begun ? cx.sess.handles.find(begun, handle_kind::graph) : nullptr;
        if (rc == CUDA_SUCCESS && e && e->raw == g) {
            e->owned = false;  // the application's now: destroyed with the session unless it destroys it first
            result = begun;
        } else if (e && e->owned && (rc == CUDA_SUCCESS || still == CU_STREAM_CAPTURE_STATUS_NONE)) {
            cx.sess.handles.erase(begun);  // the driver destroyed it with the failed capture
        }
    }
    if (rc != CUDA_SUCCESS) {
        cx.out(uint64_t{0});
        cx.out(uint64_t{still != CU_STREAM_CAPTURE_STATUS_NONE});
        return rc;
    }
    if (result) cx.out(result);
    else cx.out_handle(handle_kind::graph, g);
    cx.out(uint64_t{0});
    return CUDA_SUCCESS;
}

// args {stream} -> outs {status, capture id}: a stream the client does not know to capture, asked about while a
// capture is under way (it may have joined one; the legacy stream may answer CUDA_ERROR_STREAM_CAPTURE_IMPLICIT).
CUresult handle_capture_status(call_context& cx) {
    if (!cx.expect_args(1)) return cx.bad_arguments();
    CUstream s;
    if (CUresult rc = cx.handle(0, handle_kind::stream, s); rc != CUDA_SUCCESS) return rc;
    CUstreamCaptureStatus status{};
    cuuint64_t id = 0;
    if (CUresult rc = capture_info(cx, s, status, id, nullptr); rc != CUDA_SUCCESS) return rc;
    cx.out(static_cast<uint64_t>(status));
    cx.out(uint64_t{status == CU_STREAM_CAPTURE_STATUS_ACTIVE ? id : 0});
    return CUDA_SUCCESS;
}

// args {capture mode}; queued: the client thread's new mode, sent while a capture is under way.
CUresult handle_capture_mode(call_context& cx) {
    if (!cx.expect_args(1) || !valid_capture_mode(cx.arg(0))) return cx.bad_arguments();
    return set_thread_capture_mode(cx, cx.arg(0));
}

// args {graph, flags, upload stream} -> outs {executable graph, CUgraphInstantiateResult}; the result also comes
// back on failure. The failing node is not reported: nodes have no handles.
CUresult handle_graph_instantiate(call_context& cx) {
    if (!cx.expect_args(3)) return cx.bad_arguments();
    CUgraph g;
    if (CUresult rc = cx.handle(0, handle_kind::graph, g); rc != CUDA_SUCCESS) return rc;
    CUstream s;
    if (CUresult rc = cx.handle(2, handle_kind::stream, s); rc != CUDA_SUCCESS) return rc;
    auto& d = cx.drv();
    if (!d.cuGraphInstantiateWithParams) return cx.unsupported("cuGraphInstantiateWithParams");
    CUDA_GRAPH_INSTANTIATE_PARAMS params{};
    params.flags = cx.arg(1);
    params.hUploadStream = s;
    CUgraphExec exec = nullptr;
    CUresult rc = d.cuGraphInstantiateWithParams(&exec, g, &params);
    if (rc != CUDA_SUCCESS) {
        cx.out(uint64_t{0});
        cx.out(static_cast<uint64_t>(params.result_out));
        return rc;
    }
    cx.out_handle(handle_kind::graph_exec, exec);
    cx.out(static_cast<uint64_t>(params.result_out));
    return CUDA_SUCCESS;
}

// args {graph, what (0 nodes, 1 root nodes)} -> outs {count}
CUresult handle_graph_count(call_context& cx) {
    if (!cx.expect_args(2)) return cx.bad_arguments();
    CUgraph g;
    if (CUresult rc = cx.handle(0, handle_kind::graph, g); rc != CUDA_SUCCESS) return rc;
    auto& d = cx.drv();
    size_t n = 0;
    CUresult rc;
    if (cx.arg(1) == 0) {
        if (!d.cuGraphGetNodes) return cx.unsupported("cuGraphGetNodes");
        rc = d.cuGraphGetNodes(g, nullptr, &n);
    } else if (cx.arg(1) == 1) {
        if (!d.cuGraphGetRootNodes) return cx.unsupported("cuGraphGetRootNodes");
        rc = d.cuGraphGetRootNodes(g, nullptr, &n);
    } else {
        return cx.bad_arguments();
    }
    if (rc == CUDA_SUCCESS) cx.out(static_cast<uint64_t>(n));
    return rc;
}

}  // namespace vcuda::server
