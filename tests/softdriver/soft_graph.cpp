// The software test driver: stream capture and graphs, emulated. A graph is a list of nodes in insertion
// order, each with the nodes it runs after; instantiating copies the nodes' work in a topological order
// (dependencies first, then insertion order) and launching runs it, like everything here, in the calling
// thread, step by step as a GPU may: independent branches side by side (see schedule). Executable graphs keep
// their own copies, so kernel and child graph updates change only them. Work enqueued on a capturing stream
// (launches, copies, memsets, host functions, graph launches) becomes a node of the capture's graph instead
// of running, after the node recorded before it (a capture is one chain, a valid order of the real graph);
// cuStreamBeginCaptureToGraph captures into the application's graph after the nodes it names. A stream joins
// a capture by waiting on an event recorded in it. The call-time rules of the real driver that programs meet
// are kept: the legacy stream is off limits while a blocking stream captures
// (CUDA_ERROR_STREAM_CAPTURE_IMPLICIT), synchronizing with a capturing stream invalidates its capture,
// allocations follow the thread's capture mode, cuStreamEndCapture belongs to the thread that began (unless
// RELAXED), a copy node reads a pageable host source when it is made (see take_pageable_source). Node types
// made explicitly: kernel, memset, memcpy, host, child graph (cloned), empty, event record and wait, memory
// alloc and free. User objects are counted references held by graphs, their clones
// and child copies, and executable graphs; graph memory is mapped from its alloc node's creation to its
// context's end.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "soft_state.hpp"

