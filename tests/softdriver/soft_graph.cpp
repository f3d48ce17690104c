// The software test driver: stream capture and graphs, emulated. A graph is a list of nodes in insertion
// order, each with the nodes it runs after; instantiating copies the nodes' work in a topological order
// (dependencies first, then insertion order) and launching runs it, like everything here, in the calling
// thread. Executable graphs keep their own copies, so kernel and child graph updates change only them. Work
// enqueued on a capturing stream (launches, copies, memsets, host functions, graph launches) becomes a node
// of the capture's graph instead of running, after the node recorded before it (a capture is one chain, a
// valid order of the real graph); cuStreamBeginCaptureToGraph captures into the application's graph after the
// nodes it names. A stream joins a capture by waiting on an event recorded in it. The call-time rules of the
// real driver that programs meet are kept: the legacy stream is off limits while a blocking stream captures
// (CUDA_ERROR_STREAM_CAPTURE_IMPLICIT), synchronizing with a capturing stream invalidates its capture,
// allocations follow the thread's capture mode, cuStreamEndCapture belongs to the thread that began (unless
// RELAXED). Node types made explicitly: kernel, memset, memcpy, child graph (cloned), empty, event record and
// wait.
#include <algorithm>
#include <cstring>
#include <map>
#include <set>
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

void destroy_graph(state& s, uint64_t h);

// A node and what it owns (a child graph's clone).
void destroy_node(state& s, uint64_t h) {
    node_obj* n = s.find<node_obj>(h);
    if (n == nullptr) return;
    uint64_t child = n->child;
    s.erase(h);
    destroy_graph(s, child);
}

void destroy_graph(state& s, uint64_t h) {
    graph_obj* g = s.find<graph_obj>(h);
    if (g == nullptr) return;
    std::vector<uint64_t> nodes = std::move(g->nodes);
    s.erase(h);
    for (uint64_t n : nodes) destroy_node(s, n);
}

// Edge data for an edge from `from` into a node of type `to`: zeroed unused bytes, no port on the receiving
// end, and anything but a full dependency only between kernel nodes.
bool valid_edge(const CUgraphEdgeData& e, const node_obj& from, CUgraphNodeType to) {
    for (unsigned char b : e.reserved)
        if (b != 0) return false;
    if (e.to_port != 0 || e.from_port > CU_GRAPH_KERNEL_NODE_PORT_LAUNCH_ORDER ||
        e.type > CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC)
        return false;
    const bool kernels = from.type == CU_GRAPH_NODE_TYPE_KERNEL && to == CU_GRAPH_NODE_TYPE_KERNEL;
    return kernels || (e.from_port == 0 && e.type == CU_GRAPH_DEPENDENCY_TYPE_DEFAULT);
}

// The dependencies of a new node of `type` in `g`: nodes of `g`, each once, with valid edge data (null:
// default).
CUresult check_deps(state& s, const graph_obj& g, const CUgraphNode* deps, const CUgraphEdgeData* edges,
                    size_t n, CUgraphNodeType type, std::vector<uint64_t>& out,
                    std::vector<CUgraphEdgeData>& out_edges) {
    if (n > 0 && deps == nullptr) return CUDA_ERROR_INVALID_VALUE;
    out.clear();
    out_edges.clear();
    for (size_t i = 0; i < n; ++i) {
        node_obj* d = s.find<node_obj>(deps[i]);
        if (d == nullptr || d->graph != g.handle) return CUDA_ERROR_INVALID_VALUE;
        if (std::find(out.begin(), out.end(), d->handle) != out.end()) return CUDA_ERROR_INVALID_VALUE;
        CUgraphEdgeData e = edges != nullptr ? edges[i] : CUgraphEdgeData{};
        if (!valid_edge(e, *d, type)) return CUDA_ERROR_INVALID_VALUE;
        out.push_back(d->handle);
        out_edges.push_back(e);
    }
    return CUDA_SUCCESS;
}

node_obj* add_node(state& s, graph_obj& g, CUgraphNodeType type, std::vector<uint64_t> deps,
                   std::vector<CUgraphEdgeData> edges, work run) {
    node_obj* n = s.create<node_obj>();
    n->graph = g.handle;
    n->type = type;
    n->deps = std::move(deps);
    n->edges = std::move(edges);
    n->run = std::move(run);
    g.nodes.push_back(n->handle);
    return n;
}

