// Graphs: the hand-written entry points. The plain ones (cuGraphCreate, cuGraphClone, cuGraphDestroy,
// cuGraphExecDestroy, cuGraphLaunch, cuGraphUpload, cuGraphExecChildGraphNodeSetParams, cuGraphDestroyNode)
// are generated from the spec; graphs come from them or from cuStreamEndCapture (client/api_stream.cpp) and
// are session handles like streams. Graph nodes are session handles too: those added here come back from the
// server's graph_add_node, those the driver made (captured work) when a listing (cuGraphGetNodes, ...) first
// names them. The mirror keeps each node's graph and type, and each executable graph's graph, so that
// cuGraphNodeGetType is answered here and cuGraphExecKernelNodeSetParams (XLA: about ninety per step) is
// checked here and queued. Served node types: kernel, memset, memcpy (device memory, arrays, pinned memory
// shared with the server, and this process's own memory through a host copy: client/host_functions.hpp),
// host, child graph (cloned, or moved into the node, which then owns it), empty, event record and event wait,
// memory alloc and free, conditional; the others answer CUDA_ERROR_NOT_SUPPORTED (logged once). New
// parameters are served for kernel, memset, memcpy (not a host copy), host and event nodes, on the graph or
// on an executable graph, for a node of the graph or of a graph inside it (a conditional body, a moved
// child). The graph functions answer CUDA_ERROR_INVALID_VALUE for an unknown graph, node or parameter, as
// cuda.h lists.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "client/copy_paths.hpp"
#include "client/entry_point.hpp"
#include "client/host_functions.hpp"
#include "client/kernel_params.hpp"
#include "client/plain_call.hpp"
#include "client/remote_call.hpp"
#include "client/state.hpp"
#include "client/trace.hpp"
#include "client_ops.hpp"

using namespace vcuda;
using namespace vcuda::client;

namespace vcuda::client {
// Begins a capture on `s` (client/api_stream.cpp): into a graph of the driver's, or into the application's
// graph `into` after the nodes `deps` (ids checked) with their edge data.
CUresult begin_capture(CUstream s, CUstreamCaptureMode mode, const char* name, CUgraph into,
                       std::span<const std::byte> deps, std::span<const std::byte> edges);
}  // namespace vcuda::client