namespace vcuda::soft {
namespace {

// A graph copy from pageable host memory reads its source before the graph's nodes run: measured on the
// H200 (driver 580), bytes that a host node just before the copy wrote did not arrive, while from pinned
// memory they did. Here the source is read when the node is made, which fails the same programs: `c` is
// pointed at the bytes taken (`out`, kept by the node's work).
CUresult take_pageable_source(state& s, CUDA_MEMCPY3D& c, std::shared_ptr<std::vector<std::byte>>& out) {
    if (c.srcMemoryType != CU_MEMORYTYPE_HOST || c.srcHost == nullptr ||
        find_range(s, reinterpret_cast<uintptr_t>(c.srcHost)) != nullptr || c.WidthInBytes == 0 ||
        c.Height == 0 || c.Depth == 0)
        return CUDA_SUCCESS;
    size_t first = 0, extent = 0, rows = 0, slices = 0;
    if (__builtin_mul_overflow(c.srcZ, c.srcHeight, &first) ||
        __builtin_add_overflow(first, c.srcY, &first) || __builtin_mul_overflow(first, c.srcPitch, &first) ||
        __builtin_add_overflow(first, c.srcXInBytes, &first) ||
        __builtin_mul_overflow(c.Height - 1, c.srcPitch, &rows) ||
        __builtin_mul_overflow(c.Depth - 1, c.srcHeight, &slices) ||
        __builtin_mul_overflow(slices, c.srcPitch, &slices) ||
        __builtin_add_overflow(rows, slices, &extent) ||
        __builtin_add_overflow(extent, c.WidthInBytes, &extent) || extent > (size_t{1} << 32))
        return CUDA_ERROR_INVALID_VALUE;
    const auto* from = static_cast<const std::byte*>(c.srcHost) + first;
    out = std::make_shared<std::vector<std::byte>>(from, from + extent);
    c.srcHost = out->data();
    c.srcXInBytes = c.srcY = c.srcZ = 0;
    return CUDA_SUCCESS;
}

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

// Drops `n` references of user object `obj`; at the last its destructor runs, on a thread of its own (the
// real driver runs them on an internal thread, never in the call that dropped the reference).
void release_user_object(state& s, uint64_t obj, unsigned n) {
    user_object_obj* u = s.find<user_object_obj>(obj);
    if (u == nullptr) return;
    u->refs -= std::min(u->refs, n);
    if (u->refs != 0) return;
    std::thread([destroy = u->destroy, ptr = u->ptr] { destroy(ptr); }).detach();
    s.erase(obj);
}

// Every reference in `from` taken once more, into `into`.
void retain_refs(state& s, const user_refs& from, user_refs& into) {
    for (auto [obj, n] : from) {
        if (user_object_obj* u = s.find<user_object_obj>(obj)) {
            u->refs += n;
            into[obj] += n;
        }
    }
}

void release_refs(state& s, user_refs& refs) {
    user_refs gone = std::move(refs);
    refs.clear();
    for (auto [obj, n] : gone) release_user_object(s, obj, n);
}

// The references of `g` and of the child graphs in its nodes, taken into `into` (instantiation).
void retain_graph_refs(state& s, const graph_obj& g, user_refs& into) {
    retain_refs(s, g.refs, into);
    for (uint64_t h : g.nodes) {
        const node_obj* n = s.find<node_obj>(h);
        if (n->child != 0) retain_graph_refs(s, *s.find<graph_obj>(n->child), into);
    }
}

// A node and what it owns (a child graph's clone).
void destroy_node(state& s, uint64_t h) {
    node_obj* n = s.find<node_obj>(h);
    if (n == nullptr) return;
    uint64_t child = n->child;
    std::vector<uint64_t> bodies = n->bodies;
    s.erase(h);
    destroy_graph(s, child);
    for (uint64_t b : bodies) destroy_graph(s, b);
}

void destroy_graph(state& s, uint64_t h) {
    graph_obj* g = s.find<graph_obj>(h);
    if (g == nullptr) return;
    std::vector<uint64_t> nodes = std::move(g->nodes);
    release_refs(s, g->refs);
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

// A copy of graph `src` (nodes, edges, work, user object references; child graphs copied too) owned by node
// `parent` (0: the application's).
uint64_t clone_graph(state& s, uint64_t src, uint64_t parent) {
    graph_obj* from = s.find<graph_obj>(src);
    graph_obj* to = s.create<graph_obj>();
    to->parent = parent;
    retain_refs(s, from->refs, to->refs);
    std::map<uint64_t, uint64_t> copy_of;
    for (uint64_t h : from->nodes) {
        node_obj* n = s.find<node_obj>(h);
        node_obj* c = add_node(s, *to, n->type, {}, n->edges, n->run);
        c->host = n->host;
        c->copy = n->copy;
        c->event = n->event;
        c->kernel = n->kernel;
        c->memset = n->memset;
        c->origin = h;
        c->cond = n->cond;
        c->cond_type = n->cond_type;
        copy_of[h] = c->handle;
    }
    for (uint64_t h : from->nodes) {  // dependencies may point at nodes added later (cuGraphAddDependencies)
        node_obj* n = s.find<node_obj>(h);
        node_obj* c = s.find<node_obj>(copy_of[h]);
        for (uint64_t d : n->deps) c->deps.push_back(copy_of[d]);
        if (n->child != 0) {
            uint64_t child = clone_graph(s, n->child, c->handle);
            s.find<node_obj>(copy_of[h])->child = child;
        }
        for (uint64_t body : std::vector<uint64_t>(n->bodies)) {
            uint64_t copy = clone_graph(s, body, copy_of[h]);
            node_obj* cn = s.find<node_obj>(copy_of[h]);
            cn->bodies.push_back(copy);
            cn->bodies_out.push_back(to_handle<CUgraph>(copy));
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
    std::map<uint64_t, size_t> at;
    for (node_obj* n : order) {
        exec_node e;
        at[n->handle] = out.size();
        for (uint64_t d : n->deps) e.deps.push_back(at.at(d));  // run_order put it before
        e.node = n->handle;
        e.type = n->type;
        e.run = n->run;
        e.copy = n->copy;
        if (n->child != 0 && !flatten(s, *s.find<graph_obj>(n->child), e.child, culprit)) return false;
        e.cond = n->cond;
        e.cond_type = n->cond_type;
        for (uint64_t body : n->bodies) {
            e.bodies.emplace_back();
            if (!flatten(s, *s.find<graph_obj>(body), e.bodies.back(), culprit)) return false;
        }
        out.push_back(std::move(e));
    }
    return true;
}

// A conditional handle's value now (0 for one that is gone).
unsigned conditional_value(uint64_t h) {
    unsigned v = 0;
    entry([&](state& s) {
        if (const conditional_obj* c = s.find<conditional_obj>(h)) v = c->value;
        return CUDA_SUCCESS;
    });
    return v;
}

CUresult run_nodes(const std::vector<exec_node>& nodes);

// A conditional node: IF runs its first body when the value is set (its second, if it has one, when not);
// WHILE runs its body for as long as the value is set, looking before each run; SWITCH runs the body the
// value names, or none.
CUresult run_conditional(const exec_node& n) {
    constexpr unsigned long max_loops = 1ul << 24;  // a loop whose condition never clears is a hung GPU
    switch (n.cond_type) {
        case CU_GRAPH_COND_TYPE_IF:
            if (conditional_value(n.cond) != 0) return run_nodes(n.bodies.at(0));
            return n.bodies.size() > 1 ? run_nodes(n.bodies[1]) : CUDA_SUCCESS;
        case CU_GRAPH_COND_TYPE_WHILE:
            for (unsigned long i = 0; conditional_value(n.cond) != 0; ++i) {
                if (i == max_loops) return CUDA_ERROR_LAUNCH_TIMEOUT;
                if (CUresult r = run_nodes(n.bodies.at(0)); r != CUDA_SUCCESS) return r;
            }
            return CUDA_SUCCESS;
        default: {
            unsigned v = conditional_value(n.cond);
            return v < n.bodies.size() ? run_nodes(n.bodies[v]) : CUDA_SUCCESS;
        }
    }
}

// The steps of `nodes` as a GPU may run them: each node (a child graph's nodes in its place) one step after
// the last of its dependencies, so that independent branches advance side by side, a child graph's nodes
// interleaved with its neighbours'. `start`: the step the list begins at; returns the step after its last.
size_t schedule(const std::vector<exec_node>& nodes, size_t start,
                std::vector<std::pair<size_t, const exec_node*>>& steps) {
    std::vector<size_t> done(nodes.size());  // the step after each node's last
    size_t end = start;
    for (size_t i = 0; i < nodes.size(); ++i) {
        size_t at = start;
        for (size_t d : nodes[i].deps) at = std::max(at, done[d]);
        if (!nodes[i].child.empty()) {
            done[i] = schedule(nodes[i].child, at, steps);
        } else {
            steps.emplace_back(at, &nodes[i]);
            done[i] = at + 1;
        }
        end = std::max(end, done[i]);
    }
    return end;
}

CUresult run_nodes(const std::vector<exec_node>& nodes) {
    std::vector<std::pair<size_t, const exec_node*>> steps;
    schedule(nodes, 0, steps);
    std::stable_sort(steps.begin(), steps.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    for (const auto& [step, n] : steps) {
        if (!n->enabled) continue;
        if (n->run)
            if (CUresult r = n->run(); r != CUDA_SUCCESS) return r;
        if (n->cond != 0)
            if (CUresult r = run_conditional(*n); r != CUDA_SUCCESS) return r;
    }
    return CUDA_SUCCESS;
}

// The conditional handles the nodes of `g` use, child graphs and bodies included.
void conditionals_of(state& s, const graph_obj& g, std::vector<uint64_t>& out) {
    for (uint64_t h : g.nodes) {
        const node_obj* n = s.find<node_obj>(h);
        if (n->cond != 0 && std::find(out.begin(), out.end(), n->cond) == out.end()) out.push_back(n->cond);
        if (n->child != 0) conditionals_of(s, *s.find<graph_obj>(n->child), out);
        for (uint64_t b : n->bodies) conditionals_of(s, *s.find<graph_obj>(b), out);
    }
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

// The topology of `g` as numbers, for cuGraphExecUpdate: its node count, then per node in insertion order its
// type, its dependencies' positions, and 1 and its child graph's shape, or 0.
void shape_of(state& s, const graph_obj& g, std::vector<uint64_t>& out) {
    std::map<uint64_t, uint64_t> at;
    for (size_t i = 0; i < g.nodes.size(); ++i) at[g.nodes[i]] = i;
    out.push_back(g.nodes.size());
    for (uint64_t h : g.nodes) {
        const node_obj* n = s.find<node_obj>(h);
        out.push_back(static_cast<uint64_t>(n->type));
        std::vector<uint64_t> deps;
        for (uint64_t d : n->deps) deps.push_back(at[d]);
        std::sort(deps.begin(), deps.end());
        out.push_back(deps.size());
        out.insert(out.end(), deps.begin(), deps.end());
        out.push_back(n->child != 0 ? 1 : 0);
        if (n->child != 0) shape_of(s, *s.find<graph_obj>(n->child), out);
        out.push_back(n->bodies.size());
        for (uint64_t b : n->bodies) shape_of(s, *s.find<graph_obj>(b), out);
    }
}

// The first memcpy node whose update the driver refuses: a copy that is not 1D may not change at all
// (cuGraphExecMemcpyNodeSetParams: "the memory operands ... must be 1-dimensional"; on the H200 a 2D copy
// staged through a new host buffer answered CU_GRAPH_EXEC_UPDATE_ERROR_PARAMETERS_CHANGED). 0: none.
uint64_t refused_copy_change(const std::vector<exec_node>& now, const std::vector<exec_node>& next) {
    for (size_t i = 0; i < now.size() && i < next.size(); ++i) {
        const auto &a = now[i].copy, &b = next[i].copy;
        if (a && b && std::memcmp(&*a, &*b, sizeof *a) != 0 &&
            (a->Height > 1 || a->Depth > 1 || b->Height > 1 || b->Depth > 1))
            return next[i].node;
        if (uint64_t n = refused_copy_change(now[i].child, next[i].child)) return n;
    }
    return 0;
}

// After an update, the executable graph's nodes still answer to the nodes of the graph it was instantiated
// from: same topology, so the same positions in run order.
void keep_node_ids(std::vector<exec_node>& to, const std::vector<exec_node>& from) {
    for (size_t i = 0; i < to.size() && i < from.size(); ++i) {
        to[i].node = from[i].node;
        keep_node_ids(to[i].child, from[i].child);
    }
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
    e->flags = flags;
    e->nodes = std::move(nodes);
    shape_of(s, *g, e->shape);
    retain_graph_refs(s, *g, e->refs);
    conditionals_of(s, *g, e->conds);
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

// True when graph `g` is `ancestor` or lies inside it (a child graph's or a conditional body's, at any
// depth).
bool graph_within(state& s, uint64_t g, uint64_t ancestor) {
    while (g != 0) {
        if (g == ancestor) return true;
        const graph_obj* x = s.find<graph_obj>(g);
        const node_obj* parent = x != nullptr ? s.find<node_obj>(x->parent) : nullptr;
        g = parent != nullptr ? parent->graph : 0;
    }
    return false;
}

// The work of a memset, memcpy, event record, event wait or host node of parameters `p`: the node types whose
// parameters cuGraphNodeSetParams and cuGraphExecNodeSetParams change here. A host node's function and a
// memcpy node's copy are kept with it (`host`, `copy`).
CUresult settable_node_work(state& s, const CUgraphNodeParams* p, work& w, CUDA_HOST_NODE_PARAMS& host,
                            std::optional<CUDA_MEMCPY3D>& copy) {
    switch (p->type) {
        case CU_GRAPH_NODE_TYPE_MEMSET: {
            const auto& m = p->memset;
            if (CUresult r =
                    memset_node_work(s, {m.dst, m.pitch, m.value, m.elementSize, m.width, m.height}, w, true);
                r != CUDA_SUCCESS)
                return r;
            break;
        }
        case CU_GRAPH_NODE_TYPE_MEMCPY: {
            if (p->memcpy.flags != 0 || p->memcpy.reserved != 0) return CUDA_ERROR_INVALID_VALUE;
            CUDA_MEMCPY3D c = p->memcpy.copyParams;
            std::shared_ptr<std::vector<std::byte>> taken;
            if (CUresult r = take_pageable_source(s, c, taken); r != CUDA_SUCCESS) return r;
            if (CUresult r = copy_3d_desc(s, w, &c); r != CUDA_SUCCESS) return r;
            if (taken) w = [run = std::move(w), taken] { return run(); };
            copy = p->memcpy.copyParams;
            break;
        }
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
        case CU_GRAPH_NODE_TYPE_HOST:
            if (p->host.fn == nullptr) return CUDA_ERROR_INVALID_VALUE;
            host = {p->host.fn, p->host.userData};
            w = [host]() -> CUresult {
                host.fn(host.userData);
                return CUDA_SUCCESS;
            };
            break;
        default:
            return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

// The parameters of a memset node of parameters `p` (none for other nodes).
std::optional<CUDA_MEMSET_NODE_PARAMS> memset_of(const CUgraphNodeParams* p) {
    if (p->type != CU_GRAPH_NODE_TYPE_MEMSET) return std::nullopt;
    const auto& m = p->memset;
    return CUDA_MEMSET_NODE_PARAMS{m.dst, m.pitch, m.value, m.elementSize, m.width, m.height};
}

// The event an event record or wait node of parameters `p` names (0 for other nodes).
uint64_t event_of(const CUgraphNodeParams* p) {
    if (p->type == CU_GRAPH_NODE_TYPE_EVENT_RECORD) return from_handle(p->eventRecord.event);
    if (p->type == CU_GRAPH_NODE_TYPE_WAIT_EVENT) return from_handle(p->eventWait.event);
    return 0;
}

// cuGraphAddNode*: a node of the type `p` names, its work checked and made now (kernel parameters copied; a
// memory alloc node's memory mapped, its address written into `p`).
CUresult add_node_from(state& s, CUgraphNode* phGraphNode, CUgraph hGraph, const CUgraphNode* dependencies,
                       const CUgraphEdgeData* dependencyData, size_t numDependencies, CUgraphNodeParams* p) {
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
    uint64_t child = 0, moved = 0;  // a child graph cloned into the node, or moved into it
    CUDA_HOST_NODE_PARAMS host{};
    std::optional<CUDA_MEMCPY3D> copy;
    std::shared_ptr<const kernel_node_params> kernel;
    switch (p->type) {
        case CU_GRAPH_NODE_TYPE_KERNEL: {
            context_obj* c = nullptr;
            if (CUresult r = require_context(s, c); r != CUDA_SUCCESS) return r;
            CUDA_KERNEL_NODE_PARAMS_v2 k;
            static_assert(sizeof k == sizeof p->kernel, "the v2 and v3 kernel node layouts are the same");
            std::memcpy(&k, &p->kernel, sizeof k);
            if (CUresult r = kernel_node_work(s, k, *c, w); r != CUDA_SUCCESS) return r;
            kernel = keep_kernel_params(s, k);
            break;
        }
        case CU_GRAPH_NODE_TYPE_MEMSET:
        case CU_GRAPH_NODE_TYPE_MEMCPY:
        case CU_GRAPH_NODE_TYPE_EVENT_RECORD:
        case CU_GRAPH_NODE_TYPE_WAIT_EVENT:
        case CU_GRAPH_NODE_TYPE_HOST:
            // A memset node added without its context is refused, as the H200's driver (580, CUDA 13.0) does.
            if (p->type == CU_GRAPH_NODE_TYPE_MEMSET && p->memset.ctx == nullptr)
                return CUDA_ERROR_INVALID_VALUE;
            if (CUresult r = settable_node_work(s, p, w, host, copy); r != CUDA_SUCCESS) return r;
            break;
        case CU_GRAPH_NODE_TYPE_GRAPH: {
            const graph_obj* c = s.find<graph_obj>(p->graph.graph);
            if (c == nullptr) return CUDA_ERROR_INVALID_VALUE;
            if (p->graph.ownership == CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE) {
                // Moved: a graph of the application's (not a node's already, not capturing), not g itself
                // nor one holding it.
                if (c->parent != 0 || (c->capture != 0 && s.captures.count(c->capture) != 0) ||
                    graph_within(s, g->handle, c->handle))
                    return CUDA_ERROR_INVALID_VALUE;
                moved = c->handle;
            } else if (p->graph.ownership != CU_GRAPH_CHILD_GRAPH_OWNERSHIP_CLONE) {
                return CUDA_ERROR_INVALID_VALUE;
            } else {
                child = c->handle;
            }
            break;
        }
        case CU_GRAPH_NODE_TYPE_EMPTY:
            break;
        case CU_GRAPH_NODE_TYPE_MEM_ALLOC: {
            const auto& a = p->alloc;
            context_obj* c = nullptr;
            if (CUresult r = require_context(s, c); r != CUDA_SUCCESS) return r;
            if (a.bytesize == 0 || a.poolProps.allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
                a.poolProps.handleTypes != CU_MEM_HANDLE_TYPE_NONE ||
                a.poolProps.location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
                a.poolProps.location.id != c->device)
                return CUDA_ERROR_INVALID_VALUE;
            CUdeviceptr dptr = 0;
            if (CUresult r = graph_alloc(s, *c, a.bytesize, &dptr); r != CUDA_SUCCESS) return r;
            p->alloc.dptr = dptr;
            break;
        }
        case CU_GRAPH_NODE_TYPE_MEM_FREE: {
            auto it = s.ranges.find(static_cast<uintptr_t>(p->free.dptr));
            if (it == s.ranges.end() || !it->second.graph) return CUDA_ERROR_INVALID_VALUE;
            break;
        }
        case CU_GRAPH_NODE_TYPE_CONDITIONAL: {
            const auto& cp = p->conditional;
            const conditional_obj* c = s.find<conditional_obj>(cp.handle);
            if (c == nullptr || !graph_within(s, g->handle, c->graph)) return CUDA_ERROR_INVALID_VALUE;
            const bool sized = cp.type == CU_GRAPH_COND_TYPE_IF       ? cp.size == 1 || cp.size == 2
                               : cp.type == CU_GRAPH_COND_TYPE_WHILE  ? cp.size == 1
                               : cp.type == CU_GRAPH_COND_TYPE_SWITCH ? cp.size >= 1 && cp.size <= 1024
                                                                      : false;
            if (!sized) return CUDA_ERROR_INVALID_VALUE;
            break;
        }
        default:
            return CUDA_ERROR_NOT_SUPPORTED;
    }
    node_obj* n = add_node(s, *g, p->type, std::move(deps), std::move(edges), std::move(w));
    n->host = host;
    n->copy = copy;
    n->event = event_of(p);
    n->kernel = kernel;
    if (kernel != nullptr) n->name = kernel_name(s, kernel->p);
    n->memset = memset_of(p);
    if (p->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC)
        keep_alloc_params(*n, p->alloc.poolProps, p->alloc.accessDescs, p->alloc.accessDescCount,
                          p->alloc.bytesize, p->alloc.dptr);
    if (p->type == CU_GRAPH_NODE_TYPE_MEM_FREE) n->freed = p->free.dptr;
    if (p->type == CU_GRAPH_NODE_TYPE_CONDITIONAL) {  // its bodies: empty graphs of its own
        n->cond = p->conditional.handle;
        n->cond_type = p->conditional.type;
        const uint64_t node = n->handle;
        for (unsigned i = 0; i < p->conditional.size; ++i) {
            graph_obj* body = s.create<graph_obj>();
            body->parent = node;
            node_obj* owner = s.find<node_obj>(node);
            owner->bodies.push_back(body->handle);
            owner->bodies_out.push_back(to_handle<CUgraph>(body->handle));
        }
        n = s.find<node_obj>(node);
        p->conditional.phGraph_out = n->bodies_out.data();
    }
    if (child != 0) {
        uint64_t node = n->handle;
        uint64_t clone = clone_graph(s, child, node);
        s.find<node_obj>(node)->child = clone;
    }
    if (moved != 0) {
        n->child = moved;
        s.find<graph_obj>(moved)->parent = n->handle;
    }
    *phGraphNode = to_handle<CUgraphNode>(n->handle);
    return CUDA_SUCCESS;
}

// The top-level node of executable graph `e` made from graph node `node` of `type`, in a copy of its list
// that the caller then puts in place (a launch under way keeps the old one).
// The node of `nodes` (or of a child graph's or conditional body's in them) made from graph node `h`.
exec_node* find_exec_node(std::vector<exec_node>& nodes, uint64_t h) {
    for (auto& x : nodes) {
        if (x.node == h) return &x;
        if (exec_node* in = find_exec_node(x.child, h)) return in;
        for (auto& body : x.bodies)
            if (exec_node* in = find_exec_node(body, h)) return in;
    }
    return nullptr;
}

// The node of executable graph `e` made from graph node `node` of `type` (a node of its graph, or of a graph
// inside it: a moved child graph's, a conditional body's), in a copy of its list that the caller then puts in
// place (a launch under way keeps the old one).
exec_node* exec_copy_of(state& s, graph_exec_obj& e, CUgraphNode node, CUgraphNodeType type,
                        std::shared_ptr<std::vector<exec_node>>& copy) {
    node_obj* n = s.find<node_obj>(node);
    if (n == nullptr || !graph_within(s, n->graph, e.graph) || n->type != type) return nullptr;
    copy = std::make_shared<std::vector<exec_node>>(*e.nodes);
    return find_exec_node(*copy, n->handle);
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

CUresult capture_or_run(state& s, CUstream stream, work& w, CUgraphNodeType type,
                        const CUDA_HOST_NODE_PARAMS* host, std::string_view name) {
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
        if (host != nullptr) n->host = *host;
        n->name = name;
        q->last = {n->handle};
        q->last_edges = {CUgraphEdgeData{}};
    }
    return CUDA_SUCCESS;
}

node_obj* last_captured(state& s, CUstream stream) {
    capture_seq* q = capture_of(s, stream);
    return q != nullptr && q->last.size() == 1 ? s.find<node_obj>(q->last[0]) : nullptr;
}

void keep_alloc_params(node_obj& n, const CUmemPoolProps& props, const CUmemAccessDesc* access, size_t count,
                       size_t bytes, CUdeviceptr dptr) {
    n.access.assign(access, access + (access != nullptr ? count : 0));
    n.alloc = {};
    n.alloc.poolProps = props;
    n.alloc.accessDescs = n.access.empty() ? nullptr : n.access.data();
    n.alloc.accessDescCount = n.access.size();
    n.alloc.bytesize = bytes;
    n.alloc.dptr = dptr;
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

void destroy_graph_exec(state& s, uint64_t h) {
    graph_exec_obj* e = s.find<graph_exec_obj>(h);
    if (e == nullptr) return;
    release_refs(s, e->refs);
    s.erase(h);
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

// Every edge of the graph: each node's dependencies, in the order of the graph's nodes.
VCUDA_SOFT_EXPORT CUresult CUDAAPI cuGraphGetEdges_v2(CUgraph hGraph, CUgraphNode* from, CUgraphNode* to,
                                                      CUgraphEdgeData* edgeData, size_t* numEdges) {
    if (numEdges == nullptr || (from == nullptr) != (to == nullptr) ||
        (edgeData != nullptr && from == nullptr))
        return CUDA_ERROR_INVALID_VALUE;
    return entry([&](state& s) -> CUresult {
        graph_obj* g = s.find<graph_obj>(hGraph);
        if (g == nullptr) return CUDA_ERROR_INVALID_VALUE;
        std::vector<std::pair<uint64_t, uint64_t>> pairs;
        std::vector<CUgraphEdgeData> data;
        for (uint64_t h : g->nodes) {
            const node_obj* n = s.find<node_obj>(h);
            for (size_t i = 0; i < n->deps.size(); ++i) {
                pairs.emplace_back(n->deps[i], h);
                data.push_back(i < n->edges.size() ? n->edges[i] : CUgraphEdgeData{});
            }
        }
        if (from == nullptr) {
            *numEdges = pairs.size();
            return CUDA_SUCCESS;
        }
        const size_t n = std::min(*numEdges, pairs.size());
        data.resize(n);
        if (edgeData == nullptr && lossy(data)) return CUDA_ERROR_LOSSY_QUERY;
        for (size_t i = 0; i < *numEdges; ++i) {
            from[i] = i < n ? to_handle<CUgraphNode>(pairs[i].first) : nullptr;
            to[i] = i < n ? to_handle<CUgraphNode>(pairs[i].second) : nullptr;
            if (edgeData != nullptr) edgeData[i] = i < n ? data[i] : CUgraphEdgeData{};
        }
        *numEdges = n;
        return CUDA_SUCCESS;
    });
}

// A DOT description of the graph: a node per graph node (its type, and a kernel node's kernel), an edge per
// dependency; VERBOSE adds each node's handle and dependency count.
VCUDA_SOFT_EXPORT CUresult CUDAAPI cuGraphDebugDotPrint(CUgraph hGraph, const char* path,
                                                        unsigned int flags) {
    if (path == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::string text;
    CUresult rc = entry([&](state& s) -> CUresult {
        graph_obj* g = s.find<graph_obj>(hGraph);
        if (g == nullptr) return CUDA_ERROR_INVALID_VALUE;
        text = "digraph dot {\n";
        for (uint64_t h : g->nodes) {
            const node_obj* n = s.find<node_obj>(h);
            text += "  \"n" + std::to_string(h) + "\" [label=\"type " + std::to_string(n->type);
            if (!n->name.empty()) text += "\\n" + n->name;
            if (flags & CU_GRAPH_DEBUG_DOT_FLAGS_VERBOSE)
                text += "\\nhandle " + std::to_string(h) + ", " + std::to_string(n->deps.size()) +
                        " dependencies";
            text += "\"];\n";
            for (uint64_t dep : n->deps)
                text += "  \"n" + std::to_string(dep) + "\" -> \"n" + std::to_string(h) + "\";\n";
        }
        text += "}\n";
        return CUDA_SUCCESS;
    });
    if (rc != CUDA_SUCCESS) return rc;
    FILE* f = std::fopen(path, "w");
    if (f == nullptr) return CUDA_ERROR_OPERATING_SYSTEM;
    const bool written = std::fwrite(text.data(), 1, text.size(), f) == text.size();
    return std::fclose(f) == 0 && written ? CUDA_SUCCESS : CUDA_ERROR_OPERATING_SYSTEM;
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
        n->kernel = keep_kernel_params(s, *nodeParams);
        return CUDA_SUCCESS;
    });
}

// New parameters of a kernel, memset, memcpy, event or host node (the node's own type): on the node, and so
// in executable graphs made from it later.
VCUDA_SOFT_EXPORT CUresult CUDAAPI cuGraphNodeSetParams(CUgraphNode hNode, CUgraphNodeParams* nodeParams) {
    if (nodeParams != nullptr && nodeParams->type == CU_GRAPH_NODE_TYPE_KERNEL) {
        CUDA_KERNEL_NODE_PARAMS k;
        std::memcpy(&k, &nodeParams->kernel, sizeof k);
        return cuGraphKernelNodeSetParams_v2(hNode, &k);
    }
    return entry([&](state& s) -> CUresult {
        node_obj* n = s.find<node_obj>(hNode);
        if (n == nullptr || nodeParams == nullptr || n->type != nodeParams->type)
            return CUDA_ERROR_INVALID_VALUE;
        work w;
        CUDA_HOST_NODE_PARAMS host{};
        std::optional<CUDA_MEMCPY3D> copy;
        if (CUresult r = settable_node_work(s, nodeParams, w, host, copy); r != CUDA_SUCCESS) return r;
        n->run = std::move(w);
        n->host = host;
        n->copy = copy;
        n->event = event_of(nodeParams);
        n->memset = memset_of(nodeParams);
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
        destroy_graph_exec(s, e->handle);
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

// The same for the node's copy in executable graph `hGraphExec` only (child graph nodes: as
// cuGraphExecChildGraphNodeSetParams).
VCUDA_SOFT_EXPORT CUresult CUDAAPI cuGraphExecNodeSetParams(CUgraphExec hGraphExec, CUgraphNode hNode,
                                                            CUgraphNodeParams* nodeParams) {
    if (nodeParams != nullptr && nodeParams->type == CU_GRAPH_NODE_TYPE_KERNEL) {
        CUDA_KERNEL_NODE_PARAMS k;
        std::memcpy(&k, &nodeParams->kernel, sizeof k);
        return cuGraphExecKernelNodeSetParams_v2(hGraphExec, hNode, &k);
    }
    if (nodeParams != nullptr && nodeParams->type == CU_GRAPH_NODE_TYPE_GRAPH)
        return cuGraphExecChildGraphNodeSetParams(hGraphExec, hNode, nodeParams->graph.graph);
    return entry([&](state& s) -> CUresult {
        graph_exec_obj* e = s.find<graph_exec_obj>(hGraphExec);
        if (e == nullptr || nodeParams == nullptr) return CUDA_ERROR_INVALID_VALUE;
        std::shared_ptr<std::vector<exec_node>> copy;
        exec_node* x = exec_copy_of(s, *e, hNode, nodeParams->type, copy);
        if (x == nullptr) return CUDA_ERROR_INVALID_VALUE;
        work w;
        CUDA_HOST_NODE_PARAMS host{};
        std::optional<CUDA_MEMCPY3D> cp;
        if (CUresult r = settable_node_work(s, nodeParams, w, host, cp); r != CUDA_SUCCESS) return r;
        x->run = std::move(w);
        x->copy = cp;
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
        // The new child's references join the executable graph's (the old child's stay until it is destroyed:
        // more than the real driver keeps, never less).
        retain_graph_refs(s, *child, e->refs);
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
        w = [nodes = e->nodes, conds = e->conds]() {
            entry([&](state& st) {  // each launch starts from the handles' defaults where they ask for it
                for (uint64_t h : conds)
                    if (conditional_obj* c = st.find<conditional_obj>(h); c != nullptr && c->assign_default)
                        c->value = c->default_value;
                return CUDA_SUCCESS;
            });
            return run_nodes(*nodes);
        };
        return capture_or_run(s, hStream, w, CU_GRAPH_NODE_TYPE_GRAPH);
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuGraphClone(CUgraph* phGraphClone, CUgraph originalGraph) {
    return entry([&](state& s) -> CUresult {
        if (phGraphClone == nullptr || s.find<graph_obj>(originalGraph) == nullptr)
            return CUDA_ERROR_INVALID_VALUE;
        *phGraphClone = to_handle<CUgraph>(clone_graph(s, from_handle(originalGraph), 0));
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuGraphHostNodeGetParams(CUgraphNode hNode,
                                                            CUDA_HOST_NODE_PARAMS* nodeParams) {
    return entry([&](state& s) -> CUresult {
        node_obj* n = s.find<node_obj>(hNode);
        if (n == nullptr || n->type != CU_GRAPH_NODE_TYPE_HOST || nodeParams == nullptr)
            return CUDA_ERROR_INVALID_VALUE;
        *nodeParams = n->host;
        return CUDA_SUCCESS;
    });
}

// A memset node's parameters, for nodes made or set by cuGraph* calls (captured ones keep none here).
VCUDA_SOFT_EXPORT CUresult CUDAAPI cuGraphMemsetNodeGetParams(CUgraphNode hNode,
                                                              CUDA_MEMSET_NODE_PARAMS* nodeParams) {
    return entry([&](state& s) -> CUresult {
        node_obj* n = s.find<node_obj>(hNode);
        if (n == nullptr || n->type != CU_GRAPH_NODE_TYPE_MEMSET || nodeParams == nullptr || !n->memset)
            return CUDA_ERROR_INVALID_VALUE;
        *nodeParams = *n->memset;
        return CUDA_SUCCESS;
    });
}

// A memory alloc node's parameters, and a free node's address (made by cuGraph* calls or captured).
VCUDA_SOFT_EXPORT CUresult CUDAAPI cuGraphMemAllocNodeGetParams(CUgraphNode hNode,
                                                                CUDA_MEM_ALLOC_NODE_PARAMS* params_out) {
    return entry([&](state& s) -> CUresult {
        node_obj* n = s.find<node_obj>(hNode);
        if (n == nullptr || n->type != CU_GRAPH_NODE_TYPE_MEM_ALLOC || params_out == nullptr)
            return CUDA_ERROR_INVALID_VALUE;
        *params_out = n->alloc;
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuGraphMemFreeNodeGetParams(CUgraphNode hNode, CUdeviceptr* dptr_out) {
    return entry([&](state& s) -> CUresult {
        node_obj* n = s.find<node_obj>(hNode);
        if (n == nullptr || n->type != CU_GRAPH_NODE_TYPE_MEM_FREE || dptr_out == nullptr)
            return CUDA_ERROR_INVALID_VALUE;
        *dptr_out = n->freed;
        return CUDA_SUCCESS;
    });
}

// A memcpy node's copy, for nodes made or set by cuGraph* calls (captured ones keep none here).
VCUDA_SOFT_EXPORT CUresult CUDAAPI cuGraphMemcpyNodeGetParams(CUgraphNode hNode, CUDA_MEMCPY3D* nodeParams) {
    return entry([&](state& s) -> CUresult {
        node_obj* n = s.find<node_obj>(hNode);
        if (n == nullptr || n->type != CU_GRAPH_NODE_TYPE_MEMCPY || nodeParams == nullptr || !n->copy)
            return CUDA_ERROR_INVALID_VALUE;
        *nodeParams = *n->copy;
        return CUDA_SUCCESS;
    });
}

// The copy of `hOriginalNode` among the nodes of `hClonedGraph` (a clone of its graph).
VCUDA_SOFT_EXPORT CUresult CUDAAPI cuGraphNodeFindInClone(CUgraphNode* phNode, CUgraphNode hOriginalNode,
                                                          CUgraph hClonedGraph) {
    return entry([&](state& s) -> CUresult {
        const graph_obj* g = s.find<graph_obj>(hClonedGraph);
        if (phNode == nullptr || g == nullptr || s.find<node_obj>(hOriginalNode) == nullptr)
            return CUDA_ERROR_INVALID_VALUE;
        for (uint64_t h : g->nodes)
            if (s.find<node_obj>(h)->origin == from_handle(hOriginalNode)) {
                *phNode = to_handle<CUgraphNode>(h);
                return CUDA_SUCCESS;
            }
        return CUDA_ERROR_INVALID_VALUE;
    });
}

// A kernel node's parameters (captured ones too), in the form most recently set: kernelParams or `extra`.
VCUDA_SOFT_EXPORT CUresult CUDAAPI cuGraphKernelNodeGetParams_v2(CUgraphNode hNode,
                                                                 CUDA_KERNEL_NODE_PARAMS* nodeParams) {
    return entry([&](state& s) -> CUresult {
        node_obj* n = s.find<node_obj>(hNode);
        if (n == nullptr || n->type != CU_GRAPH_NODE_TYPE_KERNEL || nodeParams == nullptr || !n->kernel)
            return CUDA_ERROR_INVALID_VALUE;
        *nodeParams = n->kernel->p;
        return CUDA_SUCCESS;
    });
}

// The event of an event record or event wait node added by cuGraphAddNode (captured ones keep none here).
CUresult node_event(CUgraphNode hNode, CUgraphNodeType type, CUevent* out) {
    return entry([&](state& s) -> CUresult {
        node_obj* n = s.find<node_obj>(hNode);
        if (n == nullptr || n->type != type || out == nullptr || n->event == 0)
            return CUDA_ERROR_INVALID_VALUE;
        *out = to_handle<CUevent>(n->event);
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuGraphEventRecordNodeGetEvent(CUgraphNode hNode, CUevent* event_out) {
    return node_event(hNode, CU_GRAPH_NODE_TYPE_EVENT_RECORD, event_out);
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuGraphEventWaitNodeGetEvent(CUgraphNode hNode, CUevent* event_out) {
    return node_event(hNode, CU_GRAPH_NODE_TYPE_WAIT_EVENT, event_out);
}

// Whether the copy of top-level node `hNode` in an executable graph runs at its launches (kernel, memset and
// memcpy nodes may be switched off, as the driver allows).
VCUDA_SOFT_EXPORT CUresult CUDAAPI cuGraphNodeSetEnabled(CUgraphExec hGraphExec, CUgraphNode hNode,
                                                         unsigned int isEnabled) {
    return entry([&](state& s) -> CUresult {
        graph_exec_obj* e = s.find<graph_exec_obj>(hGraphExec);
        if (e == nullptr) return CUDA_ERROR_INVALID_VALUE;
        auto copy = std::make_shared<std::vector<exec_node>>(*e->nodes);
        for (exec_node& x : *copy)
            if (x.node == from_handle(hNode)) {
                if (x.type != CU_GRAPH_NODE_TYPE_KERNEL && x.type != CU_GRAPH_NODE_TYPE_MEMSET &&
                    x.type != CU_GRAPH_NODE_TYPE_MEMCPY)
                    return CUDA_ERROR_INVALID_VALUE;
                x.enabled = isEnabled != 0;
                e->nodes = std::move(copy);
                return CUDA_SUCCESS;
            }
        return CUDA_ERROR_INVALID_VALUE;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuGraphNodeGetEnabled(CUgraphExec hGraphExec, CUgraphNode hNode,
                                                         unsigned int* isEnabled) {
    return entry([&](state& s) -> CUresult {
        const graph_exec_obj* e = s.find<graph_exec_obj>(hGraphExec);
        if (e == nullptr || isEnabled == nullptr) return CUDA_ERROR_INVALID_VALUE;
        for (const exec_node& x : *e->nodes)
            if (x.node == from_handle(hNode)) {
                *isEnabled = x.enabled ? 1 : 0;
                return CUDA_SUCCESS;
            }
        return CUDA_ERROR_INVALID_VALUE;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuGraphExecGetFlags(CUgraphExec hGraphExec, cuuint64_t* flags) {
    return entry([&](state& s) -> CUresult {
        const graph_exec_obj* e = s.find<graph_exec_obj>(hGraphExec);
        if (e == nullptr || flags == nullptr) return CUDA_ERROR_INVALID_VALUE;
        *flags = e->flags;
        return CUDA_SUCCESS;
    });
}

// The graph inside a child graph node (the node's own: it goes with the node).
VCUDA_SOFT_EXPORT CUresult CUDAAPI cuGraphChildGraphNodeGetGraph(CUgraphNode hNode, CUgraph* phGraph) {
    return entry([&](state& s) -> CUresult {
        node_obj* n = s.find<node_obj>(hNode);
        if (n == nullptr || n->type != CU_GRAPH_NODE_TYPE_GRAPH || phGraph == nullptr)
            return CUDA_ERROR_INVALID_VALUE;
        *phGraph = to_handle<CUgraph>(n->child);
        return CUDA_SUCCESS;
    });
}

// The work of `hGraph` replaces the executable graph's when both have the same topology (node types, edges,
// child graphs); the executable graph's nodes still answer to its own graph's nodes. Its user object
// references become those of `hGraph`.
VCUDA_SOFT_EXPORT CUresult CUDAAPI cuGraphExecUpdate_v2(CUgraphExec hGraphExec, CUgraph hGraph,
                                                        CUgraphExecUpdateResultInfo* resultInfo) {
    return entry([&](state& s) -> CUresult {
        graph_exec_obj* e = s.find<graph_exec_obj>(hGraphExec);
        graph_obj* g = s.find<graph_obj>(hGraph);
        if (e == nullptr || g == nullptr || resultInfo == nullptr) return CUDA_ERROR_INVALID_VALUE;
        *resultInfo = {};
        resultInfo->result = CU_GRAPH_EXEC_UPDATE_ERROR;
        std::vector<uint64_t> shape;
        shape_of(s, *g, shape);
        if (shape != e->shape) {
            resultInfo->result = CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED;
            return CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
        }
        auto nodes = std::make_shared<std::vector<exec_node>>();
        uint64_t culprit = 0;
        if (!flatten(s, *g, *nodes, culprit)) return CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
        if (uint64_t n = refused_copy_change(*e->nodes, *nodes)) {
            resultInfo->result = CU_GRAPH_EXEC_UPDATE_ERROR_PARAMETERS_CHANGED;
            resultInfo->errorNode = to_handle<CUgraphNode>(n);
            return CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
        }
        keep_node_ids(*nodes, *e->nodes);
        e->nodes = std::move(nodes);
        user_refs refs;
        retain_graph_refs(s, *g, refs);
        release_refs(s, e->refs);
        e->refs = std::move(refs);
        resultInfo->result = CU_GRAPH_EXEC_UPDATE_SUCCESS;
        return CUDA_SUCCESS;
    });
}

// --- User objects.

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuUserObjectCreate(CUuserObject* object_out, void* ptr, CUhostFn destroy,
                                                      unsigned int initialRefcount, unsigned int flags) {
    return entry([&](state& s) -> CUresult {
        if (object_out == nullptr || destroy == nullptr || initialRefcount == 0 ||
            flags != CU_USER_OBJECT_NO_DESTRUCTOR_SYNC)
            return CUDA_ERROR_INVALID_VALUE;
        user_object_obj* u = s.create<user_object_obj>();
        u->ptr = ptr;
        u->destroy = destroy;
        u->refs = initialRefcount;
        *object_out = to_handle<CUuserObject>(u->handle);
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuUserObjectRetain(CUuserObject object, unsigned int count) {
    return entry([&](state& s) -> CUresult {
        user_object_obj* u = s.find<user_object_obj>(object);
        if (u == nullptr || count == 0) return CUDA_ERROR_INVALID_VALUE;
        u->refs += count;
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuUserObjectRelease(CUuserObject object, unsigned int count) {
    return entry([&](state& s) -> CUresult {
        user_object_obj* u = s.find<user_object_obj>(object);
        if (u == nullptr || count == 0 || count > u->refs) return CUDA_ERROR_INVALID_VALUE;
        release_user_object(s, u->handle, count);
        return CUDA_SUCCESS;
    });
}

// CU_GRAPH_USER_OBJECT_MOVE: the caller's references go to the graph, else the graph takes new ones.
VCUDA_SOFT_EXPORT CUresult CUDAAPI cuGraphRetainUserObject(CUgraph graph, CUuserObject object,
                                                           unsigned int count, unsigned int flags) {
    return entry([&](state& s) -> CUresult {
        graph_obj* g = s.find<graph_obj>(graph);
        user_object_obj* u = s.find<user_object_obj>(object);
        if (g == nullptr || u == nullptr || count == 0 || (flags & ~unsigned{CU_GRAPH_USER_OBJECT_MOVE}) != 0)
            return CUDA_ERROR_INVALID_VALUE;
        if ((flags & CU_GRAPH_USER_OBJECT_MOVE) == 0) u->refs += count;
        g->refs[u->handle] += count;
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuGraphReleaseUserObject(CUgraph graph, CUuserObject object,
                                                            unsigned int count) {
    return entry([&](state& s) -> CUresult {
        graph_obj* g = s.find<graph_obj>(graph);
        if (g == nullptr || count == 0) return CUDA_ERROR_INVALID_VALUE;
        auto it = g->refs.find(from_handle(object));
        if (it == g->refs.end() || it->second < count) return CUDA_ERROR_INVALID_VALUE;
        if ((it->second -= count) == 0) g->refs.erase(it);
        release_user_object(s, from_handle(object), count);
        return CUDA_SUCCESS;
    });
}

// The nodes the next work captured on `hStream` depends on: these (SET) or these as well (ADD).
VCUDA_SOFT_EXPORT CUresult CUDAAPI cuStreamUpdateCaptureDependencies_v2(CUstream hStream,
                                                                        CUgraphNode* dependencies,
                                                                        const CUgraphEdgeData* dependencyData,
                                                                        size_t numDependencies,
                                                                        unsigned int flags) {
    return entry([&](state& s) -> CUresult {
        if (flags != CU_STREAM_ADD_CAPTURE_DEPENDENCIES && flags != CU_STREAM_SET_CAPTURE_DEPENDENCIES)
            return CUDA_ERROR_INVALID_VALUE;
        if (CUresult r = check_stream(s, hStream); r != CUDA_SUCCESS) return r;
        capture_seq* q = capture_of(s, hStream);
        if (q == nullptr) return CUDA_ERROR_ILLEGAL_STATE;
        if (q->invalidated) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
        graph_obj* g = s.find<graph_obj>(q->graph);
        if (g == nullptr) return CUDA_ERROR_ILLEGAL_STATE;
        std::vector<uint64_t> deps;
        std::vector<CUgraphEdgeData> edges;
        // The next node is not known yet: edge data is checked as for a kernel node.
        if (CUresult r = check_deps(s, *g, dependencies, dependencyData, numDependencies,
                                    CU_GRAPH_NODE_TYPE_KERNEL, deps, edges);
            r != CUDA_SUCCESS)
            return r;
        if (q->last_edges.size() != q->last.size()) q->last_edges.assign(q->last.size(), CUgraphEdgeData{});
        if (flags == CU_STREAM_SET_CAPTURE_DEPENDENCIES) {
            q->last.clear();
            q->last_edges.clear();
        }
        for (size_t i = 0; i < deps.size(); ++i) {
            if (std::find(q->last.begin(), q->last.end(), deps[i]) != q->last.end()) continue;
            q->last.push_back(deps[i]);
            q->last_edges.push_back(edges[i]);
        }
        return CUDA_SUCCESS;
    });
}

// --- Graph memory: what graph allocations hold on a device (their memory stays mapped, so used and reserved
// are the same).

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuDeviceGetGraphMemAttribute(CUdevice device, CUgraphMem_attribute attr,
                                                                void* value) {
    return entry([&](state& s) -> CUresult {
        if (!s.valid_device(device) || value == nullptr) return CUDA_ERROR_INVALID_VALUE;
        cuuint64_t v = 0;
        switch (attr) {
            case CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT:
            case CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT:
                v = graph_memory(s, device);
                break;
            case CU_GRAPH_MEM_ATTR_USED_MEM_HIGH:
            case CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH:
                v = s.devices[static_cast<size_t>(device)].graph_high;
                break;
            default:
                return CUDA_ERROR_INVALID_VALUE;
        }
        std::memcpy(value, &v, sizeof v);
        return CUDA_SUCCESS;
    });
}

// Only the high watermarks can be set, and only to 0 (back to what is held now).
VCUDA_SOFT_EXPORT CUresult CUDAAPI cuDeviceSetGraphMemAttribute(CUdevice device, CUgraphMem_attribute attr,
                                                                void* value) {
    return entry([&](state& s) -> CUresult {
        if (!s.valid_device(device) || value == nullptr) return CUDA_ERROR_INVALID_VALUE;
        cuuint64_t v = 0;
        std::memcpy(&v, value, sizeof v);
        if (v != 0 ||
            (attr != CU_GRAPH_MEM_ATTR_USED_MEM_HIGH && attr != CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH))
            return CUDA_ERROR_INVALID_VALUE;
        s.devices[static_cast<size_t>(device)].graph_high = graph_memory(s, device);
        return CUDA_SUCCESS;
    });
}

// Nothing is kept beyond what graph allocations hold.
VCUDA_SOFT_EXPORT CUresult CUDAAPI cuDeviceGraphMemTrim(CUdevice device) {
    return entry([&](state& s) { return s.valid_device(device) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE; });
}

// --- Conditional handles: a value kernels set (set_conditional, below) and conditional nodes read.

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuGraphConditionalHandleCreate(CUgraphConditionalHandle* pHandle_out,
                                                                  CUgraph hGraph, CUcontext ctx,
                                                                  unsigned int defaultLaunchValue,
                                                                  unsigned int flags) {
    return entry([&](state& s) -> CUresult {
        graph_obj* g = s.find<graph_obj>(hGraph);
        if (pHandle_out == nullptr || g == nullptr || (flags & ~unsigned{CU_GRAPH_COND_ASSIGN_DEFAULT}) != 0)
            return CUDA_ERROR_INVALID_VALUE;
        if (ctx != nullptr && usable_context(s, from_handle(ctx)) == nullptr)
            return CUDA_ERROR_INVALID_CONTEXT;
        conditional_obj* c = s.create<conditional_obj>();
        c->graph = g->handle;
        c->value = c->default_value = defaultLaunchValue;
        c->assign_default = (flags & CU_GRAPH_COND_ASSIGN_DEFAULT) != 0;
        *pHandle_out = c->handle;
        return CUDA_SUCCESS;
    });
}

bool vcuda::soft::set_conditional(uint64_t handle, unsigned value) {
    bool found = false;
    entry([&](state& s) {
        if (conditional_obj* c = s.find<conditional_obj>(handle)) {
            c->value = value;
            found = true;
        }
        return CUDA_SUCCESS;
    });
    return found;
}