// A copy of graph `src` (nodes, edges, work; child graphs copied too) owned by node `parent`.
uint64_t clone_graph(state& s, uint64_t src, uint64_t parent) {
    graph_obj* from = s.find<graph_obj>(src);
    graph_obj* to = s.create<graph_obj>();
    to->parent = parent;
    std::map<uint64_t, uint64_t> copy_of;
    for (uint64_t h : from->nodes) {
        node_obj* n = s.find<node_obj>(h);
        copy_of[h] = add_node(s, *to, n->type, {}, n->edges, n->run)->handle;
    }
    for (uint64_t h : from->nodes) {  // dependencies may point at nodes added later (cuGraphAddDependencies)
        node_obj* n = s.find<node_obj>(h);
        node_obj* c = s.find<node_obj>(copy_of[h]);
        for (uint64_t d : n->deps) c->deps.push_back(copy_of[d]);
        if (n->child != 0) {
            uint64_t child = clone_graph(s, n->child, c->handle);
            s.find<node_obj>(copy_of[h])->child = child;
        }
    }
    return to->handle;
}

// The nodes of `g` in the order they run: each after its dependencies, otherwise in insertion order. False
// when the dependencies form a cycle (`culprit`: a node on or behind it).
bool run_order(state& s, const graph_obj& g, std::vector<node_obj*>& order, uint64_t& culprit) {
    std::vector<node_obj*> pending;
    for (uint64_t h : g.nodes) pending.push_back(s.find<node_obj>(h));
    std::set<uint64_t> done;
    while (!pending.empty()) {
        auto ready = std::find_if(pending.begin(), pending.end(), [&](const node_obj* n) {
            return std::all_of(n->deps.begin(), n->deps.end(),
                               [&](uint64_t d) { return done.count(d) != 0; });
        });
        if (ready == pending.end()) {
            culprit = pending.front()->handle;
            return false;
        }
        order.push_back(*ready);
        done.insert((*ready)->handle);
        pending.erase(ready);
    }
    return true;
}

// What an executable graph of `g` runs: copies of the nodes' work in run order, child graphs inside their
// nodes.
bool flatten(state& s, const graph_obj& g, std::vector<exec_node>& out, uint64_t& culprit) {
    std::vector<node_obj*> order;
    if (!run_order(s, g, order, culprit)) return false;
    for (node_obj* n : order) {
        exec_node e;
        e.node = n->handle;
        e.type = n->type;
        e.run = n->run;
        if (n->child != 0 && !flatten(s, *s.find<graph_obj>(n->child), e.child, culprit)) return false;
        out.push_back(std::move(e));
    }
    return true;
}

CUresult run_nodes(const std::vector<exec_node>& nodes) {
    for (const exec_node& n : nodes) {
        if (n.run)
            if (CUresult r = n.run(); r != CUDA_SUCCESS) return r;
        if (CUresult r = run_nodes(n.child); r != CUDA_SUCCESS) return r;
    }
    return CUDA_SUCCESS;
}

// True when `a` and `b` have the same nodes (types, in insertion order), the same edges and alike child
// graphs.
bool same_topology(state& s, const graph_obj& a, const graph_obj& b) {
    if (a.nodes.size() != b.nodes.size()) return false;
    auto positions = [](const graph_obj& g) {
        std::map<uint64_t, size_t> at;
        for (size_t i = 0; i < g.nodes.size(); ++i) at[g.nodes[i]] = i;
        return at;
    };
    auto at_a = positions(a), at_b = positions(b);
    for (size_t i = 0; i < a.nodes.size(); ++i) {
        const node_obj* x = s.find<node_obj>(a.nodes[i]);
        const node_obj* y = s.find<node_obj>(b.nodes[i]);
        if (x->type != y->type) return false;
        std::vector<size_t> dx, dy;
        for (uint64_t d : x->deps) dx.push_back(at_a[d]);
        for (uint64_t d : y->deps) dy.push_back(at_b[d]);
        std::sort(dx.begin(), dx.end());
        std::sort(dy.begin(), dy.end());
        if (dx != dy) return false;
        if ((x->child == 0) != (y->child == 0)) return false;
        if (x->child != 0 && !same_topology(s, *s.find<graph_obj>(x->child), *s.find<graph_obj>(y->child)))
            return false;
    }
    return true;
}

