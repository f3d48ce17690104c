// Event records and elapsed times, hand-written on the server (spec: server=...) so that events keep what
// they measured across a suspend of their session (session_tables.hpp: event_ages).
#include "ops.hpp"
#include "server/call_context.hpp"
#include "server/session.hpp"

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