namespace {

uint64_t id_of(const void* h) { return reinterpret_cast<uint64_t>(h); }

// What the mirror knows of graph node `node`; false when it is not a live node.
bool node_info(CUgraphNode node, handle_info& out) {
    return state::get().lookup(id_of(node), out) && out.kind == handle_kind::graph_node;
}

// True when the mirror knows `node` as a graph node of type `type`.
bool node_of_type(CUgraphNode node, CUgraphNodeType type) {
    handle_info info;
    return node_info(node, info) && info.node_type == type;
}

// The mirror learns a node the server entered, with its graph and type, before the application sees it.
CUgraphNode adopt_node(uint64_t id, uint64_t graph, CUgraphNodeType type) {
    handle_info info;
    info.kind = handle_kind::graph_node;
    info.ctx = current_context();
    info.device = current_device();
    info.owner = graph;
    info.node_type = type;
    state::get().adopt(id, std::move(info));
    return reinterpret_cast<CUgraphNode>(id);
}

// A node array as it travels: the ids, each a live node.
CUresult node_ids(const CUgraphNode* nodes, size_t n, std::vector<uint64_t>& out) {
    if (n && !nodes) return CUDA_ERROR_INVALID_VALUE;
    out.resize(n);
    for (size_t i = 0; i < n; ++i) {
        out[i] = id_of(nodes[i]);
        if (!state::get().known(out[i], handle_kind::graph_node)) return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

std::span<const std::byte> edge_bytes(const CUgraphEdgeData* edges, size_t n) {
    return edges ? std::as_bytes(std::span(edges, n)) : std::span<const std::byte>{};
}

// A context a node names (NULL: the current one) must be on the current device: the session's context there
// runs the node.
CUresult node_context(CUcontext ctx, const char* name) {
    if (!ctx) return CUDA_SUCCESS;
    const int device = current_device();
    auto& st = state::get();
    std::shared_lock lock(st.mu);
    auto* c = st.find_context(id_of(ctx));
    if (!c) return CUDA_ERROR_INVALID_VALUE;
    return c->device == device ? CUDA_SUCCESS : static_cast<CUresult>(unsupported(name));
}

// One node as it travels: its type, the arguments of its type (server/handlers_graph.cpp, graph_add_node) and
// its data (a kernel's packed parameters, a memcpy's CUDA_MEMCPY3D). `host_function`: the id of a host
// function or host copy registered for it (client/host_functions.hpp), forgotten again when the server
// refuses the node.
struct node_spec {
    CUgraphNodeType type = CU_GRAPH_NODE_TYPE_EMPTY;
    std::vector<uint64_t> args;
    std::vector<std::byte> data;
    uint64_t host_function = 0;
    // A memory alloc node: where its address goes, and its size (the mirror learns the allocation).
    CUdeviceptr* alloc_out = nullptr;
    size_t alloc_size = 0;
    // A conditional node: where the array of its body graphs goes, and how many there are.
    CUgraph** bodies_out = nullptr;
    unsigned bodies = 0;
    // A child graph node that takes its graph (CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE): the graph, the node's
    // from then on.
    uint64_t moved_graph = 0;
};

// The body graphs of conditional nodes, as the application reads them (CUDA_CONDITIONAL_NODE_PARAMS
// phGraph_out: valid while the node lives): kept for the process's life, as graphs give no sign of their end
// here. locks: its own mutex.
CUgraph* keep_bodies(std::vector<CUgraph> bodies) {
    static std::mutex mu;
    static auto* kept = new std::vector<std::unique_ptr<CUgraph[]>>();  // never destroyed: atexit may read
    auto array = std::make_unique<CUgraph[]>(bodies.size());
    std::copy(bodies.begin(), bodies.end(), array.get());
    std::lock_guard lock(mu);
    kept->push_back(std::move(array));
    return kept->back().get();
}

// A kernel node's kernel: `func`, or `kern` in `ctx`, checked and packed as a launch's.
CUresult kernel_spec(CUfunction func, CUkernel kern, CUcontext ctx, unsigned gx, unsigned gy, unsigned gz,
                     unsigned bx, unsigned by, unsigned bz, unsigned shared, void** kernel_params,
                     void** extra, node_spec& s, const char* name) {
    s.type = CU_GRAPH_NODE_TYPE_KERNEL;
    uint64_t fid = func ? id_of(func) : id_of(kern);
    handle_info info;
    if (!state::get().lookup_kind(fid, info.kind, &info.layout)) return CUDA_ERROR_INVALID_VALUE;
    if (func ? info.kind != handle_kind::function && info.kind != handle_kind::kernel
             : info.kind != handle_kind::kernel)
        return CUDA_ERROR_INVALID_VALUE;
    if (!func)
        if (CUresult rc = node_context(ctx, name); rc != CUDA_SUCCESS) return rc;
    if (kernel_params && extra) return CUDA_ERROR_INVALID_VALUE;
    const int device = current_device();
    if (device < 0) return CUDA_ERROR_INVALID_CONTEXT;
    if (CUresult rc = check_shape(device, gx, gy, gz, bx, by, bz); rc != CUDA_SUCCESS) return rc;
    param_form form;
    if (CUresult rc = pack_params(info, kernel_params, extra, s.data, form); rc != CUDA_SUCCESS) return rc;
    s.args = {state::get().route(fid), gx, gy, gz, bx, by, bz, shared, static_cast<uint64_t>(form)};
    return CUDA_SUCCESS;
}

template <class P>
CUresult kernel_spec(const P& p, CUkernel kern, CUcontext ctx, node_spec& s, const char* name) {
    return kernel_spec(p.func, kern, ctx, p.gridDimX, p.gridDimY, p.gridDimZ, p.blockDimX, p.blockDimY,
                       p.blockDimZ, p.sharedMemBytes, p.kernelParams, p.extra, s, name);
}

CUresult memset_spec(const CUDA_MEMSET_NODE_PARAMS& p, CUcontext ctx, node_spec& s, const char* name) {
    if (p.elementSize != 1 && p.elementSize != 2 && p.elementSize != 4) return CUDA_ERROR_INVALID_VALUE;
    if (CUresult rc = node_context(ctx, name); rc != CUDA_SUCCESS) return rc;
    s.type = CU_GRAPH_NODE_TYPE_MEMSET;
    s.args = {p.dst, p.value, p.elementSize, p.width, p.height, p.pitch};
    return CUDA_SUCCESS;
}

// A copy with its sides as the server must see them (graph_copy); a side in this process's memory becomes a
// host copy, whose id is the node's argument.
CUresult memcpy_spec(const CUDA_MEMCPY3D& p, CUcontext ctx, node_spec& s, const char* name) {
    if (CUresult rc = node_context(ctx, name); rc != CUDA_SUCCESS) return rc;
    CUDA_MEMCPY3D c = p;
    uint64_t host_copy = 0;
    if (CUresult rc = graph_copy(c, host_copy, name); rc != CUDA_SUCCESS) return rc;
    s.type = CU_GRAPH_NODE_TYPE_MEMCPY;
    s.args = {host_copy};
    s.host_function = host_copy;
    s.data.resize(sizeof c);
    std::memcpy(s.data.data(), &c, sizeof c);
    return CUDA_SUCCESS;
}

// A memory alloc node: its parameters as they travel (CUDA_MEM_ALLOC_NODE_PARAMS_v2, then its access
// descriptors), locations named as the server knows its devices. The address comes back to `out`.
CUresult alloc_spec(const CUmemPoolProps& props, const CUmemAccessDesc* access, size_t access_count,
                    size_t bytesize, CUdeviceptr* out, node_spec& s) {
    if (bytesize == 0 || (access_count && !access) || access_count > 64) return CUDA_ERROR_INVALID_VALUE;
    CUDA_MEM_ALLOC_NODE_PARAMS_v2 a{};
    a.poolProps = props;
    a.accessDescCount = access_count;
    a.bytesize = bytesize;
    if (CUresult rc = server_location(a.poolProps.location); rc != CUDA_SUCCESS) return rc;
    std::vector<CUmemAccessDesc> descs(access, access + access_count);
    for (auto& d : descs)
        if (CUresult rc = server_location(d.location); rc != CUDA_SUCCESS) return rc;
    s.type = CU_GRAPH_NODE_TYPE_MEM_ALLOC;
    s.data.resize(sizeof a + descs.size() * sizeof(CUmemAccessDesc));
    std::memcpy(s.data.data(), &a, sizeof a);
    if (!descs.empty())
        std::memcpy(s.data.data() + sizeof a, descs.data(), descs.size() * sizeof(CUmemAccessDesc));
    s.alloc_out = out;
    s.alloc_size = bytesize;
    return CUDA_SUCCESS;
}

// A conditional node: its handle (the session's, from cuGraphConditionalHandleCreate), type and body count;
// the driver makes the bodies.
CUresult conditional_spec(CUDA_CONDITIONAL_NODE_PARAMS& p, node_spec& s, const char* name) {
    if (p.size == 0) return CUDA_ERROR_INVALID_VALUE;
    if (CUresult rc = node_context(p.ctx, name); rc != CUDA_SUCCESS) return rc;
    s.type = CU_GRAPH_NODE_TYPE_CONDITIONAL;
    s.args = {p.handle, static_cast<uint64_t>(p.type), p.size};
    s.bodies_out = &p.phGraph_out;
    s.bodies = p.size;
    return CUDA_SUCCESS;
}

CUresult free_spec(CUdeviceptr p, node_spec& s) {
    device_allocation a;
    if (!state::get().find_allocation(p, 1, a) || a.base != p) return CUDA_ERROR_INVALID_VALUE;
    s.type = CU_GRAPH_NODE_TYPE_MEM_FREE;
    s.args = {p};
    return CUDA_SUCCESS;
}

// A host node: the function runs here, at each launch, when the server asks (client/host_functions.hpp).
CUresult host_spec(CUhostFn fn, void* data, node_spec& s) {
    if (!fn) return CUDA_ERROR_INVALID_VALUE;
    s.type = CU_GRAPH_NODE_TYPE_HOST;
    s.host_function = graph_host_function(fn, data);
    s.args = {s.host_function};
    return CUDA_SUCCESS;
}

// A child graph node: `child` cloned into it, or moved (the node's then, its nodes reachable through the
// executable graphs of the parent, as XLA updates them).
CUresult child_spec(CUgraph child, CUgraphChildGraphNodeOwnership ownership, node_spec& s) {
    if (!state::get().known(id_of(child), handle_kind::graph)) return CUDA_ERROR_INVALID_VALUE;
    if (ownership != CU_GRAPH_CHILD_GRAPH_OWNERSHIP_CLONE && ownership != CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE)
        return CUDA_ERROR_INVALID_VALUE;
    s.type = CU_GRAPH_NODE_TYPE_GRAPH;
    s.args = {id_of(child), static_cast<uint64_t>(ownership)};
    if (ownership == CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE) s.moved_graph = id_of(child);
    return CUDA_SUCCESS;
}

CUresult event_spec(CUgraphNodeType type, CUevent event, node_spec& s) {
    if (!state::get().known(id_of(event), handle_kind::event)) return CUDA_ERROR_INVALID_VALUE;
    s.type = type;
    s.args = {id_of(event)};
    return CUDA_SUCCESS;
}

// cuGraphAddNode's tagged union (a memory alloc node's address is written back into it).
CUresult spec_of(CUgraphNodeParams* p, node_spec& s, const char* name) {
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    switch (p->type) {
        case CU_GRAPH_NODE_TYPE_KERNEL:
            return kernel_spec(p->kernel, p->kernel.kern, p->kernel.ctx, s, name);
        case CU_GRAPH_NODE_TYPE_MEMSET: {
            const auto& m = p->memset;
            return memset_spec({m.dst, m.pitch, m.value, m.elementSize, m.width, m.height}, m.ctx, s, name);
        }
        case CU_GRAPH_NODE_TYPE_MEMCPY:
            if (p->memcpy.flags || p->memcpy.reserved) return CUDA_ERROR_INVALID_VALUE;
            return memcpy_spec(p->memcpy.copyParams, p->memcpy.copyCtx, s, name);
        case CU_GRAPH_NODE_TYPE_GRAPH:
            return child_spec(p->graph.graph, p->graph.ownership, s);
        case CU_GRAPH_NODE_TYPE_EMPTY:
            s.type = CU_GRAPH_NODE_TYPE_EMPTY;
            return CUDA_SUCCESS;
        case CU_GRAPH_NODE_TYPE_HOST:
            return host_spec(p->host.fn, p->host.userData, s);
        case CU_GRAPH_NODE_TYPE_MEM_ALLOC: {
            auto& a = p->alloc;
            return alloc_spec(a.poolProps, a.accessDescs, a.accessDescCount, a.bytesize, &a.dptr, s);
        }
        case CU_GRAPH_NODE_TYPE_MEM_FREE:
            return free_spec(p->free.dptr, s);
        case CU_GRAPH_NODE_TYPE_CONDITIONAL:
            return conditional_spec(p->conditional, s, name);
        case CU_GRAPH_NODE_TYPE_WAIT_EVENT:
            return event_spec(p->type, p->eventWait.event, s);
        case CU_GRAPH_NODE_TYPE_EVENT_RECORD:
            return event_spec(p->type, p->eventRecord.event, s);
        default: {
            std::string what =
                std::string(name) + " (node type " + std::to_string(static_cast<int>(p->type)) + ")";
            return static_cast<CUresult>(unsupported(what.c_str()));
        }
    }
}

// Adds the node `build(spec)` describes (and checks) to `g` after `deps`.
template <class Build>
CUresult add_node(CUgraphNode* out, CUgraph g, const CUgraphNode* deps, const CUgraphEdgeData* edges,
                  size_t n, const char* name, Build&& build) {
    VCUDA_REQUIRE_INIT();
    if (!out || !state::get().known(id_of(g), handle_kind::graph)) return CUDA_ERROR_INVALID_VALUE;
    std::vector<uint64_t> dep_ids;
    if (CUresult rc = node_ids(deps, n, dep_ids); rc != CUDA_SUCCESS) return rc;
    node_spec spec;
    if (CUresult rc = build(spec); rc != CUDA_SUCCESS) {
        if (spec.host_function) forget_host_function(spec.host_function);
        return rc;
    }
    graph_add_node_call c(name, g, static_cast<unsigned>(spec.type), std::as_bytes(std::span(dep_ids)),
                          edge_bytes(edges, n), spec.data, spec.args);
    if (CUresult rc = c.send_sync(); rc != CUDA_SUCCESS) {
        if (spec.host_function) forget_host_function(spec.host_function);
        return rc;
    }
    *out = adopt_node(c.node(), id_of(g), spec.type);
    if (spec.moved_graph) state::get().give_graph(spec.moved_graph, id_of(*out));
    if (spec.bodies_out) {
        // The bodies are the node's: session handles the mirror learns, owned by the node.
        if (c.reply().outs.size() != 1 + spec.bodies) return CUDA_ERROR_UNKNOWN;
        std::vector<CUgraph> bodies;
        for (unsigned i = 0; i < spec.bodies; ++i)
            bodies.push_back(c.out_handle<CUgraph>(1 + i, handle_kind::graph, id_of(*out)));
        *spec.bodies_out = keep_bodies(std::move(bodies));
    }
    if (spec.alloc_out) {
        // The graph's memory: the mirror knows it as the device's from now on, as copies and memsets need.
        *spec.alloc_out = c.out<uint64_t>(1);
        state::get().add_allocation(*spec.alloc_out, spec.alloc_size, current_device(), false, false, true);
    }
    return CUDA_SUCCESS;
}

// True when `node` is a live node of `type` and, given an executable graph, one that graph holds: a node of
// the graph it was made from, or of a graph inside it (a conditional body, a moved child graph).
bool node_target(CUgraphExec exec, CUgraphNode node, CUgraphNodeType type) {
    handle_info n, e;
    if (!node_info(node, n) || n.node_type != type) return false;
    return !exec || (state::get().lookup(id_of(exec), e) && e.kind == handle_kind::graph_exec &&
                     state::get().node_within(id_of(node), e.owner));
}

// A kernel node's new kernel, as `build(spec)` describes it: on the node itself (exec null, waited for), or
// on its copy in an executable graph of its graph (checked here, queued: the driver's own checks of the
// kernel report at the next synchronizing call).
template <class Build>
CUresult set_kernel(CUgraphExec exec, CUgraphNode node, const char* name, Build&& build) {
    VCUDA_REQUIRE_INIT();
    node_spec spec;
    CUresult built = build(spec);
    if (!node_target(exec, node, CU_GRAPH_NODE_TYPE_KERNEL)) return CUDA_ERROR_INVALID_VALUE;
    if (built != CUDA_SUCCESS) return built;
    const auto& x = spec.args;  // kernel_spec's: the routed function, grid, block, shared bytes, form
    if (x.size() != 9) return CUDA_ERROR_INVALID_VALUE;
    auto u = [&](size_t i) { return static_cast<unsigned>(x[i]); };
    kernel_node_params_call c(name, exec, node, x[0], u(1), u(2), u(3), u(4), u(5), u(6), u(7), u(8),
                              spec.data);
    return exec ? c.send_async() : c.send_sync();
}

// New parameters of a memset, memcpy, host or event node of `type`, as `build(spec)` describes them: on the
// node itself (exec null, waited for), or on its copy in an executable graph (queued, as kernel updates).
template <class Build>
CUresult set_node(CUgraphExec exec, CUgraphNode node, CUgraphNodeType type, const char* name, Build&& build) {
    VCUDA_REQUIRE_INIT();
    if (!node_target(exec, node, type)) return CUDA_ERROR_INVALID_VALUE;
    node_spec spec;
    CUresult rc = build(spec);
    if (rc == CUDA_SUCCESS && spec.type != type) rc = CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS && type == CU_GRAPH_NODE_TYPE_MEMCPY && spec.args.at(0) != 0) {
        std::string what = std::string(name) + " (a copy with this process's own memory)";
        rc = static_cast<CUresult>(unsupported(what.c_str()));
    }
    if (rc != CUDA_SUCCESS) {
        if (spec.host_function) forget_host_function(spec.host_function);
        return rc;
    }
    node_set_params_call c(name, exec, node, static_cast<unsigned>(type), spec.data, spec.args);
    return exec ? c.send_async() : c.send_sync();
}

// The event of an event record or wait node, or the graph of a child graph node (`type`), as the session
// names it (server/handlers_graph.cpp, graph_node_object).
template <class H>
CUresult node_object(CUgraphNode node, CUgraphNodeType type, H* out, const char* name) {
    VCUDA_REQUIRE_INIT();
    if (!out || !node_of_type(node, type)) return CUDA_ERROR_INVALID_VALUE;
    const bool child_graph = type == CU_GRAPH_NODE_TYPE_GRAPH;
    graph_node_object_call c(name, node, child_graph ? 1 : 0);
    if (CUresult rc = c.send_sync(); rc != CUDA_SUCCESS) return rc;
    if (child_graph)
        *out =
            c.out_handle<H>(0, handle_kind::graph, id_of(node));  // the node's: it lives as long as the node
    else
        *out = reinterpret_cast<H>(c.object());  // one of the application's events, which the mirror knows
    return CUDA_SUCCESS;
}

// A kernel node's parameters as the driver gives them: kernelParams points into a copy of the values, kept
// per node and replaced at the next such call (graphs give no sign of their end here). locks: its own mutex.
struct kernel_node_values {
    std::vector<std::byte> values;
    std::vector<void*> pointers;
};
std::mutex kernel_values_mu;
std::map<uint64_t, kernel_node_values>& kernel_values() {
    static auto* m = new std::map<uint64_t, kernel_node_values>();  // never destroyed: atexit may ask
    return *m;
}

CUresult kernel_node_params(CUgraphNode node, CUDA_KERNEL_NODE_PARAMS_v2& p, const char* name) {
    VCUDA_REQUIRE_INIT();
    handle_info info;
    if (!node_info(node, info) || info.node_type != CU_GRAPH_NODE_TYPE_KERNEL)
        return CUDA_ERROR_INVALID_VALUE;
    graph_kernel_node_params_call c(name, node);
    if (CUresult rc = c.send_sync(); rc != CUDA_SUCCESS) return rc;
    const uint64_t runs = c.function() ? c.function() : c.kernel();  // a kernel is named as a function too
    const auto values = c.params();
    handle_kind kind{};
    std::shared_ptr<const param_layout> layout;
    if (!state::get().lookup_kind(runs, kind, &layout) || !layout || layout->total() != values.size())
        return CUDA_ERROR_UNKNOWN;
    p = {};
    p.func = reinterpret_cast<CUfunction>(runs);
    p.kern = reinterpret_cast<CUkernel>(c.kernel());
    p.gridDimX = c.grid_x();
    p.gridDimY = c.grid_y();
    p.gridDimZ = c.grid_z();
    p.blockDimX = c.block_x();
    p.blockDimY = c.block_y();
    p.blockDimZ = c.block_z();
    p.sharedMemBytes = c.shared();
    p.ctx = reinterpret_cast<CUcontext>(info.ctx);
    std::lock_guard lock(kernel_values_mu);
    kernel_node_values& v = kernel_values()[id_of(node)];
    v.values.assign(values.begin(), values.end());
    v.pointers.resize(layout->params.size());
    for (size_t i = 0; i < layout->params.size(); ++i)
        v.pointers[i] = v.values.data() + layout->params[i].first;
    p.kernelParams = v.pointers.empty() ? nullptr : v.pointers.data();
    return CUDA_SUCCESS;
}

// An event record or event wait node's new event.
CUresult set_event(CUgraphExec exec, CUgraphNode node, CUgraphNodeType type, CUevent event,
                   const char* name) {
    return set_node(exec, node, type, name, [&](node_spec& s) { return event_spec(type, event, s); });
}

// cuGraphInstantiate*: the executable graph remembers its graph (whose nodes name its nodes in updates).
CUresult instantiate(CUgraphExec* exec, CUgraph g, uint64_t flags, CUstream upload, CUgraphNode* error_node,
                     CUgraphInstantiateResult* result, const char* name) {
    VCUDA_REQUIRE_INIT();
    if (!exec) return CUDA_ERROR_INVALID_VALUE;
    graph_instantiate_call c(name, g, flags, upload);  // the driver reads the stream only to upload
    CUresult rc = c.send_sync();
    // The result and failing node come back even when instantiation fails (not when a queued call's error
    // took the reply).
    const bool answered = c.reply().outs.size() >= 4;
    if (result) {
        *result = answered             ? static_cast<CUgraphInstantiateResult>(c.result())
                  : rc == CUDA_SUCCESS ? CUDA_GRAPH_INSTANTIATE_SUCCESS
                                       : CUDA_GRAPH_INSTANTIATE_ERROR;
    }
    if (error_node) {
        uint64_t id = answered ? c.error_node() : 0;
        *error_node = id ? adopt_node(id, id_of(g), static_cast<CUgraphNodeType>(c.error_type())) : nullptr;
    }
    if (rc != CUDA_SUCCESS) return rc;
    *exec = c.exec(id_of(g));
    return CUDA_SUCCESS;
}

// The pre-12.0 form: no flags, and a log buffer the driver writes only on failure.
CUresult instantiate_with_log(CUgraphExec* exec, CUgraph g, CUgraphNode* error_node, char* log,
                              size_t log_size, const char* name) {
    if (log && log_size) log[0] = '\0';
    return instantiate(exec, g, 0, nullptr, error_node, nullptr, name);
}

CUresult instantiate_with_params(CUgraphExec* exec, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS* params,
                                 CUstream upload, const char* name) {
    if (!params) return CUDA_ERROR_INVALID_VALUE;
    bool uploads = params->flags & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD;
    return instantiate(exec, g, params->flags, uploads ? upload : nullptr, &params->hErrNode_out,
                       &params->result_out, name);
}

enum class listing : uint64_t { nodes = 0, root_nodes = 1, dependencies = 2, dependents = 3 };

// cuGraphGetNodes, cuGraphGetRootNodes (of graph `of`), cuGraphNodeGetDependencies,
// cuGraphNodeGetDependentNodes (of node `of`): as the driver answers, a count without an array, else up to
// *count nodes (the rest of the array set to NULL) and how many there were. The nodes listed join the mirror.
CUresult list_nodes(uint64_t of, listing what, CUgraphNode* nodes, CUgraphEdgeData* edges, size_t* count,
                    const char* name) {
    VCUDA_REQUIRE_INIT();
    if (!count || (edges && !nodes)) return CUDA_ERROR_INVALID_VALUE;
    const bool of_graph = what == listing::nodes || what == listing::root_nodes;
    handle_info info;
    if (!state::get().lookup(of, info) ||
        info.kind != (of_graph ? handle_kind::graph : handle_kind::graph_node))
        return CUDA_ERROR_INVALID_VALUE;
    const uint64_t graph = of_graph ? of : info.owner;
    const size_t capacity = nodes ? *count : 0;
    graph_nodes_call c(name, of, static_cast<unsigned>(what), nodes != nullptr, capacity, edges != nullptr);
    if (CUresult rc = c.send_sync(); rc != CUDA_SUCCESS) return rc;
    const auto outs = c.listed();
    const size_t total = c.count(), listed = nodes ? std::min(total, capacity) : 0;
    if (outs.size() != 2 * listed || (edges && c.edge_data().size() != listed * sizeof(CUgraphEdgeData)))
        return CUDA_ERROR_UNKNOWN;  // a server that answers otherwise is not speaking this protocol
    for (size_t i = 0; i < listed; ++i)
        nodes[i] = adopt_node(outs[2 * i], graph, static_cast<CUgraphNodeType>(outs[2 * i + 1]));
    for (size_t i = listed; i < capacity; ++i) nodes[i] = nullptr;
    if (edges) {
        std::memcpy(edges, c.edge_data().data(), listed * sizeof(CUgraphEdgeData));
        std::fill(edges + listed, edges + capacity, CUgraphEdgeData{});
    }
    *count = total;
    return CUDA_SUCCESS;
}

// cuGraphAddDependencies / cuGraphRemoveDependencies: edges from[i] -> to[i].
CUresult change_edges(CUgraph g, const CUgraphNode* from, const CUgraphNode* to, const CUgraphEdgeData* edges,
                      size_t n, bool remove, const char* name) {
    VCUDA_REQUIRE_INIT();
    if (!state::get().known(id_of(g), handle_kind::graph)) return CUDA_ERROR_INVALID_VALUE;
    std::vector<uint64_t> from_ids, to_ids;
    if (CUresult rc = node_ids(from, n, from_ids); rc != CUDA_SUCCESS) return rc;
    if (CUresult rc = node_ids(to, n, to_ids); rc != CUDA_SUCCESS) return rc;
    return graph_edges_call(name, g, remove, std::as_bytes(std::span(from_ids)),
                            std::as_bytes(std::span(to_ids)), edge_bytes(edges, n))
        .send_sync();
}

}  // namespace

// ---------------------------------------------------------------- capture into an existing graph

VCUDA_API cuStreamBeginCaptureToGraph(CUstream s, CUgraph g, const CUgraphNode* deps,
                                      const CUgraphEdgeData* edges, size_t n,
                                      CUstreamCaptureMode mode) noexcept {
    VCUDA_TRACE_HOOK(cuStreamBeginCaptureToGraph, s, g, deps, edges, n, mode);
    VCUDA_REQUIRE_INIT();
    if (!state::get().known(id_of(g), handle_kind::graph)) return CUDA_ERROR_INVALID_VALUE;
    std::vector<uint64_t> dep_ids;
    if (CUresult rc = node_ids(deps, n, dep_ids); rc != CUDA_SUCCESS) return rc;
    return begin_capture(s, mode, "cuStreamBeginCaptureToGraph", g, std::as_bytes(std::span(dep_ids)),
                         edge_bytes(edges, n));
}

// ---------------------------------------------------------------- instantiation

VCUDA_API cuGraphInstantiate(CUgraphExec* exec, CUgraph g, CUgraphNode* error_node, char* log,
                             size_t log_size) noexcept {
    VCUDA_TRACE_HOOK(cuGraphInstantiate, exec, g, error_node, log, log_size);
    return instantiate_with_log(exec, g, error_node, log, log_size, "cuGraphInstantiate");
}

VCUDA_API cuGraphInstantiate_v2(CUgraphExec* exec, CUgraph g, CUgraphNode* error_node, char* log,
                                size_t log_size) noexcept {
    VCUDA_TRACE_HOOK(cuGraphInstantiate_v2, exec, g, error_node, log, log_size);
    return instantiate_with_log(exec, g, error_node, log, log_size, "cuGraphInstantiate_v2");
}

VCUDA_API cuGraphInstantiateWithFlags(CUgraphExec* exec, CUgraph g, unsigned long long flags) noexcept {
    VCUDA_TRACE_HOOK(cuGraphInstantiateWithFlags, exec, g, flags);
    return instantiate(exec, g, flags, nullptr, nullptr, nullptr, "cuGraphInstantiateWithFlags");
}

VCUDA_API cuGraphInstantiateWithParams(CUgraphExec* exec, CUgraph g,
                                       CUDA_GRAPH_INSTANTIATE_PARAMS* params) noexcept {
    VCUDA_TRACE_HOOK(cuGraphInstantiateWithParams, exec, g, params);
    return instantiate_with_params(exec, g, params, params ? params->hUploadStream : nullptr,
                                   "cuGraphInstantiateWithParams");
}

// The per-thread-stream variant: the upload stream inside the parameters is the one to map.
VCUDA_API cuGraphInstantiateWithParams_ptsz(CUgraphExec* exec, CUgraph g,
                                            CUDA_GRAPH_INSTANTIATE_PARAMS* params) noexcept {
    VCUDA_TRACE_HOOK(cuGraphInstantiateWithParams_ptsz, exec, g, params);
    return instantiate_with_params(exec, g, params,
                                   params ? per_thread_stream(params->hUploadStream) : nullptr,
                                   "cuGraphInstantiateWithParams_ptsz");
}

// ---------------------------------------------------------------- listing nodes

VCUDA_API cuGraphGetNodes(CUgraph g, CUgraphNode* nodes, size_t* count) noexcept {
    VCUDA_TRACE_HOOK(cuGraphGetNodes, g, nodes, count);
    return list_nodes(id_of(g), listing::nodes, nodes, nullptr, count, "cuGraphGetNodes");
}

VCUDA_API cuGraphGetRootNodes(CUgraph g, CUgraphNode* nodes, size_t* count) noexcept {
    VCUDA_TRACE_HOOK(cuGraphGetRootNodes, g, nodes, count);
    return list_nodes(id_of(g), listing::root_nodes, nodes, nullptr, count, "cuGraphGetRootNodes");
}

namespace {

// cuGraphGetEdges(_v2): a count without arrays, else up to *count edges (the rest of the arrays set to NULL)
// and how many there were. The nodes listed join the mirror.
CUresult list_edges(CUgraph g, CUgraphNode* from, CUgraphNode* to, CUgraphEdgeData* edges, size_t* count,
                    const char* name) {
    VCUDA_REQUIRE_INIT();
    if (!count || (from == nullptr) != (to == nullptr) || (edges && !from)) return CUDA_ERROR_INVALID_VALUE;
    if (!state::get().known(id_of(g), handle_kind::graph)) return CUDA_ERROR_INVALID_VALUE;
    const size_t capacity = from ? *count : 0;
    graph_edge_list_call c(name, g, from != nullptr, capacity, edges != nullptr);
    if (CUresult rc = c.send_sync(); rc != CUDA_SUCCESS) return rc;
    const auto outs = c.listed();
    const size_t total = c.count(), listed = from ? std::min(total, capacity) : 0;
    if (outs.size() != 4 * listed || (edges && c.edge_data().size() != listed * sizeof(CUgraphEdgeData)))
        return CUDA_ERROR_UNKNOWN;  // a server that answers otherwise is not speaking this protocol
    auto type = [&](size_t i) { return static_cast<CUgraphNodeType>(outs[i]); };
    for (size_t i = 0; i < listed; ++i) {
        from[i] = adopt_node(outs[4 * i], id_of(g), type(4 * i + 1));
        to[i] = adopt_node(outs[4 * i + 2], id_of(g), type(4 * i + 3));
    }
    for (size_t i = listed; i < capacity; ++i) from[i] = to[i] = nullptr;
    if (edges) {
        std::memcpy(edges, c.edge_data().data(), listed * sizeof(CUgraphEdgeData));
        std::fill(edges + listed, edges + capacity, CUgraphEdgeData{});
    }
    *count = total;
    return CUDA_SUCCESS;
}

}  // namespace

VCUDA_API cuGraphGetEdges(CUgraph g, CUgraphNode* from, CUgraphNode* to, size_t* count) noexcept {
    VCUDA_TRACE_HOOK(cuGraphGetEdges, g, from, to, count);
    return list_edges(g, from, to, nullptr, count, "cuGraphGetEdges");
}

VCUDA_API cuGraphGetEdges_v2(CUgraph g, CUgraphNode* from, CUgraphNode* to, CUgraphEdgeData* edges,
                             size_t* count) noexcept {
    VCUDA_TRACE_HOOK(cuGraphGetEdges_v2, g, from, to, edges, count);
    return list_edges(g, from, to, edges, count, "cuGraphGetEdges_v2");
}

// The server's driver describes the graph; the text is written here, to the application's path.
VCUDA_API cuGraphDebugDotPrint(CUgraph g, const char* path, unsigned int flags) noexcept {
    VCUDA_TRACE_HOOK(cuGraphDebugDotPrint, g, path, flags);
    VCUDA_REQUIRE_INIT();
    if (!path) return CUDA_ERROR_INVALID_VALUE;
    if (!state::get().known(id_of(g), handle_kind::graph)) return CUDA_ERROR_INVALID_VALUE;
    graph_dot_print_call c("cuGraphDebugDotPrint", g, flags);
    if (CUresult rc = c.send_sync(); rc != CUDA_SUCCESS) return rc;
    if (c.reply().blobs.size() != 1) return CUDA_ERROR_UNKNOWN;
    const auto text = c.text();
    FILE* f = std::fopen(path, "w");
    if (!f) return CUDA_ERROR_OPERATING_SYSTEM;
    const bool written = std::fwrite(text.data(), 1, text.size(), f) == text.size();
    return std::fclose(f) == 0 && written ? CUDA_SUCCESS : CUDA_ERROR_OPERATING_SYSTEM;
}

VCUDA_API cuGraphNodeGetDependencies(CUgraphNode node, CUgraphNode* deps, size_t* count) noexcept {
    VCUDA_TRACE_HOOK(cuGraphNodeGetDependencies, node, deps, count);
    return list_nodes(id_of(node), listing::dependencies, deps, nullptr, count, "cuGraphNodeGetDependencies");
}

VCUDA_API cuGraphNodeGetDependencies_v2(CUgraphNode node, CUgraphNode* deps, CUgraphEdgeData* edges,
                                        size_t* count) noexcept {
    VCUDA_TRACE_HOOK(cuGraphNodeGetDependencies_v2, node, deps, edges, count);
    return list_nodes(id_of(node), listing::dependencies, deps, edges, count,
                      "cuGraphNodeGetDependencies_v2");
}

VCUDA_API cuGraphNodeGetDependentNodes(CUgraphNode node, CUgraphNode* dependents, size_t* count) noexcept {
    VCUDA_TRACE_HOOK(cuGraphNodeGetDependentNodes, node, dependents, count);
    return list_nodes(id_of(node), listing::dependents, dependents, nullptr, count,
                      "cuGraphNodeGetDependentNodes");
}

VCUDA_API cuGraphNodeGetDependentNodes_v2(CUgraphNode node, CUgraphNode* dependents, CUgraphEdgeData* edges,
                                          size_t* count) noexcept {
    VCUDA_TRACE_HOOK(cuGraphNodeGetDependentNodes_v2, node, dependents, edges, count);
    return list_nodes(id_of(node), listing::dependents, dependents, edges, count,
                      "cuGraphNodeGetDependentNodes_v2");
}

VCUDA_API cuGraphNodeGetType(CUgraphNode node, CUgraphNodeType* type) noexcept {
    VCUDA_TRACE_HOOK(cuGraphNodeGetType, node, type);
    VCUDA_REQUIRE_INIT();
    handle_info info;
    if (!type || !node_info(node, info)) return CUDA_ERROR_INVALID_VALUE;
    *type = info.node_type;
    return CUDA_SUCCESS;
}

// ---------------------------------------------------------------- adding nodes and edges

VCUDA_API cuGraphAddNode(CUgraphNode* node, CUgraph g, const CUgraphNode* deps, size_t n,
                         CUgraphNodeParams* params) noexcept {
    VCUDA_TRACE_HOOK(cuGraphAddNode, node, g, deps, n, params);
    const char* name = "cuGraphAddNode";
    return add_node(node, g, deps, nullptr, n, name, [&](node_spec& s) { return spec_of(params, s, name); });
}

VCUDA_API cuGraphAddNode_v2(CUgraphNode* node, CUgraph g, const CUgraphNode* deps,
                            const CUgraphEdgeData* edges, size_t n, CUgraphNodeParams* params) noexcept {
    VCUDA_TRACE_HOOK(cuGraphAddNode_v2, node, g, deps, edges, n, params);
    const char* name = "cuGraphAddNode_v2";
    return add_node(node, g, deps, edges, n, name, [&](node_spec& s) { return spec_of(params, s, name); });
}

VCUDA_API cuGraphAddKernelNode(CUgraphNode* node, CUgraph g, const CUgraphNode* deps, size_t n,
                               const CUDA_KERNEL_NODE_PARAMS_v1* params) noexcept {
    VCUDA_TRACE_HOOK(cuGraphAddKernelNode, node, g, deps, n, params);
    const char* name = "cuGraphAddKernelNode";
    return add_node(node, g, deps, nullptr, n, name, [&](node_spec& s) {
        return params ? kernel_spec(*params, nullptr, nullptr, s, name) : CUDA_ERROR_INVALID_VALUE;
    });
}

VCUDA_API cuGraphAddKernelNode_v2(CUgraphNode* node, CUgraph g, const CUgraphNode* deps, size_t n,
                                  const CUDA_KERNEL_NODE_PARAMS* params) noexcept {
    VCUDA_TRACE_HOOK(cuGraphAddKernelNode_v2, node, g, deps, n, params);
    const char* name = "cuGraphAddKernelNode_v2";
    return add_node(node, g, deps, nullptr, n, name, [&](node_spec& s) {
        return params ? kernel_spec(*params, params->kern, params->ctx, s, name) : CUDA_ERROR_INVALID_VALUE;
    });
}

VCUDA_API cuGraphAddMemsetNode(CUgraphNode* node, CUgraph g, const CUgraphNode* deps, size_t n,
                               const CUDA_MEMSET_NODE_PARAMS* params, CUcontext ctx) noexcept {
    VCUDA_TRACE_HOOK(cuGraphAddMemsetNode, node, g, deps, n, params, ctx);
    const char* name = "cuGraphAddMemsetNode";
    return add_node(node, g, deps, nullptr, n, name, [&](node_spec& s) {
        return params ? memset_spec(*params, ctx, s, name) : CUDA_ERROR_INVALID_VALUE;
    });
}

VCUDA_API cuGraphAddMemcpyNode(CUgraphNode* node, CUgraph g, const CUgraphNode* deps, size_t n,
                               const CUDA_MEMCPY3D* params, CUcontext ctx) noexcept {
    VCUDA_TRACE_HOOK(cuGraphAddMemcpyNode, node, g, deps, n, params, ctx);
    const char* name = "cuGraphAddMemcpyNode";
    return add_node(node, g, deps, nullptr, n, name, [&](node_spec& s) {
        return params ? memcpy_spec(*params, ctx, s, name) : CUDA_ERROR_INVALID_VALUE;
    });
}

VCUDA_API cuGraphAddHostNode(CUgraphNode* node, CUgraph g, const CUgraphNode* deps, size_t n,
                             const CUDA_HOST_NODE_PARAMS* params) noexcept {
    VCUDA_TRACE_HOOK(cuGraphAddHostNode, node, g, deps, n, params);
    return add_node(node, g, deps, nullptr, n, "cuGraphAddHostNode", [&](node_spec& s) {
        return params ? host_spec(params->fn, params->userData, s) : CUDA_ERROR_INVALID_VALUE;
    });
}

VCUDA_API cuGraphAddMemAllocNode(CUgraphNode* node, CUgraph g, const CUgraphNode* deps, size_t n,
                                 CUDA_MEM_ALLOC_NODE_PARAMS* params) noexcept {
    VCUDA_TRACE_HOOK(cuGraphAddMemAllocNode, node, g, deps, n, params);
    return add_node(node, g, deps, nullptr, n, "cuGraphAddMemAllocNode", [&](node_spec& s) {
        return params ? alloc_spec(params->poolProps, params->accessDescs, params->accessDescCount,
                                   params->bytesize, &params->dptr, s)
                      : CUDA_ERROR_INVALID_VALUE;
    });
}

VCUDA_API cuGraphAddMemFreeNode(CUgraphNode* node, CUgraph g, const CUgraphNode* deps, size_t n,
                                CUdeviceptr dptr) noexcept {
    VCUDA_TRACE_HOOK(cuGraphAddMemFreeNode, node, g, deps, n, dptr);
    return add_node(node, g, deps, nullptr, n, "cuGraphAddMemFreeNode",
                    [&](node_spec& s) { return free_spec(dptr, s); });
}

VCUDA_API cuGraphAddEmptyNode(CUgraphNode* node, CUgraph g, const CUgraphNode* deps, size_t n) noexcept {
    VCUDA_TRACE_HOOK(cuGraphAddEmptyNode, node, g, deps, n);
    return add_node(node, g, deps, nullptr, n, "cuGraphAddEmptyNode",
                    [](node_spec&) { return CUDA_SUCCESS; });
}

VCUDA_API cuGraphAddChildGraphNode(CUgraphNode* node, CUgraph g, const CUgraphNode* deps, size_t n,
                                   CUgraph child) noexcept {
    VCUDA_TRACE_HOOK(cuGraphAddChildGraphNode, node, g, deps, n, child);
    const char* name = "cuGraphAddChildGraphNode";
    return add_node(node, g, deps, nullptr, n, name,
                    [&](node_spec& s) { return child_spec(child, CU_GRAPH_CHILD_GRAPH_OWNERSHIP_CLONE, s); });
}

VCUDA_API cuGraphAddEventRecordNode(CUgraphNode* node, CUgraph g, const CUgraphNode* deps, size_t n,
                                    CUevent event) noexcept {
    VCUDA_TRACE_HOOK(cuGraphAddEventRecordNode, node, g, deps, n, event);
    return add_node(node, g, deps, nullptr, n, "cuGraphAddEventRecordNode",
                    [&](node_spec& s) { return event_spec(CU_GRAPH_NODE_TYPE_EVENT_RECORD, event, s); });
}

VCUDA_API cuGraphAddEventWaitNode(CUgraphNode* node, CUgraph g, const CUgraphNode* deps, size_t n,
                                  CUevent event) noexcept {
    VCUDA_TRACE_HOOK(cuGraphAddEventWaitNode, node, g, deps, n, event);
    return add_node(node, g, deps, nullptr, n, "cuGraphAddEventWaitNode",
                    [&](node_spec& s) { return event_spec(CU_GRAPH_NODE_TYPE_WAIT_EVENT, event, s); });
}

VCUDA_API cuGraphAddDependencies(CUgraph g, const CUgraphNode* from, const CUgraphNode* to,
                                 size_t n) noexcept {
    VCUDA_TRACE_HOOK(cuGraphAddDependencies, g, from, to, n);
    return change_edges(g, from, to, nullptr, n, false, "cuGraphAddDependencies");
}

VCUDA_API cuGraphAddDependencies_v2(CUgraph g, const CUgraphNode* from, const CUgraphNode* to,
                                    const CUgraphEdgeData* edges, size_t n) noexcept {
    VCUDA_TRACE_HOOK(cuGraphAddDependencies_v2, g, from, to, edges, n);
    return change_edges(g, from, to, edges, n, false, "cuGraphAddDependencies_v2");
}

VCUDA_API cuGraphRemoveDependencies(CUgraph g, const CUgraphNode* from, const CUgraphNode* to,
                                    size_t n) noexcept {
    VCUDA_TRACE_HOOK(cuGraphRemoveDependencies, g, from, to, n);
    return change_edges(g, from, to, nullptr, n, true, "cuGraphRemoveDependencies");
}

VCUDA_API cuGraphRemoveDependencies_v2(CUgraph g, const CUgraphNode* from, const CUgraphNode* to,
                                       const CUgraphEdgeData* edges, size_t n) noexcept {
    VCUDA_TRACE_HOOK(cuGraphRemoveDependencies_v2, g, from, to, edges, n);
    return change_edges(g, from, to, edges, n, true, "cuGraphRemoveDependencies_v2");
}

// ---------------------------------------------------------------- changing kernel nodes

VCUDA_API cuGraphKernelNodeSetParams(CUgraphNode node, const CUDA_KERNEL_NODE_PARAMS_v1* params) noexcept {
    VCUDA_TRACE_HOOK(cuGraphKernelNodeSetParams, node, params);
    const char* name = "cuGraphKernelNodeSetParams";
    return set_kernel(nullptr, node, name, [&](node_spec& s) {
        return params ? kernel_spec(*params, nullptr, nullptr, s, name) : CUDA_ERROR_INVALID_VALUE;
    });
}

VCUDA_API cuGraphKernelNodeSetParams_v2(CUgraphNode node, const CUDA_KERNEL_NODE_PARAMS* params) noexcept {
    VCUDA_TRACE_HOOK(cuGraphKernelNodeSetParams_v2, node, params);
    const char* name = "cuGraphKernelNodeSetParams_v2";
    return set_kernel(nullptr, node, name, [&](node_spec& s) {
        return params ? kernel_spec(*params, params->kern, params->ctx, s, name) : CUDA_ERROR_INVALID_VALUE;
    });
}

namespace {
// cuGraphNodeSetParams / cuGraphExecNodeSetParams: kernel, memset, memcpy, host and event nodes (and child
// graph nodes of an executable graph); the type must be the node's.
CUresult set_params(CUgraphExec exec, CUgraphNode node, CUgraphNodeParams* params, const char* name) {
    VCUDA_REQUIRE_INIT();
    handle_info n;
    if (!params || !node_info(node, n) || n.node_type != params->type) return CUDA_ERROR_INVALID_VALUE;
    switch (params->type) {
        case CU_GRAPH_NODE_TYPE_KERNEL:
            return set_kernel(exec, node, name, [&](node_spec& s) { return spec_of(params, s, name); });
        case CU_GRAPH_NODE_TYPE_GRAPH:
            if (exec) return cuGraphExecChildGraphNodeSetParams(exec, node, params->graph.graph);
            break;
        case CU_GRAPH_NODE_TYPE_MEMSET:
        case CU_GRAPH_NODE_TYPE_MEMCPY:
        case CU_GRAPH_NODE_TYPE_HOST:
        case CU_GRAPH_NODE_TYPE_WAIT_EVENT:
        case CU_GRAPH_NODE_TYPE_EVENT_RECORD:
            return set_node(exec, node, params->type, name,
                            [&](node_spec& s) { return spec_of(params, s, name); });
        default:
            break;
    }
    std::string what =
        std::string(name) + " (node type " + std::to_string(static_cast<int>(params->type)) + ")";
    return static_cast<CUresult>(unsupported(what.c_str()));
}
}  // namespace

VCUDA_API cuGraphNodeSetParams(CUgraphNode node, CUgraphNodeParams* params) noexcept {
    VCUDA_TRACE_HOOK(cuGraphNodeSetParams, node, params);
    return set_params(nullptr, node, params, "cuGraphNodeSetParams");
}

VCUDA_API cuGraphExecKernelNodeSetParams(CUgraphExec exec, CUgraphNode node,
                                         const CUDA_KERNEL_NODE_PARAMS_v1* params) noexcept {
    VCUDA_TRACE_HOOK(cuGraphExecKernelNodeSetParams, exec, node, params);
    const char* name = "cuGraphExecKernelNodeSetParams";
    if (!exec) return CUDA_ERROR_INVALID_VALUE;
    return set_kernel(exec, node, name, [&](node_spec& s) {
        return params ? kernel_spec(*params, nullptr, nullptr, s, name) : CUDA_ERROR_INVALID_VALUE;
    });
}

VCUDA_API cuGraphExecKernelNodeSetParams_v2(CUgraphExec exec, CUgraphNode node,
                                            const CUDA_KERNEL_NODE_PARAMS* params) noexcept {
    VCUDA_TRACE_HOOK(cuGraphExecKernelNodeSetParams_v2, exec, node, params);
    const char* name = "cuGraphExecKernelNodeSetParams_v2";
    if (!exec) return CUDA_ERROR_INVALID_VALUE;
    return set_kernel(exec, node, name, [&](node_spec& s) {
        return params ? kernel_spec(*params, params->kern, params->ctx, s, name) : CUDA_ERROR_INVALID_VALUE;
    });
}

VCUDA_API cuGraphExecNodeSetParams(CUgraphExec exec, CUgraphNode node, CUgraphNodeParams* params) noexcept {
    VCUDA_TRACE_HOOK(cuGraphExecNodeSetParams, exec, node, params);
    if (!exec) return CUDA_ERROR_INVALID_VALUE;
    return set_params(exec, node, params, "cuGraphExecNodeSetParams");
}

// ---------------------------------------------------------------- changing other nodes

VCUDA_API cuGraphMemsetNodeSetParams(CUgraphNode node, const CUDA_MEMSET_NODE_PARAMS* params) noexcept {
    VCUDA_TRACE_HOOK(cuGraphMemsetNodeSetParams, node, params);
    const char* name = "cuGraphMemsetNodeSetParams";
    return set_node(nullptr, node, CU_GRAPH_NODE_TYPE_MEMSET, name, [&](node_spec& s) {
        return params ? memset_spec(*params, nullptr, s, name) : CUDA_ERROR_INVALID_VALUE;
    });
}

VCUDA_API cuGraphExecMemsetNodeSetParams(CUgraphExec exec, CUgraphNode node,
                                         const CUDA_MEMSET_NODE_PARAMS* params, CUcontext ctx) noexcept {
    VCUDA_TRACE_HOOK(cuGraphExecMemsetNodeSetParams, exec, node, params, ctx);
    const char* name = "cuGraphExecMemsetNodeSetParams";
    if (!exec) return CUDA_ERROR_INVALID_VALUE;
    return set_node(exec, node, CU_GRAPH_NODE_TYPE_MEMSET, name, [&](node_spec& s) {
        return params ? memset_spec(*params, ctx, s, name) : CUDA_ERROR_INVALID_VALUE;
    });
}

VCUDA_API cuGraphMemcpyNodeSetParams(CUgraphNode node, const CUDA_MEMCPY3D* params) noexcept {
    VCUDA_TRACE_HOOK(cuGraphMemcpyNodeSetParams, node, params);
    const char* name = "cuGraphMemcpyNodeSetParams";
    return set_node(nullptr, node, CU_GRAPH_NODE_TYPE_MEMCPY, name, [&](node_spec& s) {
        return params ? memcpy_spec(*params, nullptr, s, name) : CUDA_ERROR_INVALID_VALUE;
    });
}

VCUDA_API cuGraphExecMemcpyNodeSetParams(CUgraphExec exec, CUgraphNode node, const CUDA_MEMCPY3D* params,
                                         CUcontext ctx) noexcept {
    VCUDA_TRACE_HOOK(cuGraphExecMemcpyNodeSetParams, exec, node, params, ctx);
    const char* name = "cuGraphExecMemcpyNodeSetParams";
    if (!exec) return CUDA_ERROR_INVALID_VALUE;
    return set_node(exec, node, CU_GRAPH_NODE_TYPE_MEMCPY, name, [&](node_spec& s) {
        return params ? memcpy_spec(*params, ctx, s, name) : CUDA_ERROR_INVALID_VALUE;
    });
}

// The function and data of a host node: the server names the host function the client registered for it (an
// explicit node's, or one captured from a stream), and the registry here gives them back.
VCUDA_API cuGraphHostNodeGetParams(CUgraphNode node, CUDA_HOST_NODE_PARAMS* params) noexcept {
    VCUDA_TRACE_HOOK(cuGraphHostNodeGetParams, node, params);
    VCUDA_REQUIRE_INIT();
    if (!params || !node_of_type(node, CU_GRAPH_NODE_TYPE_HOST)) return CUDA_ERROR_INVALID_VALUE;
    graph_node_object_call c("cuGraphHostNodeGetParams", node, 2);
    if (CUresult rc = c.send_sync(); rc != CUDA_SUCCESS) return rc;
    CUhostFn fn = nullptr;
    void* data = nullptr;
    if (!graph_host_function_of(c.object(), fn, data)) return CUDA_ERROR_INVALID_VALUE;
    params->fn = fn;
    params->userData = data;
    return CUDA_SUCCESS;
}

VCUDA_API cuGraphHostNodeSetParams(CUgraphNode node, const CUDA_HOST_NODE_PARAMS* params) noexcept {
    VCUDA_TRACE_HOOK(cuGraphHostNodeSetParams, node, params);
    return set_node(nullptr, node, CU_GRAPH_NODE_TYPE_HOST, "cuGraphHostNodeSetParams", [&](node_spec& s) {
        return params ? host_spec(params->fn, params->userData, s) : CUDA_ERROR_INVALID_VALUE;
    });
}

VCUDA_API cuGraphExecHostNodeSetParams(CUgraphExec exec, CUgraphNode node,
                                       const CUDA_HOST_NODE_PARAMS* params) noexcept {
    VCUDA_TRACE_HOOK(cuGraphExecHostNodeSetParams, exec, node, params);
    if (!exec) return CUDA_ERROR_INVALID_VALUE;
    return set_node(exec, node, CU_GRAPH_NODE_TYPE_HOST, "cuGraphExecHostNodeSetParams", [&](node_spec& s) {
        return params ? host_spec(params->fn, params->userData, s) : CUDA_ERROR_INVALID_VALUE;
    });
}

VCUDA_API cuGraphEventRecordNodeSetEvent(CUgraphNode node, CUevent event) noexcept {
    VCUDA_TRACE_HOOK(cuGraphEventRecordNodeSetEvent, node, event);
    return set_event(nullptr, node, CU_GRAPH_NODE_TYPE_EVENT_RECORD, event, "cuGraphEventRecordNodeSetEvent");
}

VCUDA_API cuGraphExecEventRecordNodeSetEvent(CUgraphExec exec, CUgraphNode node, CUevent event) noexcept {
    VCUDA_TRACE_HOOK(cuGraphExecEventRecordNodeSetEvent, exec, node, event);
    if (!exec) return CUDA_ERROR_INVALID_VALUE;
    return set_event(exec, node, CU_GRAPH_NODE_TYPE_EVENT_RECORD, event,
                     "cuGraphExecEventRecordNodeSetEvent");
}

VCUDA_API cuGraphEventWaitNodeSetEvent(CUgraphNode node, CUevent event) noexcept {
    VCUDA_TRACE_HOOK(cuGraphEventWaitNodeSetEvent, node, event);
    return set_event(nullptr, node, CU_GRAPH_NODE_TYPE_WAIT_EVENT, event, "cuGraphEventWaitNodeSetEvent");
}

VCUDA_API cuGraphExecEventWaitNodeSetEvent(CUgraphExec exec, CUgraphNode node, CUevent event) noexcept {
    VCUDA_TRACE_HOOK(cuGraphExecEventWaitNodeSetEvent, exec, node, event);
    if (!exec) return CUDA_ERROR_INVALID_VALUE;
    return set_event(exec, node, CU_GRAPH_NODE_TYPE_WAIT_EVENT, event, "cuGraphExecEventWaitNodeSetEvent");
}

namespace {
// cuGraphExecUpdate*: the executable graph takes `g`'s work when their topologies match; the result and the
// nodes that failed come back also when they do not.
CUresult exec_update(CUgraphExec exec, CUgraph g, CUgraphExecUpdateResultInfo& info, const char* name) {
    VCUDA_REQUIRE_INIT();
    info = {};
    info.result = CU_GRAPH_EXEC_UPDATE_ERROR;
    graph_exec_update_call c(name, exec, g);
    CUresult rc = c.send_sync();
    if (c.reply().outs.size() < 5) {  // an earlier queued call's error took the reply
        if (rc == CUDA_SUCCESS) info.result = CU_GRAPH_EXEC_UPDATE_SUCCESS;
        return rc;
    }
    info.result = static_cast<CUgraphExecUpdateResult>(c.result());
    auto node = [&](uint64_t id, unsigned type) {
        return id ? adopt_node(id, id_of(g), static_cast<CUgraphNodeType>(type)) : nullptr;
    };
    info.errorNode = node(c.error_node(), c.error_type());
    info.errorFromNode = node(c.from_node(), c.from_type());
    return rc;
}
}  // namespace

VCUDA_API cuGraphExecUpdate_v2(CUgraphExec exec, CUgraph g, CUgraphExecUpdateResultInfo* result) noexcept {
    VCUDA_TRACE_HOOK(cuGraphExecUpdate_v2, exec, g, result);
    if (!result) return CUDA_ERROR_INVALID_VALUE;
    return exec_update(exec, g, *result, "cuGraphExecUpdate_v2");
}

// The pre-12.0 form: the failing node and the result only.
VCUDA_API cuGraphExecUpdate(CUgraphExec exec, CUgraph g, CUgraphNode* error_node,
                            CUgraphExecUpdateResult* result) noexcept {
    VCUDA_TRACE_HOOK(cuGraphExecUpdate, exec, g, error_node, result);
    if (!error_node || !result) return CUDA_ERROR_INVALID_VALUE;
    CUgraphExecUpdateResultInfo info;
    CUresult rc = exec_update(exec, g, info, "cuGraphExecUpdate");
    *error_node = info.errorNode;
    *result = info.result;
    return rc;
}

// ---------------------------------------------------------------- graph memory figures

namespace {
CUresult graph_mem_attribute(CUdevice dev, CUgraphMem_attribute attr, void* value, bool set,
                             const char* name) {
    VCUDA_REQUIRE_INIT();
    if (!value || static_cast<unsigned>(attr) > CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH)
        return CUDA_ERROR_INVALID_VALUE;
    CUmemLocation loc{CU_MEM_LOCATION_TYPE_DEVICE, dev};
    if (CUresult rc = server_location(loc); rc != CUDA_SUCCESS) return CUDA_ERROR_INVALID_DEVICE;
    cuuint64_t v = 0;
    if (set) std::memcpy(&v, value, sizeof v);
    graph_mem_attribute_call c(name, dev, static_cast<unsigned>(attr), set, v);
    if (CUresult rc = c.send_sync(); rc != CUDA_SUCCESS) return rc;
    if (!set) {
        v = c.current();
        std::memcpy(value, &v, sizeof v);
    }
    return CUDA_SUCCESS;
}
}  // namespace

VCUDA_API cuDeviceGetGraphMemAttribute(CUdevice device, CUgraphMem_attribute attr, void* value) noexcept {
    VCUDA_TRACE_HOOK(cuDeviceGetGraphMemAttribute, device, attr, value);
    return graph_mem_attribute(device, attr, value, false, "cuDeviceGetGraphMemAttribute");
}

VCUDA_API cuDeviceSetGraphMemAttribute(CUdevice device, CUgraphMem_attribute attr, void* value) noexcept {
    VCUDA_TRACE_HOOK(cuDeviceSetGraphMemAttribute, device, attr, value);
    return graph_mem_attribute(device, attr, value, true, "cuDeviceSetGraphMemAttribute");
}

// ---------------------------------------------------------------- conditional nodes and capture dependencies

VCUDA_API cuGraphConditionalHandleCreate(CUgraphConditionalHandle* handle, CUgraph g, CUcontext ctx,
                                         unsigned int default_value, unsigned int flags) noexcept {
    VCUDA_TRACE_HOOK(cuGraphConditionalHandleCreate, handle, g, ctx, default_value, flags);
    VCUDA_REQUIRE_INIT();
    const char* name = "cuGraphConditionalHandleCreate";
    if (!handle || !state::get().known(id_of(g), handle_kind::graph)) return CUDA_ERROR_INVALID_VALUE;
    if (CUresult rc = node_context(ctx, name); rc != CUDA_SUCCESS) return rc;
    conditional_handle_create_call c(name, g, default_value, flags);
    if (CUresult rc = c.send_sync(); rc != CUDA_SUCCESS) return rc;
    *handle = c.value();
    return CUDA_SUCCESS;
}

namespace {
CUresult update_capture_dependencies(CUstream s, const CUgraphNode* nodes, const CUgraphEdgeData* edges,
                                     size_t n, unsigned flags, const char* name) {
    VCUDA_REQUIRE_INIT();
    if (flags > CU_STREAM_SET_CAPTURE_DEPENDENCIES) return CUDA_ERROR_INVALID_VALUE;
    std::vector<uint64_t> ids;
    if (CUresult rc = node_ids(nodes, n, ids); rc != CUDA_SUCCESS) return rc;
    return capture_update_dependencies_call(name, s, flags, std::as_bytes(std::span(ids)),
                                            edge_bytes(edges, n))
        .send_sync();
}
}  // namespace

VCUDA_API cuStreamUpdateCaptureDependencies(CUstream s, CUgraphNode* nodes, size_t n,
                                            unsigned int flags) noexcept {
    VCUDA_TRACE_HOOK(cuStreamUpdateCaptureDependencies, s, nodes, n, flags);
    return update_capture_dependencies(s, nodes, nullptr, n, flags, "cuStreamUpdateCaptureDependencies");
}

VCUDA_API cuStreamUpdateCaptureDependencies_v2(CUstream s, CUgraphNode* nodes, const CUgraphEdgeData* edges,
                                               size_t n, unsigned int flags) noexcept {
    VCUDA_TRACE_HOOK(cuStreamUpdateCaptureDependencies_v2, s, nodes, edges, n, flags);
    return update_capture_dependencies(s, nodes, edges, n, flags, "cuStreamUpdateCaptureDependencies_v2");
}

namespace vcuda::client {
// The nodes `s`'s next captured work follows, in the capture's graph `graph` (client/api_stream.cpp).
CUresult capture_dependencies(CUstream s, uint64_t graph, std::vector<CUgraphNode>& nodes,
                              std::vector<CUgraphEdgeData>& edges) {
    capture_dependencies_call c("cuStreamGetCaptureInfo_v3", s, reinterpret_cast<CUgraph>(graph));
    if (CUresult rc = c.send_sync(); rc != CUDA_SUCCESS) return rc;
    const size_t n = c.count();
    const auto listed = c.listed();
    if (listed.size() != 2 * n) return CUDA_ERROR_UNKNOWN;
    nodes.clear();
    for (size_t i = 0; i < n; ++i)
        nodes.push_back(adopt_node(listed[2 * i], graph, static_cast<CUgraphNodeType>(listed[2 * i + 1])));
    edges.assign(n, CUgraphEdgeData{});
    if (const auto data = c.edge_data(); !data.empty()) {  // empty: the driver gave no edge data
        if (data.size() != n * sizeof(CUgraphEdgeData)) return CUDA_ERROR_UNKNOWN;
        std::memcpy(edges.data(), data.data(), data.size());
    }
    return CUDA_SUCCESS;
}
}  // namespace vcuda::client

// ---------------------------------------------------------------- what a node holds

VCUDA_API cuGraphEventRecordNodeGetEvent(CUgraphNode node, CUevent* event_out) noexcept {
    VCUDA_TRACE_HOOK(cuGraphEventRecordNodeGetEvent, node, event_out);
    return node_object(node, CU_GRAPH_NODE_TYPE_EVENT_RECORD, event_out, "cuGraphEventRecordNodeGetEvent");
}

VCUDA_API cuGraphEventWaitNodeGetEvent(CUgraphNode node, CUevent* event_out) noexcept {
    VCUDA_TRACE_HOOK(cuGraphEventWaitNodeGetEvent, node, event_out);
    return node_object(node, CU_GRAPH_NODE_TYPE_WAIT_EVENT, event_out, "cuGraphEventWaitNodeGetEvent");
}

VCUDA_API cuGraphChildGraphNodeGetGraph(CUgraphNode node, CUgraph* graph) noexcept {
    VCUDA_TRACE_HOOK(cuGraphChildGraphNodeGetGraph, node, graph);
    return node_object(node, CU_GRAPH_NODE_TYPE_GRAPH, graph, "cuGraphChildGraphNodeGetGraph");
}

VCUDA_API cuGraphKernelNodeGetParams(CUgraphNode node, CUDA_KERNEL_NODE_PARAMS_v1* params) noexcept {
    VCUDA_TRACE_HOOK(cuGraphKernelNodeGetParams, node, params);
    if (!params) return CUDA_ERROR_INVALID_VALUE;
    CUDA_KERNEL_NODE_PARAMS_v2 p;
    if (CUresult rc = kernel_node_params(node, p, "cuGraphKernelNodeGetParams"); rc != CUDA_SUCCESS)
        return rc;
    *params = {p.func,      p.gridDimX,  p.gridDimY,       p.gridDimZ,     p.blockDimX,
               p.blockDimY, p.blockDimZ, p.sharedMemBytes, p.kernelParams, p.extra};
    return CUDA_SUCCESS;
}

VCUDA_API cuGraphKernelNodeGetParams_v2(CUgraphNode node, CUDA_KERNEL_NODE_PARAMS* params) noexcept {
    VCUDA_TRACE_HOOK(cuGraphKernelNodeGetParams_v2, node, params);
    if (!params) return CUDA_ERROR_INVALID_VALUE;
    return kernel_node_params(node, *params, "cuGraphKernelNodeGetParams_v2");
}

VCUDA_API cuGraphMemsetNodeGetParams(CUgraphNode node, CUDA_MEMSET_NODE_PARAMS* params) noexcept {
    VCUDA_TRACE_HOOK(cuGraphMemsetNodeGetParams, node, params);
    VCUDA_REQUIRE_INIT();
    if (!params || !node_of_type(node, CU_GRAPH_NODE_TYPE_MEMSET)) return CUDA_ERROR_INVALID_VALUE;
    graph_memset_node_params_call c("cuGraphMemsetNodeGetParams", node);
    if (CUresult rc = c.send_sync(); rc != CUDA_SUCCESS) return rc;
    *params = {c.dst(), c.pitch(), c.value(), c.element_size(), c.width(), c.height()};
    return CUDA_SUCCESS;
}

// A memcpy node's copy as the application gave it: the server's answer (arrays as handles here), a side in
// this process's own memory taken from its host copy's registration, shared pinned memory by its address
// here.
VCUDA_API cuGraphMemcpyNodeGetParams(CUgraphNode node, CUDA_MEMCPY3D* params) noexcept {
    VCUDA_TRACE_HOOK(cuGraphMemcpyNodeGetParams, node, params);
    VCUDA_REQUIRE_INIT();
    if (!params || !node_of_type(node, CU_GRAPH_NODE_TYPE_MEMCPY)) return CUDA_ERROR_INVALID_VALUE;
    graph_memcpy_node_params_call c("cuGraphMemcpyNodeGetParams", node);
    if (CUresult rc = c.send_sync(); rc != CUDA_SUCCESS) return rc;
    CUDA_MEMCPY3D p;
    if (c.copy().size() != sizeof p) return CUDA_ERROR_UNKNOWN;
    std::memcpy(&p, c.copy().data(), sizeof p);
    host_copy_side mine;
    const uint64_t host_copy = c.host_copy();
    if (host_copy && !graph_host_copy_of(host_copy, mine)) return CUDA_ERROR_UNKNOWN;
    auto& st = state::get();
    auto to_client = [&](CUmemorytype type, bool source, auto& host, size_t& x, size_t& y, size_t& z,
                         size_t& pitch, size_t& height) {
        if (type != CU_MEMORYTYPE_HOST) return true;
        if (host_copy && mine.to_device == source) {
            host = mine.base;
            std::tie(x, y, z, pitch, height) = std::tie(mine.x, mine.y, mine.z, mine.pitch, mine.height);
            return true;
        }
        host_allocation h;
        const auto at = reinterpret_cast<uint64_t>(host);
        if (!st.find_host_shared_at(at, &st.remote(), h)) return false;
        host = reinterpret_cast<char*>(h.base + (at - h.server_addr));
        return true;
    };
    if (!to_client(p.srcMemoryType, true, p.srcHost, p.srcXInBytes, p.srcY, p.srcZ, p.srcPitch,
                   p.srcHeight) ||
        !to_client(p.dstMemoryType, false, p.dstHost, p.dstXInBytes, p.dstY, p.dstZ, p.dstPitch, p.dstHeight))
        return CUDA_ERROR_UNKNOWN;
    *params = p;
    return CUDA_SUCCESS;
}

VCUDA_API cuGraphMemAllocNodeGetParams(CUgraphNode node, CUDA_MEM_ALLOC_NODE_PARAMS* params) noexcept {
    VCUDA_TRACE_HOOK(cuGraphMemAllocNodeGetParams, node, params);
    VCUDA_REQUIRE_INIT();
    if (!params || !node_of_type(node, CU_GRAPH_NODE_TYPE_MEM_ALLOC)) return CUDA_ERROR_INVALID_VALUE;
    graph_mem_node_params_call c("cuGraphMemAllocNodeGetParams", node);
    if (CUresult rc = c.send_sync(); rc != CUDA_SUCCESS) return rc;
    const auto props_blob = c.pool_props(), access_blob = c.access();
    if (props_blob.size() != sizeof(CUmemPoolProps) || access_blob.size() % sizeof(CUmemAccessDesc) != 0)
        return CUDA_ERROR_UNKNOWN;
    CUmemPoolProps props;
    std::memcpy(&props, props_blob.data(), sizeof props);
    std::vector<CUmemAccessDesc> access(access_blob.size() / sizeof(CUmemAccessDesc));
    std::memcpy(access.data(), access_blob.data(), access_blob.size());
    auto& st = state::get();
    auto to_client = [&](CUmemLocation& loc) {  // the server's device index -> this process's ordinal
        if (loc.type == CU_MEM_LOCATION_TYPE_DEVICE) loc.id = st.client_device(loc.id);
    };
    to_client(props.location);
    for (auto& a : access) to_client(a.location);
    // The array lives with the node: the mirror keeps the first answer (the node's parameters never change).
    auto kept = std::make_shared<const std::vector<CUmemAccessDesc>>(std::move(access));
    st.amend(id_of(node), [&](handle_info& h) {
        if (h.node_access)
            kept = h.node_access;
        else
            h.node_access = kept;
    });
    *params = {};
    params->poolProps = props;
    params->accessDescs = kept->empty() ? nullptr : kept->data();
    params->accessDescCount = kept->size();
    params->bytesize = c.bytes();
    params->dptr = c.address();
    return CUDA_SUCCESS;
}

VCUDA_API cuGraphMemFreeNodeGetParams(CUgraphNode node, CUdeviceptr* dptr) noexcept {
    VCUDA_TRACE_HOOK(cuGraphMemFreeNodeGetParams, node, dptr);
    VCUDA_REQUIRE_INIT();
    if (!dptr || !node_of_type(node, CU_GRAPH_NODE_TYPE_MEM_FREE)) return CUDA_ERROR_INVALID_VALUE;
    graph_mem_node_params_call c("cuGraphMemFreeNodeGetParams", node);
    if (CUresult rc = c.send_sync(); rc != CUDA_SUCCESS) return rc;
    *dptr = c.address();
    return CUDA_SUCCESS;
}

VCUDA_API cuGraphNodeFindInClone(CUgraphNode* copy, CUgraphNode node, CUgraph clone) noexcept {
    VCUDA_TRACE_HOOK(cuGraphNodeFindInClone, copy, node, clone);
    VCUDA_REQUIRE_INIT();
    handle_info info;
    if (!copy || !node_info(node, info)) return CUDA_ERROR_INVALID_VALUE;
    graph_find_in_clone_call c("cuGraphNodeFindInClone", node, clone);
    if (CUresult rc = c.send_sync(); rc != CUDA_SUCCESS) return rc;
    *copy = adopt_node(c.copy_id(), id_of(clone), static_cast<CUgraphNodeType>(c.type()));
    return CUDA_SUCCESS;
}