CUresult instantiate(state& s, CUgraphExec* phGraphExec, CUgraph hGraph, unsigned long long flags,
                     CUgraphNode* error_node = nullptr, CUgraphInstantiateResult* result = nullptr) {
    const unsigned long long known = CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH |
                                     CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH |
                                     CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY;
    if (phGraphExec == nullptr || (flags & ~known) != 0) return CUDA_ERROR_INVALID_VALUE;
    graph_obj* g = s.find<graph_obj>(hGraph);
    if (g == nullptr) return CUDA_ERROR_INVALID_VALUE;
    context_obj* c = nullptr;
    if (CUresult r = require_context(s, c); r != CUDA_SUCCESS) return r;
    auto nodes = std::make_shared<std::vector<exec_node>>();
    uint64_t culprit = 0;
    if (!flatten(s, *g, *nodes, culprit)) {
        if (error_node != nullptr) *error_node = to_handle<CUgraphNode>(culprit);
        if (result != nullptr) *result = CUDA_GRAPH_INSTANTIATE_INVALID_STRUCTURE;
        return CUDA_ERROR_INVALID_VALUE;
    }
    graph_exec_obj* e = s.create<graph_exec_obj>();
    e->ctx = c->handle;
    e->graph = g->handle;
    e->nodes = std::move(nodes);
    *phGraphExec = to_handle<CUgraphExec>(e->handle);
    if (result != nullptr) *result = CUDA_GRAPH_INSTANTIATE_SUCCESS;
    return CUDA_SUCCESS;
}

