// The software test driver: stream capture and graphs, emulated. Work enqueued on a capturing stream (launches,
// copies, memsets, host functions, graph launches) is recorded into the capture's graph instead of running;
// instantiating copies that list and launching replays it in order, like everything here, in the calling thread.
// A stream joins a capture by waiting on an event recorded in it; the capture is then one list of work in
// call order, a valid order of the real graph. The call-time rules of the real driver that programs meet are
// kept: the legacy stream is off limits while a blocking stream captures (CUDA_ERROR_STREAM_CAPTURE_IMPLICIT),
// synchronizing with a capturing stream invalidates its capture, allocations follow the thread's capture mode,
// cuStreamEndCapture belongs to the thread that began (unless RELAXED). Graph nodes are not objects here:
// cuGraphGetNodes and cuGraphGetRootNodes answer counts only.
#include <thread>

#include "soft_state.hpp"

namespace vcuda::soft {
namespace {

// The capture of this thread's per-thread default stream (every thread has its own).
thread_local uint64_t per_thread_capture = 0;

bool legacy_stream(CUstream h) { return h == nullptr || h == CU_STREAM_LEGACY; }

// Invalidates the captures that keep the legacy stream off limits; true when there were any.
bool invalidate_blocking_captures(state& s) {
    context_obj* c = current_context(s);
    bool any = false;
    for (auto& [id, q] : s.captures) {
        if (q.blocking && c != nullptr && q.ctx == c->handle) {
            q.invalidated = true;
            any = true;
        }
    }
    return any;
}

CUresult instantiate(state& s, CUgraphExec* phGraphExec, CUgraph hGraph, unsigned long long flags) {
    const unsigned long long known = CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH |
                                     CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH |
                                     CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY;
    if (phGraphExec == nullptr || (flags & ~known) != 0) return CUDA_ERROR_INVALID_VALUE;
    graph_obj* g = s.find<graph_obj>(hGraph);
    if (g == nullptr) return CUDA_ERROR_INVALID_VALUE;
    context_obj* c = nullptr;
    if (CUresult r = require_context(s, c); r != CUDA_SUCCESS) return r;
    graph_exec_obj* e = s.create<graph_exec_obj>();
    e->ctx = c->handle;
    e->nodes = std::make_shared<const std::vector<work>>(g->nodes);
    *phGraphExec = to_handle<CUgraphExec>(e->handle);
    return CUDA_SUCCESS;
}

}  // namespace

uint64_t* capture_slot(state& s, CUstream h) {
    if (legacy_stream(h)) return nullptr;
    if (h == CU_STREAM_PER_THREAD) return &per_thread_capture;
    stream_obj* st = s.find<stream_obj>(h);
    return st != nullptr ? &st->capture : nullptr;
}

capture_seq* capture_of(state& s, CUstream h) {
    uint64_t* slot = capture_slot(s, h);
    if (slot == nullptr || *slot == 0) return nullptr;
    auto it = s.captures.find(*slot);
    if (it == s.captures.end()) {
        *slot = 0;  // that capture ended
        return nullptr;
    }
    return &it->second;
}

bool blocked_by_capture(state& s, CUstream h) {
    if (!legacy_stream(h) || s.captures.empty()) return false;
    context_obj* c = current_context(s);
    for (auto& [id, q] : s.captures)
        if (q.blocking && c != nullptr && q.ctx == c->handle) return true;
    return false;
}

CUresult capture_or_run(state& s, CUstream stream, work& w) {
    if (s.captures.empty()) return CUDA_SUCCESS;
    if (legacy_stream(stream)) {
        if (!invalidate_blocking_captures(s)) return CUDA_SUCCESS;
        w = nullptr;
        return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
    }
    capture_seq* q = capture_of(s, stream);
    if (q == nullptr) return CUDA_SUCCESS;
    work recorded = std::move(w);
    w = nullptr;
    if (q->invalidated) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    if (graph_obj* g = s.find<graph_obj>(q->graph); g != nullptr && recorded) g->nodes.push_back(std::move(recorded));
    return CUDA_SUCCESS;
}

CUresult check_not_capturing(state& s, CUstream stream) {
    if (s.captures.empty()) return CUDA_SUCCESS;
    if (legacy_stream(stream)) return invalidate_blocking_captures(s) ? CUDA_ERROR_STREAM_CAPTURE_IMPLICIT : CUDA_SUCCESS;
    if (capture_seq* q = capture_of(s, stream)) {
        q->invalidated = true;
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    return CUDA_SUCCESS;
}

// cuThreadExchangeStreamCaptureMode: GLOBAL refuses while this thread, or any thread in GLOBAL mode, captures;
// THREAD_LOCAL only while this thread captures; RELAXED never. Captures begun RELAXED refuse nothing.
CUresult check_unsafe_call(state& s) {
    const CUstreamCaptureMode mode = thread_capture_mode();
    if (s.captures.empty() || mode == CU_STREAM_CAPTURE_MODE_RELAXED) return CUDA_SUCCESS;
    const auto me = std::this_thread::get_id();
    for (auto& [id, q] : s.captures) {
        if (q.mode == CU_STREAM_CAPTURE_MODE_RELAXED) continue;
        bool mine = q.thread == me;
        if (mine || (mode == CU_STREAM_CAPTURE_MODE_GLOBAL && q.mode == CU_STREAM_CAPTURE_MODE_GLOBAL))
            return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    return CUDA_SUCCESS;
}

void end_captures_of(state& s, uint64_t ctx) {
    for (auto it = s.captures.begin(); it != s.captures.end();) {
        if (it->second.ctx == ctx) {
            s.erase(it->second.graph);
            it = s.captures.erase(it);
        } else {
            ++it;
        }
    }
}

}  // namespace vcuda::soft

using namespace vcuda::soft;

// --- Stream capture.

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode) {
    return entry([&](state& s) -> CUresult {
        if (mode < CU_STREAM_CAPTURE_MODE_GLOBAL || mode > CU_STREAM_CAPTURE_MODE_RELAXED) return CUDA_ERROR_INVALID_VALUE;
        context_obj* c = nullptr;
        if (CUresult r = check_stream(s, hStream, &c); r != CUDA_SUCCESS) return r;
        uint64_t* slot = capture_slot(s, hStream);
        if (slot == nullptr) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;  // the legacy stream cannot capture
        if (capture_of(s, hStream) != nullptr) return CUDA_ERROR_ILLEGAL_STATE;
        stream_obj* st = s.find<stream_obj>(hStream);
        graph_obj* g = s.create<graph_obj>();
        capture_seq q;
        q.id = s.next_capture_id++;
        q.graph = g->handle;
        q.ctx = c->handle;
        q.origin = from_handle(hStream);
        q.blocking = st == nullptr || (st->flags & CU_STREAM_NON_BLOCKING) == 0;
        q.mode = mode;
        q.thread = std::this_thread::get_id();
        g->capture = q.id;
        *slot = q.id;
        s.captures.emplace(q.id, q);
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuStreamEndCapture(CUstream hStream, CUgraph* phGraph) {
    return entry([&](state& s) -> CUresult {
        if (phGraph == nullptr) return CUDA_ERROR_INVALID_VALUE;
        if (CUresult r = check_stream(s, hStream); r != CUDA_SUCCESS) return r;
        capture_seq* q = capture_of(s, hStream);
        if (q == nullptr) return CUDA_ERROR_ILLEGAL_STATE;
        if (q->origin != from_handle(hStream)) {
            q->invalidated = true;
            return CUDA_ERROR_STREAM_CAPTURE_UNMATCHED;
        }
        if (q->mode != CU_STREAM_CAPTURE_MODE_RELAXED && q->thread != std::this_thread::get_id())
            return CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
        capture_seq done = *q;
        s.captures.erase(done.id);
        *capture_slot(s, hStream) = 0;
        if (done.invalidated) {
            s.erase(done.graph);  // a failed capture's graph is the driver's to destroy
            *phGraph = nullptr;
            return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
        }
        if (graph_obj* g = s.find<graph_obj>(done.graph)) g->capture = 0;
        *phGraph = to_handle<CUgraph>(done.graph);
        return CUDA_SUCCESS;
    });
}

// --- Graphs.

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuGraphCreate(CUgraph* phGraph, unsigned int flags) {
    return entry([&](state& s) -> CUresult {
        if (phGraph == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
        *phGraph = to_handle<CUgraph>(s.create<graph_obj>()->handle);
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuGraphDestroy(CUgraph hGraph) {
    return entry([&](state& s) -> CUresult {
        graph_obj* g = s.find<graph_obj>(hGraph);
        if (g == nullptr) return CUDA_ERROR_INVALID_VALUE;
        if (g->capture != 0 && s.captures.count(g->capture) != 0) return CUDA_ERROR_ILLEGAL_STATE;  // still capturing
        s.erase(g->handle);
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuGraphGetNodes(CUgraph hGraph, CUgraphNode* nodes, size_t* numNodes) {
    return entry([&](state& s) -> CUresult {
        if (numNodes == nullptr) return CUDA_ERROR_INVALID_VALUE;
        graph_obj* g = s.find<graph_obj>(hGraph);
        if (g == nullptr) return CUDA_ERROR_INVALID_VALUE;
        if (nodes != nullptr) return CUDA_ERROR_NOT_SUPPORTED;
        *numNodes = g->nodes.size();
        return CUDA_SUCCESS;
    });
}

// The captured work is one chain: one root, if any.
VCUDA_SOFT_EXPORT CUresult CUDAAPI cuGraphGetRootNodes(CUgraph hGraph, CUgraphNode* rootNodes, size_t* numRootNodes) {
    return entry([&](state& s) -> CUresult {
        if (numRootNodes == nullptr) return CUDA_ERROR_INVALID_VALUE;
        graph_obj* g = s.find<graph_obj>(hGraph);
        if (g == nullptr) return CUDA_ERROR_INVALID_VALUE;
        if (rootNodes != nullptr) return CUDA_ERROR_NOT_SUPPORTED;
        *numRootNodes = g->nodes.empty() ? 0 : 1;
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuGraphInstantiateWithFlags(CUgraphExec* phGraphExec, CUgraph hGraph,
                                                               unsigned long long flags) {
    return entry([&](state& s) { return instantiate(s, phGraphExec, hGraph, flags); });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuGraphInstantiateWithParams(CUgraphExec* phGraphExec, CUgraph hGraph,
                                                                CUDA_GRAPH_INSTANTIATE_PARAMS* instantiateParams) {
    return entry([&](state& s) -> CUresult {
        if (instantiateParams == nullptr) return CUDA_ERROR_INVALID_VALUE;
        CUDA_GRAPH_INSTANTIATE_PARAMS& p = *instantiateParams;
        p.hErrNode_out = nullptr;
        p.result_out = CUDA_GRAPH_INSTANTIATE_ERROR;
        bool upload = (p.flags & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD) != 0;
        if (upload)
            if (CUresult r = check_stream(s, p.hUploadStream); r != CUDA_SUCCESS) return r;
        CUresult r = instantiate(s, phGraphExec, hGraph, p.flags & ~static_cast<cuuint64_t>(CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD));
        if (r == CUDA_SUCCESS) p.result_out = CUDA_GRAPH_INSTANTIATE_SUCCESS;
        return r;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuGraphExecDestroy(CUgraphExec hGraphExec) {
    return entry([&](state& s) -> CUresult {
        graph_exec_obj* e = s.find<graph_exec_obj>(hGraphExec);
        if (e == nullptr) return CUDA_ERROR_INVALID_VALUE;
        s.erase(e->handle);
        return CUDA_SUCCESS;
    });
}

// Nothing to upload: the work is host code.
VCUDA_SOFT_EXPORT CUresult CUDAAPI cuGraphUpload(CUgraphExec hGraphExec, CUstream hStream) {
    return entry([&](state& s) -> CUresult {
        if (s.find<graph_exec_obj>(hGraphExec) == nullptr) return CUDA_ERROR_INVALID_VALUE;
        return check_stream(s, hStream);
    });
}

// Replays the graph's work in order, without the lock; launched into a capturing stream, the whole graph is one
// recorded piece of work.
VCUDA_SOFT_EXPORT CUresult CUDAAPI cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream) {
    return entry_then([&](state& s, work& w) -> CUresult {
        graph_exec_obj* e = s.find<graph_exec_obj>(hGraphExec);
        if (e == nullptr) return CUDA_ERROR_INVALID_VALUE;
        context_obj* c = nullptr;
        if (CUresult r = check_stream(s, hStream, &c); r != CUDA_SUCCESS) return r;
        if (c->handle != e->ctx) return CUDA_ERROR_INVALID_CONTEXT;
        w = [nodes = e->nodes]() -> CUresult {
            for (const work& n : *nodes)
                if (CUresult r = n(); r != CUDA_SUCCESS) return r;
            return CUDA_SUCCESS;
        };
        return capture_or_run(s, hStream, w);
    });
}
