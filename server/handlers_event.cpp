// Event records, waits, queries, synchronizations, destruction and elapsed times, hand-written on the server
// (spec: server=...) so that events keep what they measured across a suspend of their session
// (session_tables.hpp: event_ages), and so that an exported IPC event's handle is withdrawn when it goes.
#include "ops.hpp"
#include "server/call_context.hpp"
#include "server/session.hpp"
#include "server_ops.hpp"

namespace vcuda::server {

// cuEventRecord {event, stream} and cuEventRecordWithFlags {event, stream, flags}. Queued.
CUresult handle_event_record(call_context& cx) {
    const bool with_flags = cx.op_id() == static_cast<uint32_t>(op::cuEventRecordWithFlags);
    if (!cx.expect_args(with_flags ? 3 : 2)) return cx.bad_arguments();
    if (with_flags ? !cx.drv().cuEventRecordWithFlags : !cx.drv().cuEventRecord)
        return cx.unsupported(with_flags ? "cuEventRecordWithFlags" : "cuEventRecord");
    CUevent e;
    if (CUresult rc = cx.handle(0, handle_kind::event, e); rc != CUDA_SUCCESS) return rc;
    CUstream s;
    if (CUresult rc = cx.handle(1, handle_kind::stream, s); rc != CUDA_SUCCESS) return rc;
    CUresult rc = with_flags ? cx.drv().cuEventRecordWithFlags(e, s, cx.scalar<unsigned>(2))
                             : cx.drv().cuEventRecord(e, s);
    if (rc != CUDA_SUCCESS) return rc;
    std::lock_guard lock(cx.sess.mu);
    cx.sess.event_times.forget(cx.arg(0));
    return CUDA_SUCCESS;
}

// The session's context on that device holds only this session's work; a green context's is its own CUcontext
// (cuGreenCtxRecordEvent's and cuGreenCtxWaitEvent's).
CUresult handle_ctx_event(call_context& cx, const ctx_event_args& a) {
    if (a.what > 1) return cx.bad_arguments();
    const bool record = a.what == 0;
    auto& d = cx.drv();
    if (record ? !d.cuCtxRecordEvent : !d.cuCtxWaitEvent)
        return cx.unsupported(record ? "cuCtxRecordEvent" : "cuCtxWaitEvent");
    CUresult rc = CUDA_SUCCESS;
    const uint64_t green = a.has_green ? a.green_id : 0;
    CUcontext ctx = green ? cx.sess.green_context(green) : cx.sess.context(a.dev_index, rc);
    if (!ctx)
        return green ? cx.fail(CUDA_ERROR_INVALID_CONTEXT, "no such green context in this session") : rc;
    rc = record ? d.cuCtxRecordEvent(ctx, a.event) : d.cuCtxWaitEvent(ctx, a.event);
    if (rc == CUDA_SUCCESS && record) {
        std::lock_guard lock(cx.sess.mu);
        cx.sess.event_times.forget(a.event_id);
    }
    return rc;
}

CUresult handle_stream_wait_event(call_context& cx, const stream_wait_event_args& a) {
    if (!cx.drv().cuStreamWaitEvent) return cx.unsupported("cuStreamWaitEvent");
    return cx.drv().cuStreamWaitEvent(a.stream, a.event, a.flags);
}

// cuEventQuery {event} and cuEventSynchronize {event}.
CUresult handle_event_query(call_context& cx) {
    if (!cx.expect_args(1)) return cx.bad_arguments();
    if (!cx.drv().cuEventQuery) return cx.unsupported("cuEventQuery");
    CUevent e;
    if (CUresult rc = cx.handle(0, handle_kind::event, e); rc != CUDA_SUCCESS) return rc;
    return cx.drv().cuEventQuery(e);
}

CUresult handle_event_synchronize(call_context& cx) {
    if (!cx.expect_args(1)) return cx.bad_arguments();
    if (!cx.drv().cuEventSynchronize) return cx.unsupported("cuEventSynchronize");
    CUevent e;
    if (CUresult rc = cx.handle(0, handle_kind::event, e); rc != CUDA_SUCCESS) return rc;
    return cx.drv().cuEventSynchronize(e);
}

// cuEventDestroy_v2 {event}: an exported event's handle opens no more.
CUresult handle_event_destroy(call_context& cx) {
    if (!cx.expect_args(1)) return cx.bad_arguments();
    if (!cx.drv().cuEventDestroy_v2) return cx.unsupported("cuEventDestroy_v2");
    CUevent e;
    if (CUresult rc = cx.handle(0, handle_kind::event, e); rc != CUDA_SUCCESS) return rc;
    {
        std::lock_guard lock(cx.sess.mu);
        auto& t = cx.sess.ipc_state;
        if (auto it = t.event_exports.find(cx.arg(0)); it != t.event_exports.end()) {
            if (cx.sess.ipc()) cx.sess.ipc()->withdraw(it->second, cx.sess.id());
            t.event_exports.erase(it);
        }
    }
    if (CUresult rc = cx.drv().cuEventDestroy_v2(e); rc != CUDA_SUCCESS) return rc;
    cx.forget_handle(0);
    return CUDA_SUCCESS;
}

// cuEventElapsedTime(_v2) {start, end} -> {milliseconds}.
CUresult handle_event_elapsed(call_context& cx) {
    const bool v2 = cx.op_id() == static_cast<uint32_t>(op::cuEventElapsedTime_v2);
    if (!cx.expect_args(2)) return cx.bad_arguments();
    if (v2 ? !cx.drv().cuEventElapsedTime_v2 : !cx.drv().cuEventElapsedTime)
        return cx.unsupported(v2 ? "cuEventElapsedTime_v2" : "cuEventElapsedTime");
    CUevent start, end;
    if (CUresult rc = cx.handle(0, handle_kind::event, start); rc != CUDA_SUCCESS) return rc;
    if (CUresult rc = cx.handle(1, handle_kind::event, end); rc != CUDA_SUCCESS) return rc;
    float ms = 0;
    CUresult rc =
        v2 ? cx.drv().cuEventElapsedTime_v2(&ms, start, end) : cx.drv().cuEventElapsedTime(&ms, start, end);
    if (rc != CUDA_SUCCESS) return rc;
    {
        std::lock_guard lock(cx.sess.mu);
        ms += static_cast<float>(cx.sess.event_times.age(cx.arg(0)) - cx.sess.event_times.age(cx.arg(1)));
    }
    cx.out(ms);
    return CUDA_SUCCESS;
}

}  // namespace vcuda::server