// Starts capture sequence on `hStream` into `g`: a new graph, or the application's (`existing`) after `deps`.
CUresult begin_capture(state& s, CUstream hStream, CUstreamCaptureMode mode, graph_obj* g, bool existing,
                       std::vector<uint64_t> deps, std::vector<CUgraphEdgeData> edges) {
    if (mode < CU_STREAM_CAPTURE_MODE_GLOBAL || mode > CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_ERROR_INVALID_VALUE;
    context_obj* c = nullptr;
    if (CUresult r = check_stream(s, hStream, &c); r != CUDA_SUCCESS) return r;
    uint64_t* slot = capture_slot(s, hStream);
    if (slot == nullptr) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;  // the legacy stream cannot capture
    if (capture_of(s, hStream) != nullptr) return CUDA_ERROR_ILLEGAL_STATE;
    if (g != nullptr && g->capture != 0 && s.captures.count(g->capture) != 0) return CUDA_ERROR_ILLEGAL_STATE;
    if (g == nullptr) g = s.create<graph_obj>();
    stream_obj* st = s.find<stream_obj>(hStream);
    capture_seq q;
    q.id = s.next_capture_id++;
    q.graph = g->handle;
    q.existing = existing;
    q.last = std::move(deps);
    q.last_edges = std::move(edges);
    q.ctx = c->handle;
    q.origin = from_handle(hStream);
    q.blocking = st == nullptr || (st->flags & CU_STREAM_NON_BLOCKING) == 0;
    q.mode = mode;
    q.thread = std::this_thread::get_id();
    g->capture = q.id;
    *slot = q.id;
    s.captures.emplace(q.id, std::move(q));
    return CUDA_SUCCESS;
}

// Up to *count of `items` (with their edge data when `edges` is given) into `out`, the rest of it NULL;
// *count becomes how many were written, or, without `out`, how many there are.
CUresult list_nodes(const std::vector<uint64_t>& items, const std::vector<CUgraphEdgeData>& item_edges,
                    CUgraphNode* out, CUgraphEdgeData* edges, size_t* count) {
    if (count == nullptr || (edges != nullptr && out == nullptr)) return CUDA_ERROR_INVALID_VALUE;
    if (out == nullptr) {
        *count = items.size();
        return CUDA_SUCCESS;
    }
    const size_t n = std::min(*count, items.size());
    for (size_t i = 0; i < *count; ++i) {
        out[i] = i < n ? to_handle<CUgraphNode>(items[i]) : nullptr;
        if (edges != nullptr) edges[i] = i < n ? item_edges[i] : CUgraphEdgeData{};
    }
    *count = n;
    return CUDA_SUCCESS;
}

bool lossy(const std::vector<CUgraphEdgeData>& edges) {
    return std::any_of(edges.begin(), edges.end(), [](const CUgraphEdgeData& e) {
        return e.from_port != 0 || e.to_port != 0 || e.type != CU_GRAPH_DEPENDENCY_TYPE_DEFAULT;
    });
}

// cuGraphAddNode*: a node of the type `p` names, its work checked and made now (kernel parameters copied).
CUresult add_node_from(state& s, CUgraphNode* phGraphNode, CUgraph hGraph, const CUgraphNode* dependencies,
                       const CUgraphEdgeData* dependencyData, size_t numDependencies,
                       const CUgraphNodeParams* p) {
    if (phGraphNode == nullptr || p == nullptr || p->reserved0[0] != 0 || p->reserved0[1] != 0 ||
        p->reserved0[2] != 0)
        return CUDA_ERROR_INVALID_VALUE;
    graph_obj* g = s.find<graph_obj>(hGraph);
    if (g == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::vector<uint64_t> deps;
    std::vector<CUgraphEdgeData> edges;
    if (CUresult r = check_deps(s, *g, dependencies, dependencyData, numDependencies, p->type, deps, edges);
        r != CUDA_SUCCESS)
        return r;
    work w;
    uint64_t child = 0;
    switch (p->type) {
        case CU_GRAPH_NODE_TYPE_KERNEL: {
            context_obj* c = nullptr;
            if (CUresult r = require_context(s, c); r != CUDA_SUCCESS) return r;
            CUDA_KERNEL_NODE_PARAMS_v2 k;
            static_assert(sizeof k == sizeof p->kernel, "the v2 and v3 kernel node layouts are the same");
            std::memcpy(&k, &p->kernel, sizeof k);
            if (CUresult r = kernel_node_work(s, k, *c, w); r != CUDA_SUCCESS) return r;
            break;
        }
        case CU_GRAPH_NODE_TYPE_MEMSET: {
            const auto& m = p->memset;
            if (CUresult r =
                    memset_node_work(s, {m.dst, m.pitch, m.value, m.elementSize, m.width, m.height}, w);
                r != CUDA_SUCCESS)
                return r;
            break;
        }
        case CU_GRAPH_NODE_TYPE_MEMCPY:
            if (p->memcpy.flags != 0 || p->memcpy.reserved != 0) return CUDA_ERROR_INVALID_VALUE;
            if (CUresult r = copy_3d_desc(s, w, &p->memcpy.copyParams); r != CUDA_SUCCESS) return r;
            break;
        case CU_GRAPH_NODE_TYPE_GRAPH:
            if (s.find<graph_obj>(p->graph.graph) == nullptr) return CUDA_ERROR_INVALID_VALUE;
            if (p->graph.ownership != CU_GRAPH_CHILD_GRAPH_OWNERSHIP_CLONE) return CUDA_ERROR_NOT_SUPPORTED;
            child = from_handle(p->graph.graph);
            break;
        case CU_GRAPH_NODE_TYPE_EMPTY:
            break;
        case CU_GRAPH_NODE_TYPE_EVENT_RECORD: {
            if (s.find<event_obj>(p->eventRecord.event) == nullptr) return CUDA_ERROR_INVALID_VALUE;
            w = [event = from_handle(p->eventRecord.event)]() {
                return entry([&](state& st) -> CUresult {
                    event_obj* e = st.find<event_obj>(event);
                    if (e == nullptr) return CUDA_ERROR_INVALID_HANDLE;
                    e->capture = 0;
                    e->recorded = true;
                    e->when = std::chrono::steady_clock::now();
                    return CUDA_SUCCESS;
                });
            };
            break;
        }
        case CU_GRAPH_NODE_TYPE_WAIT_EVENT:  // everything before it has run: nothing to wait for
            if (s.find<event_obj>(p->eventWait.event) == nullptr) return CUDA_ERROR_INVALID_VALUE;
            break;
        default:
            return CUDA_ERROR_NOT_SUPPORTED;
    }
    node_obj* n = add_node(s, *g, p->type, std::move(deps), std::move(edges), std::move(w));
    if (child != 0) {
        uint64_t node = n->handle;
        uint64_t clone = clone_graph(s, child, node);
        s.find<node_obj>(node)->child = clone;
    }
    *phGraphNode = to_handle<CUgraphNode>(n->handle);
    return CUDA_SUCCESS;
}

// The top-level node of executable graph `e` made from graph node `node` of `type`, in a copy of its list
// that the caller then puts in place (a launch under way keeps the old one).
exec_node* exec_copy_of(state& s, graph_exec_obj& e, CUgraphNode node, CUgraphNodeType type,
                        std::shared_ptr<std::vector<exec_node>>& copy) {
    node_obj* n = s.find<node_obj>(node);
    if (n == nullptr || n->graph != e.graph || n->type != type) return nullptr;
    copy = std::make_shared<std::vector<exec_node>>(*e.nodes);
    auto it =
        std::find_if(copy->begin(), copy->end(), [&](const exec_node& x) { return x.node == n->handle; });
    return it == copy->end() ? nullptr : &*it;
}

// Adds or removes edges from[i] -> to[i] of `g`.
CUresult change_edges(state& s, CUgraph hGraph, const CUgraphNode* from, const CUgraphNode* to,
                      const CUgraphEdgeData* edgeData, size_t n, bool add) {
    graph_obj* g = s.find<graph_obj>(hGraph);
    if (g == nullptr || (n > 0 && (from == nullptr || to == nullptr))) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < n; ++i) {
        node_obj* a = s.find<node_obj>(from[i]);
        node_obj* b = s.find<node_obj>(to[i]);
        if (a == nullptr || b == nullptr || a->graph != g->handle || b->graph != g->handle || a == b)
            return CUDA_ERROR_INVALID_VALUE;
        CUgraphEdgeData e = edgeData != nullptr ? edgeData[i] : CUgraphEdgeData{};
        auto it = std::find(b->deps.begin(), b->deps.end(), a->handle);
        if (add) {
            if (it != b->deps.end() || !valid_edge(e, *a, b->type)) return CUDA_ERROR_INVALID_VALUE;
            b->deps.push_back(a->handle);
            b->edges.push_back(e);
        } else {
            if (it == b->deps.end()) return CUDA_ERROR_INVALID_VALUE;
            auto at = it - b->deps.begin();
            b->deps.erase(it);
            b->edges.erase(b->edges.begin() + at);
        }
    }
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

CUresult capture_or_run(state& s, CUstream stream, work& w, CUgraphNodeType type) {
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
    if (graph_obj* g = s.find<graph_obj>(q->graph); g != nullptr && recorded) {
        if (q->last_edges.size() != q->last.size()) q->last_edges.assign(q->last.size(), CUgraphEdgeData{});
        node_obj* n = add_node(s, *g, type, q->last, q->last_edges, std::move(recorded));
        q->last = {n->handle};
        q->last_edges = {CUgraphEdgeData{}};
    }
    return CUDA_SUCCESS;
}

CUresult check_not_capturing(state& s, CUstream stream) {
    if (s.captures.empty()) return CUDA_SUCCESS;
    if (legacy_stream(stream))
        return invalidate_blocking_captures(s) ? CUDA_ERROR_STREAM_CAPTURE_IMPLICIT : CUDA_SUCCESS;
    if (capture_seq* q = capture_of(s, stream)) {
        q->invalidated = true;
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    return CUDA_SUCCESS;
}

// cuThreadExchangeStreamCaptureMode: GLOBAL refuses while this thread, or any thread in GLOBAL mode,
// captures; THREAD_LOCAL only while this thread captures; RELAXED never. Captures begun RELAXED refuse
// nothing.
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
            if (!it->second.existing) destroy_graph(s, it->second.graph);
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
    return entry([&](state& s) { return begin_capture(s, hStream, mode, nullptr, false, {}, {}); });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuStreamBeginCaptureToGraph(CUstream hStream, CUgraph hGraph,
                                                               const CUgraphNode* dependencies,
                                                               const CUgraphEdgeData* dependencyData,
                                                               size_t numDependencies,
                                                               CUstreamCaptureMode mode) {
    return entry([&](state& s) -> CUresult {
        graph_obj* g = s.find<graph_obj>(hGraph);
        if (g == nullptr) return CUDA_ERROR_INVALID_VALUE;
        std::vector<uint64_t> deps;
        std::vector<CUgraphEdgeData> edges;
        // The first node captured is not known yet: edge data is checked as for a kernel node.
        if (CUresult r = check_deps(s, *g, dependencies, dependencyData, numDependencies,
                                    CU_GRAPH_NODE_TYPE_KERNEL, deps, edges);
            r != CUDA_SUCCESS)
            return r;
        return begin_capture(s, hStream, mode, g, true, std::move(deps), std::move(edges));
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
        if (graph_obj* g = s.find<graph_obj>(done.graph)) g->capture = 0;
        if (done.invalidated) {
            if (!done.existing)
                destroy_graph(s, done.graph);  // a failed capture's own graph is the driver's to destroy
            *phGraph = nullptr;
            return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
        }
        *phGraph = to_handle<CUgraph>(done.graph);
        return CUDA_SUCCESS;
    });
}

// --- Graphs and their nodes.

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
        if (g == nullptr || g->parent != 0)
            return CUDA_ERROR_INVALID_VALUE;  // a child graph node's is the node's
        if (g->capture != 0 && s.captures.count(g->capture) != 0)
            return CUDA_ERROR_ILLEGAL_STATE;  // still capturing
        destroy_graph(s, g->handle);
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuGraphGetNodes(CUgraph hGraph, CUgraphNode* nodes, size_t* numNodes) {
    return entry([&](state& s) -> CUresult {
        graph_obj* g = s.find<graph_obj>(hGraph);
        if (g == nullptr) return CUDA_ERROR_INVALID_VALUE;
        return list_nodes(g->nodes, {}, nodes, nullptr, numNodes);
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuGraphGetRootNodes(CUgraph hGraph, CUgraphNode* rootNodes,
                                                       size_t* numRootNodes) {
    return entry([&](state& s) -> CUresult {
        graph_obj* g = s.find<graph_obj>(hGraph);
        if (g == nullptr) return CUDA_ERROR_INVALID_VALUE;
        std::vector<uint64_t> roots;
        for (uint64_t h : g->nodes)
            if (s.find<node_obj>(h)->deps.empty()) roots.push_back(h);
        return list_nodes(roots, {}, rootNodes, nullptr, numRootNodes);
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuGraphNodeGetType(CUgraphNode hNode, CUgraphNodeType* type) {
    return entry([&](state& s) -> CUresult {
        node_obj* n = s.find<node_obj>(hNode);
        if (n == nullptr || type == nullptr) return CUDA_ERROR_INVALID_VALUE;
        *type = n->type;
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuGraphNodeGetDependencies_v2(CUgraphNode hNode, CUgraphNode* dependencies,
                                                                 CUgraphEdgeData* edgeData,
                                                                 size_t* numDependencies) {
    return entry([&](state& s) -> CUresult {
        node_obj* n = s.find<node_obj>(hNode);
        if (n == nullptr) return CUDA_ERROR_INVALID_VALUE;
        if (edgeData == nullptr && lossy(n->edges)) return CUDA_ERROR_LOSSY_QUERY;
        return list_nodes(n->deps, n->edges, dependencies, edgeData, numDependencies);
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuGraphNodeGetDependentNodes_v2(CUgraphNode hNode,
                                                                   CUgraphNode* dependentNodes,
                                                                   CUgraphEdgeData* edgeData,
                                                                   size_t* numDependentNodes) {
    return entry([&](state& s) -> CUresult {
        node_obj* n = s.find<node_obj>(hNode);
        if (n == nullptr) return CUDA_ERROR_INVALID_VALUE;
        std::vector<uint64_t> dependents;
        std::vector<CUgraphEdgeData> edges;
        for (uint64_t h : s.find<graph_obj>(n->graph)->nodes) {
            node_obj* d = s.find<node_obj>(h);
            auto it = std::find(d->deps.begin(), d->deps.end(), n->handle);
            if (it == d->deps.end()) continue;
            dependents.push_back(h);
            edges.push_back(d->edges[it - d->deps.begin()]);
        }
        if (edgeData == nullptr && lossy(edges)) return CUDA_ERROR_LOSSY_QUERY;
        return list_nodes(dependents, edges, dependentNodes, edgeData, numDependentNodes);
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuGraphAddNode_v2(CUgraphNode* phGraphNode, CUgraph hGraph,
                                                     const CUgraphNode* dependencies,
                                                     const CUgraphEdgeData* dependencyData,
                                                     size_t numDependencies, CUgraphNodeParams* nodeParams) {
    return entry([&](state& s) {
        return add_node_from(s, phGraphNode, hGraph, dependencies, dependencyData, numDependencies,
                             nodeParams);
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuGraphAddDependencies_v2(CUgraph hGraph, const CUgraphNode* from,
                                                             const CUgraphNode* to,
                                                             const CUgraphEdgeData* edgeData,
                                                             size_t numDependencies) {
    return entry(
        [&](state& s) { return change_edges(s, hGraph, from, to, edgeData, numDependencies, true); });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuGraphRemoveDependencies_v2(CUgraph hGraph, const CUgraphNode* from,
                                                                const CUgraphNode* to,
                                                                const CUgraphEdgeData* edgeData,
                                                                size_t numDependencies) {
    return entry(
        [&](state& s) { return change_edges(s, hGraph, from, to, edgeData, numDependencies, false); });
}

// The node goes, and so do the edges into and out of it.
VCUDA_SOFT_EXPORT CUresult CUDAAPI cuGraphDestroyNode(CUgraphNode hNode) {
    return entry([&](state& s) -> CUresult {
        node_obj* n = s.find<node_obj>(hNode);
        if (n == nullptr) return CUDA_ERROR_INVALID_VALUE;
        graph_obj* g = s.find<graph_obj>(n->graph);
        std::erase(g->nodes, n->handle);
        for (uint64_t h : g->nodes) {
            node_obj* d = s.find<node_obj>(h);
            if (auto it = std::find(d->deps.begin(), d->deps.end(), n->handle); it != d->deps.end()) {
                d->edges.erase(d->edges.begin() + (it - d->deps.begin()));
                d->deps.erase(it);
            }
        }
        destroy_node(s, n->handle);
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuGraphKernelNodeSetParams_v2(CUgraphNode hNode,
                                                                 const CUDA_KERNEL_NODE_PARAMS* nodeParams) {
    return entry([&](state& s) -> CUresult {
        node_obj* n = s.find<node_obj>(hNode);
        if (n == nullptr || n->type != CU_GRAPH_NODE_TYPE_KERNEL || nodeParams == nullptr)
            return CUDA_ERROR_INVALID_VALUE;
        context_obj* c = nullptr;
        if (CUresult r = require_context(s, c); r != CUDA_SUCCESS) return r;
        work w;
        if (CUresult r = kernel_node_work(s, *nodeParams, *c, w); r != CUDA_SUCCESS) return r;
        n->run = std::move(w);
        return CUDA_SUCCESS;
    });
}

// Kernel node attributes: kept with the node (the host kernel ignores them; cache hints change nothing here).
VCUDA_SOFT_EXPORT CUresult CUDAAPI cuGraphKernelNodeSetAttribute(CUgraphNode hNode, CUkernelNodeAttrID attr,
                                                                 const CUkernelNodeAttrValue* value) {
    return entry([&](state& s) -> CUresult {
        node_obj* n = s.find<node_obj>(hNode);
        if (n == nullptr || n->type != CU_GRAPH_NODE_TYPE_KERNEL || value == nullptr)
            return CUDA_ERROR_INVALID_VALUE;
        if (CUresult r = check_attribute(attr, *value, true); r != CUDA_SUCCESS) return r;
        n->attrs[attr] = *value;
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuGraphKernelNodeGetAttribute(CUgraphNode hNode, CUkernelNodeAttrID attr,
                                                                 CUkernelNodeAttrValue* value_out) {
    return entry([&](state& s) -> CUresult {
        node_obj* n = s.find<node_obj>(hNode);
        if (n == nullptr || n->type != CU_GRAPH_NODE_TYPE_KERNEL || value_out == nullptr ||
            !attribute_id_valid(attr, true))
            return CUDA_ERROR_INVALID_VALUE;
        auto it = n->attrs.find(attr);
        *value_out = it != n->attrs.end() ? it->second : CUkernelNodeAttrValue{};
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuGraphKernelNodeCopyAttributes(CUgraphNode dst, CUgraphNode src) {
    return entry([&](state& s) -> CUresult {
        node_obj* to = s.find<node_obj>(dst);
        node_obj* from = s.find<node_obj>(src);
        if (to == nullptr || from == nullptr || to->type != CU_GRAPH_NODE_TYPE_KERNEL ||
            from->type != CU_GRAPH_NODE_TYPE_KERNEL)
            return CUDA_ERROR_INVALID_VALUE;
        to->attrs = from->attrs;
        return CUDA_SUCCESS;
    });
}

// --- Executable graphs.

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuGraphInstantiateWithFlags(CUgraphExec* phGraphExec, CUgraph hGraph,
                                                               unsigned long long flags) {
    return entry([&](state& s) { return instantiate(s, phGraphExec, hGraph, flags); });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuGraphInstantiateWithParams(
    CUgraphExec* phGraphExec, CUgraph hGraph, CUDA_GRAPH_INSTANTIATE_PARAMS* instantiateParams) {
    return entry([&](state& s) -> CUresult {
        if (instantiateParams == nullptr) return CUDA_ERROR_INVALID_VALUE;
        CUDA_GRAPH_INSTANTIATE_PARAMS& p = *instantiateParams;
        p.hErrNode_out = nullptr;
        p.result_out = CUDA_GRAPH_INSTANTIATE_ERROR;
        bool upload = (p.flags & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD) != 0;
        if (upload)
            if (CUresult r = check_stream(s, p.hUploadStream); r != CUDA_SUCCESS) return r;
        return instantiate(s, phGraphExec, hGraph,
                           p.flags & ~static_cast<cuuint64_t>(CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD),
                           &p.hErrNode_out, &p.result_out);
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

// The node's kernel in this executable graph only; checked in the executable graph's context.
VCUDA_SOFT_EXPORT CUresult CUDAAPI cuGraphExecKernelNodeSetParams_v2(
    CUgraphExec hGraphExec, CUgraphNode hNode, const CUDA_KERNEL_NODE_PARAMS* nodeParams) {
    return entry([&](state& s) -> CUresult {
        graph_exec_obj* e = s.find<graph_exec_obj>(hGraphExec);
        if (e == nullptr || nodeParams == nullptr) return CUDA_ERROR_INVALID_VALUE;
        std::shared_ptr<std::vector<exec_node>> copy;
        exec_node* x = exec_copy_of(s, *e, hNode, CU_GRAPH_NODE_TYPE_KERNEL, copy);
        if (x == nullptr) return CUDA_ERROR_INVALID_VALUE;
        context_obj* c = usable_context(s, e->ctx);
        if (c == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
        if (CUresult r = kernel_node_work(s, *nodeParams, *c, x->run); r != CUDA_SUCCESS) return r;
        e->nodes = std::move(copy);
        return CUDA_SUCCESS;
    });
}

// The child graph must have the topology of the one in the node; its work replaces the node's in this
// executable graph only.
VCUDA_SOFT_EXPORT CUresult CUDAAPI cuGraphExecChildGraphNodeSetParams(CUgraphExec hGraphExec,
                                                                      CUgraphNode hNode, CUgraph childGraph) {
    return entry([&](state& s) -> CUresult {
        graph_exec_obj* e = s.find<graph_exec_obj>(hGraphExec);
        graph_obj* child = s.find<graph_obj>(childGraph);
        if (e == nullptr || child == nullptr) return CUDA_ERROR_INVALID_VALUE;
        std::shared_ptr<std::vector<exec_node>> copy;
        exec_node* x = exec_copy_of(s, *e, hNode, CU_GRAPH_NODE_TYPE_GRAPH, copy);
        if (x == nullptr) return CUDA_ERROR_INVALID_VALUE;
        graph_obj* in_node = s.find<graph_obj>(s.find<node_obj>(hNode)->child);
        if (in_node == nullptr || !same_topology(s, *in_node, *child)) return CUDA_ERROR_INVALID_VALUE;
        std::vector<exec_node> nodes;
        uint64_t culprit = 0;
        if (!flatten(s, *child, nodes, culprit)) return CUDA_ERROR_INVALID_VALUE;
        x->child = std::move(nodes);
        e->nodes = std::move(copy);
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

// Runs the executable graph's nodes in order, without the lock; launched into a capturing stream, the whole
// graph is one recorded node.
VCUDA_SOFT_EXPORT CUresult CUDAAPI cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream) {
    return entry_then([&](state& s, work& w) -> CUresult {
        graph_exec_obj* e = s.find<graph_exec_obj>(hGraphExec);
        if (e == nullptr) return CUDA_ERROR_INVALID_VALUE;
        context_obj* c = nullptr;
        if (CUresult r = check_stream(s, hStream, &c); r != CUDA_SUCCESS) return r;
        if (c->handle != e->ctx) return CUDA_ERROR_INVALID_CONTEXT;
        w = [nodes = e->nodes]() { return run_nodes(*nodes); };
        return capture_or_run(s, hStream, w, CU_GRAPH_NODE_TYPE_GRAPH);
    });
}
