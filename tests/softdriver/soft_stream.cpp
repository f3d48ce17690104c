// The software test driver: streams, events, host functions. All work runs synchronously in the calling
// thread, so every stream is always complete and every recorded event has happened; what remains is the
// bookkeeping and the call-time checks of the real driver. NULL, CU_STREAM_LEGACY and CU_STREAM_PER_THREAD
// are valid wherever a stream is taken (they need a current context). Host functions and stream callbacks run
// at once, with the driver's lock released. Capture status queries are here; the capture itself is
// soft_graph.cpp.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <type_traits>

#include "soft_state.hpp"

namespace vcuda::soft {
namespace {

thread_local CUstreamCaptureMode capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;

bool special_stream(CUstream h) { return h == nullptr || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD; }

CUresult create_stream(state& s, CUstream* ph, unsigned flags, int priority) {
    if (ph == nullptr || (flags & ~static_cast<unsigned>(CU_STREAM_NON_BLOCKING)) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    context_obj* c = nullptr;
    if (CUresult r = require_context(s, c); r != CUDA_SUCCESS) return r;
    // Out-of-range priorities are clamped, as the real driver does.
    if (priority > least_stream_priority) priority = least_stream_priority;
    if (priority < greatest_stream_priority) priority = greatest_stream_priority;
    stream_obj* st = s.create<stream_obj>();
    st->ctx = c->handle;
    st->flags = flags;
    st->priority = priority;
    st->id = s.next_stream_id++;
    *ph = to_handle<CUstream>(st->handle);
    return CUDA_SUCCESS;
}

}  // namespace

CUresult record_event(state& s, CUevent ev, CUstream stream) {
    event_obj* e = s.find<event_obj>(ev);
    if (e == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    if (CUresult r = check_stream(s, stream); r != CUDA_SUCCESS) return r;
    // Recorded inside a capture: nothing happens now; the event marks a point other streams can join at.
    if (capture_seq* q = capture_of(s, stream)) {
        if (q->invalidated) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
        e->capture = q->id;
        return CUDA_SUCCESS;
    }
    work none;
    if (CUresult r = capture_or_run(s, stream, none, CU_GRAPH_NODE_TYPE_EMPTY); r != CUDA_SUCCESS) return r;
    e->capture = 0;
    e->recorded = true;
    e->when = std::chrono::steady_clock::now();
    return CUDA_SUCCESS;
}

namespace {

CUresult elapsed(state& s, float* ms, CUevent start, CUevent end) {
    if (ms == nullptr) return CUDA_ERROR_INVALID_VALUE;
    event_obj* a = s.find<event_obj>(start);
    event_obj* b = s.find<event_obj>(end);
    if (a == nullptr || b == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    // Like the real driver: events without timing, or never recorded, are not valid here.
    if (((a->flags | b->flags) & CU_EVENT_DISABLE_TIMING) != 0) return CUDA_ERROR_INVALID_HANDLE;
    if (!a->recorded || !b->recorded) return CUDA_ERROR_INVALID_HANDLE;
    *ms = std::chrono::duration<float, std::milli>(b->when - a->when).count();
    return CUDA_SUCCESS;
}

// Waiting for an event recorded inside a capture that is still under way is not allowed.
CUresult check_event_waitable(state& s, event_obj& e) {
    if (e.capture != 0 && s.captures.count(e.capture) != 0) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    return CUDA_SUCCESS;
}

// cuStreamIsCapturing / cuStreamGetCaptureInfo: the status of `h` and its capture, if any.
CUresult capture_status(state& s, CUstream h, CUstreamCaptureStatus& status, capture_seq*& q) {
    if (CUresult r = check_stream(s, h); r != CUDA_SUCCESS) return r;
    if (blocked_by_capture(s, h)) return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
    q = capture_of(s, h);
    status = q == nullptr     ? CU_STREAM_CAPTURE_STATUS_NONE
             : q->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                              : CU_STREAM_CAPTURE_STATUS_ACTIVE;
    return CUDA_SUCCESS;
}

CUresult capture_info(state& s, CUstream h, CUstreamCaptureStatus* status, cuuint64_t* id, CUgraph* graph,
                      const CUgraphNode** dependencies, const CUgraphEdgeData** edges, size_t* count) {
    if (status == nullptr) return CUDA_ERROR_INVALID_VALUE;
    capture_seq* q = nullptr;
    if (CUresult r = capture_status(s, h, *status, q); r != CUDA_SUCCESS) return r;
    if (id != nullptr) *id = q != nullptr ? q->id : 0;
    if (graph != nullptr) *graph = q != nullptr ? to_handle<CUgraph>(q->graph) : nullptr;
    // The nodes the next captured work will depend on; valid until the capture changes, as the driver says.
    const bool deps = q != nullptr && !q->last.empty();
    if (deps && q->last_edges.size() != q->last.size())
        q->last_edges.assign(q->last.size(), CUgraphEdgeData{});
    if (deps) {
        q->reported.clear();
        for (uint64_t h : q->last) q->reported.push_back(to_handle<CUgraphNode>(h));
    }
    if (dependencies != nullptr) *dependencies = deps ? q->reported.data() : nullptr;
    if (edges != nullptr) *edges = deps ? q->last_edges.data() : nullptr;
    if (count != nullptr) *count = deps ? q->last.size() : 0;
    return CUDA_SUCCESS;
}

}  // namespace

CUstreamCaptureMode thread_capture_mode() { return capture_mode; }

CUresult check_stream(state& s, CUstream h, context_obj** ctx) {
    context_obj* c = nullptr;
    if (special_stream(h)) {
        if (CUresult r = require_context(s, c); r != CUDA_SUCCESS) return r;
    } else {
        stream_obj* st = s.find<stream_obj>(h);
        if (st == nullptr) return CUDA_ERROR_INVALID_HANDLE;
        c = usable_context(s, st->ctx);
        if (c == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
    }
    if (ctx != nullptr) *ctx = c;
    return CUDA_SUCCESS;
}

}  // namespace vcuda::soft

using namespace vcuda::soft;

// --- Streams.

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuStreamCreate(CUstream* phStream, unsigned int Flags) {
    return entry([&](state& s) { return create_stream(s, phStream, Flags, least_stream_priority); });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuStreamCreateWithPriority(CUstream* phStream, unsigned int flags,
                                                              int priority) {
    return entry([&](state& s) { return create_stream(s, phStream, flags, priority); });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuStreamDestroy_v2(CUstream hStream) {
    return entry([&](state& s) -> CUresult {
        stream_obj* st = s.find<stream_obj>(hStream);
        if (st == nullptr) return CUDA_ERROR_INVALID_HANDLE;
        // A capture begun on it ends with it, its graph unfinished.
        if (capture_seq* q = capture_of(s, hStream); q != nullptr && q->origin == st->handle) {
            s.erase(q->graph);
            s.captures.erase(q->id);
        }
        s.erase(st->handle);
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuStreamSynchronize(CUstream hStream) {
    return entry([&](state& s) -> CUresult {
        if (CUresult r = check_stream(s, hStream); r != CUDA_SUCCESS) return r;
        return check_not_capturing(s, hStream);
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuStreamQuery(CUstream hStream) {
    return entry([&](state& s) -> CUresult {
        if (CUresult r = check_stream(s, hStream); r != CUDA_SUCCESS) return r;
        return check_not_capturing(s, hStream);
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags) {
    return entry([&](state& s) -> CUresult {
        if (CUresult r = check_stream(s, hStream); r != CUDA_SUCCESS) return r;
        event_obj* e = s.find<event_obj>(hEvent);
        if (e == nullptr) return CUDA_ERROR_INVALID_HANDLE;
        if ((Flags & ~static_cast<unsigned>(CU_EVENT_WAIT_EXTERNAL)) != 0) return CUDA_ERROR_INVALID_VALUE;
        work none;
        if (CUresult r = capture_or_run(s, hStream, none, CU_GRAPH_NODE_TYPE_EMPTY); r != CUDA_SUCCESS)
            return r;
        // An event recorded in a capture under way: the waiting stream joins that capture.
        if (e->capture == 0 || s.captures.count(e->capture) == 0) return CUDA_SUCCESS;
        capture_seq* q = capture_of(s, hStream);
        if (q != nullptr) return q->id == e->capture ? CUDA_SUCCESS : CUDA_ERROR_STREAM_CAPTURE_ISOLATION;
        uint64_t* slot = capture_slot(s, hStream);
        if (slot == nullptr) return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;  // the legacy stream cannot capture
        *slot = e->capture;
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuStreamGetPriority(CUstream hStream, int* priority) {
    return entry([&](state& s) -> CUresult {
        if (priority == nullptr) return CUDA_ERROR_INVALID_VALUE;
        if (CUresult r = check_stream(s, hStream); r != CUDA_SUCCESS) return r;
        stream_obj* st = s.find<stream_obj>(hStream);
        *priority = st != nullptr ? st->priority : least_stream_priority;
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuStreamGetFlags(CUstream hStream, unsigned int* flags) {
    return entry([&](state& s) -> CUresult {
        if (flags == nullptr) return CUDA_ERROR_INVALID_VALUE;
        if (CUresult r = check_stream(s, hStream); r != CUDA_SUCCESS) return r;
        stream_obj* st = s.find<stream_obj>(hStream);
        *flags = st != nullptr ? st->flags : 0u;
        return CUDA_SUCCESS;
    });
}

// Created streams count from 16; the legacy default stream is 1 and the per-thread one 2.
VCUDA_SOFT_EXPORT CUresult CUDAAPI cuStreamGetId(CUstream hStream, unsigned long long* streamId) {
    return entry([&](state& s) -> CUresult {
        if (streamId == nullptr) return CUDA_ERROR_INVALID_VALUE;
        if (CUresult r = check_stream(s, hStream); r != CUDA_SUCCESS) return r;
        stream_obj* st = s.find<stream_obj>(hStream);
        *streamId = st != nullptr ? st->id : (hStream == CU_STREAM_PER_THREAD ? 2u : 1u);
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuStreamGetCtx(CUstream hStream, CUcontext* pctx) {
    return entry([&](state& s) -> CUresult {
        if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
        context_obj* c = nullptr;
        if (CUresult r = check_stream(s, hStream, &c); r != CUDA_SUCCESS) return r;
        *pctx = to_handle<CUcontext>(c->handle);
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuStreamGetCtx_v2(CUstream hStream, CUcontext* pCtx,
                                                     CUgreenCtx* pGreenCtx) {
    return entry([&](state& s) -> CUresult {
        if (pCtx == nullptr || pGreenCtx == nullptr) return CUDA_ERROR_INVALID_VALUE;
        context_obj* c = nullptr;
        if (CUresult r = check_stream(s, hStream, &c); r != CUDA_SUCCESS) return r;
        *pCtx = to_handle<CUcontext>(c->handle);
        *pGreenCtx = nullptr;
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuStreamGetDevice(CUstream hStream, CUdevice* device) {
    return entry([&](state& s) -> CUresult {
        if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
        context_obj* c = nullptr;
        if (CUresult r = check_stream(s, hStream, &c); r != CUDA_SUCCESS) return r;
        *device = c->device;
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuStreamIsCapturing(CUstream hStream,
                                                       CUstreamCaptureStatus* captureStatus) {
    return entry([&](state& s) -> CUresult {
        if (captureStatus == nullptr) return CUDA_ERROR_INVALID_VALUE;
        capture_seq* q = nullptr;
        return capture_status(s, hStream, *captureStatus, q);
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuStreamGetCaptureInfo_v2(CUstream hStream,
                                                             CUstreamCaptureStatus* captureStatus_out,
                                                             cuuint64_t* id_out, CUgraph* graph_out,
                                                             const CUgraphNode** dependencies_out,
                                                             size_t* numDependencies_out) {
    return entry([&](state& s) {
        return capture_info(s, hStream, captureStatus_out, id_out, graph_out, dependencies_out, nullptr,
                            numDependencies_out);
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuStreamGetCaptureInfo_v3(
    CUstream hStream, CUstreamCaptureStatus* captureStatus_out, cuuint64_t* id_out, CUgraph* graph_out,
    const CUgraphNode** dependencies_out, const CUgraphEdgeData** edgeData_out, size_t* numDependencies_out) {
    return entry([&](state& s) {
        return capture_info(s, hStream, captureStatus_out, id_out, graph_out, dependencies_out, edgeData_out,
                            numDependencies_out);
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode* mode) {
    return entry([&](state&) -> CUresult {
        if (mode == nullptr || *mode < CU_STREAM_CAPTURE_MODE_GLOBAL ||
            *mode > CU_STREAM_CAPTURE_MODE_RELAXED)
            return CUDA_ERROR_INVALID_VALUE;
        CUstreamCaptureMode old = capture_mode;
        capture_mode = *mode;
        *mode = old;
        return CUDA_SUCCESS;
    });
}

// --- Host work: runs now, in this thread, without the driver's lock.

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuLaunchHostFunc(CUstream hStream, CUhostFn fn, void* userData) {
    return entry_then([&](state& s, work& w) -> CUresult {
        if (fn == nullptr) return CUDA_ERROR_INVALID_VALUE;
        if (CUresult r = check_stream(s, hStream); r != CUDA_SUCCESS) return r;
        w = [fn, userData]() -> CUresult {
            fn(userData);
            return CUDA_SUCCESS;
        };
        const CUDA_HOST_NODE_PARAMS host{fn, userData};
        return capture_or_run(s, hStream, w, CU_GRAPH_NODE_TYPE_HOST, &host);
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuStreamAddCallback(CUstream hStream, CUstreamCallback callback,
                                                       void* userData, unsigned int flags) {
    return entry_then([&](state& s, work& w) -> CUresult {
        if (callback == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
        if (CUresult r = check_stream(s, hStream); r != CUDA_SUCCESS) return r;
        if (capture_seq* q = capture_of(s, hStream)) {  // callbacks cannot be captured (cuLaunchHostFunc can)
            q->invalidated = true;
            return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        }
        work none;
        if (CUresult r = capture_or_run(s, hStream, none, CU_GRAPH_NODE_TYPE_EMPTY); r != CUDA_SUCCESS)
            return r;
        w = [hStream, callback, userData]() -> CUresult {
            callback(hStream, CUDA_SUCCESS, userData);
            return CUDA_SUCCESS;
        };
        return CUDA_SUCCESS;
    });
}

// --- Events: host steady_clock times.

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuEventCreate(CUevent* phEvent, unsigned int Flags) {
    return entry([&](state& s) -> CUresult {
        const unsigned known = CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
        if (phEvent == nullptr || (Flags & ~known) != 0) return CUDA_ERROR_INVALID_VALUE;
        if ((Flags & CU_EVENT_INTERPROCESS) != 0 && (Flags & CU_EVENT_DISABLE_TIMING) == 0)
            return CUDA_ERROR_INVALID_VALUE;
        context_obj* c = nullptr;
        if (CUresult r = require_context(s, c); r != CUDA_SUCCESS) return r;
        event_obj* e = s.create<event_obj>();
        e->ctx = c->handle;
        e->flags = Flags;
        *phEvent = to_handle<CUevent>(e->handle);
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuEventRecord(CUevent hEvent, CUstream hStream) {
    return entry([&](state& s) { return record_event(s, hEvent, hStream); });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuEventRecordWithFlags(CUevent hEvent, CUstream hStream,
                                                          unsigned int flags) {
    return entry([&](state& s) -> CUresult {
        if ((flags & ~static_cast<unsigned>(CU_EVENT_RECORD_EXTERNAL)) != 0) return CUDA_ERROR_INVALID_VALUE;
        return record_event(s, hEvent, hStream);
    });
}

// A context's events. Its streams are always complete, so a record marks the event recorded now and a wait
// has nothing to wait for; both are refused while a stream of the context captures, as the real driver's are.
namespace {
CUresult ctx_event(state& s, CUcontext hCtx, CUevent hEvent, bool record) {
    context_obj* c = s.find<context_obj>(hCtx);
    if (c == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
    event_obj* e = s.find<event_obj>(hEvent);
    if (e == nullptr || (record && e->ctx != c->handle)) return CUDA_ERROR_INVALID_HANDLE;
    for (auto& [id, q] : s.captures)
        if (q.ctx == c->handle) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    if (record) {
        e->capture = 0;
        e->recorded = true;
        e->when = std::chrono::steady_clock::now();
    }
    return CUDA_SUCCESS;
}
}  // namespace

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuCtxRecordEvent(CUcontext hCtx, CUevent hEvent) {
    return entry([&](state& s) { return ctx_event(s, hCtx, hEvent, true); });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuCtxWaitEvent(CUcontext hCtx, CUevent hEvent) {
    return entry([&](state& s) { return ctx_event(s, hCtx, hEvent, false); });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuEventQuery(CUevent hEvent) {
    return entry([&](state& s) -> CUresult {
        event_obj* e = s.find<event_obj>(hEvent);
        return e != nullptr ? check_event_waitable(s, *e) : CUDA_ERROR_INVALID_HANDLE;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuEventSynchronize(CUevent hEvent) {
    return entry([&](state& s) -> CUresult {
        event_obj* e = s.find<event_obj>(hEvent);
        return e != nullptr ? check_event_waitable(s, *e) : CUDA_ERROR_INVALID_HANDLE;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuEventElapsedTime_v2(float* pMilliseconds, CUevent hStart, CUevent hEnd) {
    return entry([&](state& s) { return elapsed(s, pMilliseconds, hStart, hEnd); });
}

// The CUDA 2.0 name (same signature; cuda.h maps it to _v2).
#undef cuEventElapsedTime
VCUDA_SOFT_EXPORT CUresult CUDAAPI cuEventElapsedTime(float* pMilliseconds, CUevent hStart, CUevent hEnd);
CUresult CUDAAPI cuEventElapsedTime(float* pMilliseconds, CUevent hStart, CUevent hEnd) {
    return entry([&](state& s) { return elapsed(s, pMilliseconds, hStart, hEnd); });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuEventDestroy_v2(CUevent hEvent) {
    return entry([&](state& s) -> CUresult {
        event_obj* e = s.find<event_obj>(hEvent);
        if (e == nullptr) return CUDA_ERROR_INVALID_HANDLE;
        s.erase(e->handle);
        return CUDA_SUCCESS;
    });
}

// --- Stream memory operations. Streams run their work at the call here, so a write is done at once and a
// wait polls its word (another thread may write it through host memory) for up to 10 s.

namespace {
// The _v2 entry points (the only ones here) refuse CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER.
template <class T>
CUresult stream_write(CUstream stream, CUdeviceptr addr, T value, unsigned flags) {
    return entry([&](state& s) -> CUresult {
        if (CUresult r = check_stream(s, stream); r != CUDA_SUCCESS) return r;
        if (flags != 0 || addr % sizeof(T)) return CUDA_ERROR_INVALID_VALUE;
        if (CUresult r = check_device_range(s, static_cast<uintptr_t>(addr), sizeof(T), true);
            r != CUDA_SUCCESS)
            return r;
        __atomic_store_n(reinterpret_cast<T*>(addr), value, __ATOMIC_SEQ_CST);
        return CUDA_SUCCESS;
    });
}

template <class T>
CUresult stream_wait(CUstream stream, CUdeviceptr addr, T value, unsigned flags) {
    T* word = nullptr;
    unsigned op = flags & ~unsigned(CU_STREAM_WAIT_VALUE_FLUSH);
    CUresult checked = entry([&](state& s) -> CUresult {
        if (CUresult r = check_stream(s, stream); r != CUDA_SUCCESS) return r;
        if (op > CU_STREAM_WAIT_VALUE_NOR || addr % sizeof(T)) return CUDA_ERROR_INVALID_VALUE;
        if (CUresult r = check_device_range(s, static_cast<uintptr_t>(addr), sizeof(T), false);
            r != CUDA_SUCCESS)
            return r;
        word = reinterpret_cast<T*>(addr);
        return CUDA_SUCCESS;
    });
    if (checked != CUDA_SUCCESS) return checked;
    auto met = [&] {
        T v = __atomic_load_n(word, __ATOMIC_SEQ_CST);
        switch (op) {
            case CU_STREAM_WAIT_VALUE_GEQ:
                return static_cast<std::make_signed_t<T>>(v - value) >= 0;
            case CU_STREAM_WAIT_VALUE_EQ:
                return v == value;
            case CU_STREAM_WAIT_VALUE_AND:
                return (v & value) != 0;
            default:
                return static_cast<T>(~(v | value)) != 0;
        }
    };
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!met()) {
        if (std::chrono::steady_clock::now() > until) return CUDA_ERROR_LAUNCH_TIMEOUT;
        std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    return CUDA_SUCCESS;
}
}  // namespace

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuStreamWriteValue32_v2(CUstream stream, CUdeviceptr addr,
                                                           cuuint32_t value, unsigned int flags) {
    return stream_write<cuuint32_t>(stream, addr, value, flags);
}
VCUDA_SOFT_EXPORT CUresult CUDAAPI cuStreamWriteValue64_v2(CUstream stream, CUdeviceptr addr,
                                                           cuuint64_t value, unsigned int flags) {
    return stream_write<cuuint64_t>(stream, addr, value, flags);
}
VCUDA_SOFT_EXPORT CUresult CUDAAPI cuStreamWaitValue32_v2(CUstream stream, CUdeviceptr addr, cuuint32_t value,
                                                          unsigned int flags) {
    return stream_wait<cuuint32_t>(stream, addr, value, flags);
}
VCUDA_SOFT_EXPORT CUresult CUDAAPI cuStreamWaitValue64_v2(CUstream stream, CUdeviceptr addr, cuuint64_t value,
                                                          unsigned int flags) {
    return stream_wait<cuuint64_t>(stream, addr, value, flags);
}

// A batch is its operations in order, each as the single call would enqueue it; barriers and flushes have
// nothing to order on a CPU.
VCUDA_SOFT_EXPORT CUresult CUDAAPI cuStreamBatchMemOp_v2(CUstream stream, unsigned int count,
                                                         CUstreamBatchMemOpParams* ops, unsigned int flags) {
    if (flags != 0 || (count && !ops)) return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < count; ++i) {
        const auto& o = ops[i];
        CUresult rc = CUDA_SUCCESS;
        switch (o.operation) {
            case CU_STREAM_MEM_OP_WRITE_VALUE_32:
                rc = stream_write<cuuint32_t>(stream, o.writeValue.address, o.writeValue.value,
                                              o.writeValue.flags);
                break;
            case CU_STREAM_MEM_OP_WRITE_VALUE_64:
                rc = stream_write<cuuint64_t>(stream, o.writeValue.address, o.writeValue.value64,
                                              o.writeValue.flags);
                break;
            case CU_STREAM_MEM_OP_WAIT_VALUE_32:
                rc = stream_wait<cuuint32_t>(stream, o.waitValue.address, o.waitValue.value,
                                             o.waitValue.flags);
                break;
            case CU_STREAM_MEM_OP_WAIT_VALUE_64:
                rc = stream_wait<cuuint64_t>(stream, o.waitValue.address, o.waitValue.value64,
                                             o.waitValue.flags);
                break;
            case CU_STREAM_MEM_OP_FLUSH_REMOTE_WRITES:
            case CU_STREAM_MEM_OP_BARRIER:
                break;
            default:
                rc = CUDA_ERROR_INVALID_VALUE;
        }
        if (rc != CUDA_SUCCESS) return rc;
    }
    return CUDA_SUCCESS;
}

// --- Stream attributes (kernel node ones are soft_graph.cpp's).

namespace vcuda::soft {
bool attribute_id_valid(CUlaunchAttributeID id, bool node) {
    switch (id) {
        case CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW:
        case CU_LAUNCH_ATTRIBUTE_PRIORITY:
        case CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP:
        case CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN:
            return true;
        case CU_LAUNCH_ATTRIBUTE_SYNCHRONIZATION_POLICY:
            return !node;
        case CU_LAUNCH_ATTRIBUTE_COOPERATIVE:
        case CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION:
        case CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE:
        case CU_LAUNCH_ATTRIBUTE_PREFERRED_CLUSTER_DIMENSION:
            return node;
        default:
            return false;
    }
}

CUresult check_attribute(CUlaunchAttributeID id, const CUlaunchAttributeValue& v, bool node) {
    if (!attribute_id_valid(id, node)) return CUDA_ERROR_INVALID_VALUE;
    bool ok = true;
    if (id == CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW) {
        const auto& w = v.accessPolicyWindow;
        ok = w.num_bytes <= max_access_policy_window && w.hitRatio >= 0.0f && w.hitRatio <= 1.0f &&
             w.hitProp <= CU_ACCESS_PROPERTY_PERSISTING && w.missProp <= CU_ACCESS_PROPERTY_STREAMING;
    } else if (id == CU_LAUNCH_ATTRIBUTE_SYNCHRONIZATION_POLICY) {
        ok = v.syncPolicy >= CU_SYNC_POLICY_AUTO && v.syncPolicy <= CU_SYNC_POLICY_BLOCKING_SYNC;
    } else if (id == CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN) {
        ok = v.memSyncDomain <= CU_LAUNCH_MEM_SYNC_DOMAIN_REMOTE;
    }
    return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
}  // namespace vcuda::soft

namespace {
// The stream behind `h` (the legacy and per-thread streams keep no attributes: nullptr with success).
CUresult attribute_stream(state& s, CUstream h, stream_obj*& out) {
    out = nullptr;
    if (CUresult r = check_stream(s, h); r != CUDA_SUCCESS) return r;
    if (!special_stream(h)) out = s.find<stream_obj>(h);
    return CUDA_SUCCESS;
}
}  // namespace

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuStreamSetAttribute(CUstream hStream, CUstreamAttrID attr,
                                                        const CUstreamAttrValue* value) {
    return entry([&](state& s) -> CUresult {
        if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
        stream_obj* st = nullptr;
        if (CUresult r = attribute_stream(s, hStream, st); r != CUDA_SUCCESS) return r;
        if (CUresult r = check_attribute(attr, *value, false); r != CUDA_SUCCESS) return r;
        if (st == nullptr) return CUDA_SUCCESS;
        if (attr == CU_LAUNCH_ATTRIBUTE_PRIORITY)
            st->priority = std::clamp(value->priority, greatest_stream_priority, least_stream_priority);
        else
            st->attrs[attr] = *value;
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuStreamGetAttribute(CUstream hStream, CUstreamAttrID attr,
                                                        CUstreamAttrValue* value_out) {
    return entry([&](state& s) -> CUresult {
        if (value_out == nullptr) return CUDA_ERROR_INVALID_VALUE;
        stream_obj* st = nullptr;
        if (CUresult r = attribute_stream(s, hStream, st); r != CUDA_SUCCESS) return r;
        if (!attribute_id_valid(attr, false)) return CUDA_ERROR_INVALID_VALUE;
        CUstreamAttrValue v{};
        if (attr == CU_LAUNCH_ATTRIBUTE_SYNCHRONIZATION_POLICY) v.syncPolicy = CU_SYNC_POLICY_AUTO;
        if (st != nullptr && attr == CU_LAUNCH_ATTRIBUTE_PRIORITY) v.priority = st->priority;
        if (st != nullptr)
            if (auto it = st->attrs.find(attr); it != st->attrs.end()) v = it->second;
        *value_out = v;
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuStreamCopyAttributes(CUstream dst, CUstream src) {
    return entry([&](state& s) -> CUresult {
        stream_obj *to = nullptr, *from = nullptr;
        if (CUresult r = attribute_stream(s, dst, to); r != CUDA_SUCCESS) return r;
        if (CUresult r = attribute_stream(s, src, from); r != CUDA_SUCCESS) return r;
        if (to != nullptr && from != nullptr) {
            to->attrs = from->attrs;
            to->priority = from->priority;
        }
        return CUDA_SUCCESS;
    });
}

// --- IPC events: the handle names the exporting process and its event; another process opens it as an event
// of its own (everything here is complete at once, so there is no shared state to keep). As with the real
// driver, the process that made a handle cannot open it.

namespace {
constexpr char ipc_event_magic[8] = {'s', 'o', 'f', 't', 'I', 'P', 'C', 'e'};
}  // namespace

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuIpcGetEventHandle(CUipcEventHandle* pHandle, CUevent event) {
    return entry([&](state& s) -> CUresult {
        if (pHandle == nullptr) return CUDA_ERROR_INVALID_VALUE;
        event_obj* e = s.find<event_obj>(event);
        if (e == nullptr) return CUDA_ERROR_INVALID_HANDLE;
        if ((e->flags & CU_EVENT_INTERPROCESS) == 0 || (e->flags & CU_EVENT_DISABLE_TIMING) == 0)
            return CUDA_ERROR_INVALID_HANDLE;
        std::memset(pHandle, 0, sizeof *pHandle);
        const int pid = getpid();
        std::memcpy(pHandle->reserved, ipc_event_magic, sizeof ipc_event_magic);
        std::memcpy(pHandle->reserved + 8, &pid, sizeof pid);
        std::memcpy(pHandle->reserved + 16, &e->handle, sizeof e->handle);
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuIpcOpenEventHandle(CUevent* phEvent, CUipcEventHandle handle) {
    return entry([&](state& s) -> CUresult {
        if (phEvent == nullptr || std::memcmp(handle.reserved, ipc_event_magic, sizeof ipc_event_magic) != 0)
            return CUDA_ERROR_INVALID_VALUE;
        int pid = 0;
        std::memcpy(&pid, handle.reserved + 8, sizeof pid);
        if (pid == getpid()) return CUDA_ERROR_INVALID_CONTEXT;
        context_obj* c = nullptr;
        if (CUresult r = require_context(s, c); r != CUDA_SUCCESS) return r;
        event_obj* e = s.create<event_obj>();
        e->ctx = c->handle;
        e->flags = CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
        *phEvent = to_handle<CUevent>(e->handle);
        return CUDA_SUCCESS;
    });
}
