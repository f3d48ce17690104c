// Hand-written ops for stream capture and graphs. Capture itself needs nothing here: the calls a capturing
// thread makes arrive in order on its lane, whose thread is the one the driver sees capturing. What is here
// keeps the session's handle table right: the graph a capture records into is the driver's until
// cuStreamEndCapture hands it over (entered `owned`, so never destroyed on its own), and the application's
// from then on. Graph nodes are session handles owned by their graph (erased with it, handle_table.hpp):
// those made by the client's calls are entered when made, those the driver made (captured work, a cloned
// child graph's) when first reported. Every node, graph, function, event and device range a node names is
// checked like a launch's, memset's or copy's is. Two things a capture cannot record itself are added to it
// here: copies with the client's memory (server/host_functions.hpp) and stream-ordered allocations' holds.
// Graph allocations (memory alloc nodes) are the session's while a graph holding their node lives (a user
// object of that graph, server/handlers_graph.hpp). The plain graph calls (create, clone, destroy, launch,
// upload, node destroy, graph memory trim) are generated; so is the child graph update's client side, its
// server side is here (the suspend follows it).
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <span>
#include <utility>
#include <vector>

#include "server/call_context.hpp"
#include "server/handlers_array.hpp"
#include "server/handlers_graph.hpp"
#include "server/host_functions.hpp"
#include "server/kernel_args.hpp"
#include "server_ops.hpp"

namespace vcuda::server {

namespace {

bool valid_capture_mode(uint64_t m) { return m <= CU_STREAM_CAPTURE_MODE_RELAXED; }

// The type the client sees of a node the driver reports as `type`: a host copy's child graph node is a memcpy
// node.
CUgraphNodeType seen_type(const driver_table& d, CUgraphNode node, CUgraphNodeType type) {
    return type == CU_GRAPH_NODE_TYPE_GRAPH && is_host_copy_node(d, node) ? CU_GRAPH_NODE_TYPE_MEMCPY : type;
}

// The type the driver reports for a node of the session.
CUresult node_type(call_context& cx, CUgraphNode node, CUgraphNodeType& type) {
    auto& d = cx.drv();
    if (!d.cuGraphNodeGetType) return cx.unsupported("cuGraphNodeGetType");
    return d.cuGraphNodeGetType(node, &type);
}

// This lane's thread takes the client thread's capture mode (cuThreadExchangeStreamCaptureMode): it decides
// which calls the driver allows while a capture is under way.
CUresult set_thread_capture_mode(call_context& cx, uint64_t mode) {
    auto& d = cx.drv();
    if (!d.cuThreadExchangeStreamCaptureMode) return cx.unsupported("cuThreadExchangeStreamCaptureMode");
    auto m = static_cast<CUstreamCaptureMode>(mode);
    return d.cuThreadExchangeStreamCaptureMode(&m);
}

// The mode the driver begins a capture in. The driver applies a GLOBAL capture's rule to every thread of its
// process that is in GLOBAL mode: under server threads those include other tenants' lanes, whose allocations
// and registrations it would refuse and whose calls would invalidate the capture. So there the capture begins
// THREAD_LOCAL, which binds the capturing thread exactly as GLOBAL does and no other thread (also none of the
// same application: its other threads act as if THREAD_LOCAL while it captures). A worker process serves one
// session, and keeps the application's mode.
CUstreamCaptureMode driver_capture_mode(const call_context& cx, uint64_t asked) {
    auto mode = static_cast<CUstreamCaptureMode>(asked);
    if (mode == CU_STREAM_CAPTURE_MODE_GLOBAL && !cx.sess.alone_in_process())
        return CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
    return mode;
}

// The capture status and id of `s` and the graph it records into (graph may be null).
CUresult capture_info(call_context& cx, CUstream s, CUstreamCaptureStatus& status, cuuint64_t& id,
                      CUgraph* graph) {
    auto& d = cx.drv();
    if (d.cuStreamGetCaptureInfo_v3)
        return d.cuStreamGetCaptureInfo_v3(s, &status, &id, graph, nullptr, nullptr, nullptr);
    if (d.cuStreamGetCaptureInfo_v2)
        return d.cuStreamGetCaptureInfo_v2(s, &status, &id, graph, nullptr, nullptr);
    return cx.unsupported("cuStreamGetCaptureInfo_v3");
}

// The capture just begun on `s`: its id and graph. Without them the client could not follow the capture, so
// it is undone (its graph destroyed, unless it is the application's: `into` non-null).
CUresult begun_capture(call_context& cx, CUstream s, CUgraph into, cuuint64_t& id, CUgraph& g) {
    auto& d = cx.drv();
    CUstreamCaptureStatus status{};
    CUresult rc = capture_info(cx, s, status, id, &g);
    if (rc == CUDA_SUCCESS && g) return CUDA_SUCCESS;
    CUgraph undone = nullptr;
    if (d.cuStreamEndCapture(s, &undone) == CUDA_SUCCESS && undone && !into && d.cuGraphDestroy)
        d.cuGraphDestroy(undone);
    return rc != CUDA_SUCCESS ? rc : cx.fail(CUDA_ERROR_UNKNOWN, "the driver named no graph for the capture");
}

// At most this many nodes in one array (dependencies, edges, node lists): more is a malformed call. A
// listing's reply (two words a node) stays well inside a frame's metadata limit.
constexpr size_t max_nodes = size_t{1} << 17;

// The node ids in blob `i` (8 bytes each), each looked up in the session's table.
CUresult node_list(call_context& cx, std::span<const std::byte> b, std::vector<CUgraphNode>& out) {
    if (b.size() % sizeof(uint64_t) || b.size() / sizeof(uint64_t) > max_nodes) return cx.bad_arguments();
    out.resize(b.size() / sizeof(uint64_t));
    for (size_t k = 0; k < out.size(); ++k) {
        uint64_t id;
        std::memcpy(&id, b.data() + k * sizeof id, sizeof id);
        void* raw = nullptr;
        if (CUresult rc = cx.lookup(id, handle_kind::graph_node, raw); rc != CUDA_SUCCESS) return rc;
        out[k] = static_cast<CUgraphNode>(raw);
    }
    return CUDA_SUCCESS;
}

// The edge data in blob `i`: none (null), or one CUgraphEdgeData per edge, copied (aligned) into `store`.
CUresult edge_list(call_context& cx, std::span<const std::byte> b, size_t edges,
                   std::vector<CUgraphEdgeData>& store, const CUgraphEdgeData*& out) {
    out = nullptr;
    if (b.empty()) return CUDA_SUCCESS;
    if (b.size() != edges * sizeof(CUgraphEdgeData)) return cx.bad_arguments();
    store.resize(edges);
    std::memcpy(store.data(), b.data(), b.size());
    out = store.data();
    return CUDA_SUCCESS;
}

// A new node's (or capture's) dependencies: the nodes in blob 0, their edge data in blob 1.
struct dependencies {
    std::vector<CUgraphNode> nodes;
    std::vector<CUgraphEdgeData> edge_store;
    const CUgraphEdgeData* edges = nullptr;  // null: default edges

    CUresult read(call_context& cx, std::span<const std::byte> node_ids,
                  std::span<const std::byte> edge_data) {
        if (CUresult rc = node_list(cx, node_ids, nodes); rc != CUDA_SUCCESS) return rc;
        return edge_list(cx, edge_data, nodes.size(), edge_store, edges);
    }
};

// A suspend makes an executable graph again from a clone of the graph it came from (server/graph_image.cpp):
// kept at instantiation (with its flags), replaced when cuGraphExecUpdate succeeds (`flags` null: as they
// were).
void keep_origin(call_context& cx, uint64_t exec, CUgraph g, const cuuint64_t* flags, uint64_t source = 0) {
    if (!cx.sess.keeps_graphs()) return;  // --suspend-graphs off: nothing is kept, nothing costs
    auto& d = cx.drv();
    // The driver's work outside the session's lock: no suspend runs while this call is inside the gate.
    CUgraph clone = nullptr;
    const bool cloned = d.cuGraphClone && d.cuGraphClone(&clone, g) == CUDA_SUCCESS;
    CUgraph old = nullptr;
    graph_exec_origins::origin gone;  // the old clone's children: the new graph has its own
    {
        std::lock_guard lock(cx.sess.mu);
        auto& o = cx.sess.graph_execs.add(exec);
        if (!cloned) {
            o.not_kept = "an instantiation whose graph could not be cloned";
            return;
        }
        gone.children.swap(o.children);
        old = o.clone;
        // Made again from `old` by a suspend: the executable graph's nodes are old's, and stay so.
        if (old && !o.nodes.empty()) {
            o.retired.push_back(old);
            old = nullptr;
        }
        o.clone = clone;
        if (flags) o.flags = *flags;
        if (source) o.source = source;
    }
    if (old) d.cuGraphDestroy(old);
    gone.drop_children(d);
}

// Executable graph `exec` was changed in a way its clone does not follow (`what`): a suspend is refused.
void not_kept(call_context& cx, uint64_t exec, const char* what) {
    std::lock_guard lock(cx.sess.mu);
    if (auto* o = cx.sess.graph_execs.find(exec)) o->not_kept = what;
}

// The node of executable graph `exec`'s clone that the application's `node` (handle `node_id`) stands for,
// or null: nothing kept, a change not followed already, or one that cannot be followed now (noted). Once a
// child graph of the executable graph was replaced, a node inside a child graph is not followed: it may be
// the replaced child's, which a suspend does not read.
CUgraphNode clone_node(call_context& cx, uint64_t exec, uint64_t node_id, CUgraphNode node) {
    if (!cx.sess.keeps_graphs()) return nullptr;
    auto& d = cx.drv();
    CUgraph clone = nullptr;
    CUgraphNode copy = nullptr;
    {
        std::lock_guard lock(cx.sess.mu);
        auto* o = cx.sess.graph_execs.find(exec);
        if (!o || !o->clone || !o->not_kept.empty()) return nullptr;
        if (!o->children.empty()) {
            const handle_entry* e = cx.sess.handles.find(node_id, handle_kind::graph_node);
            if (!e || !o->source || e->owner != o->source) {
                o->not_kept = "an update of a node inside a child graph after a child graph was replaced";
                return nullptr;
            }
        }
        clone = o->clone;
        // Made again from the clone (and not updated past it since): its node is the clone's.
        if (auto it = o->nodes.find(node); it != o->nodes.end() && o->retired.empty()) copy = it->second;
    }
    if (!copy && d.cuGraphNodeFindInClone && d.cuGraphNodeFindInClone(&copy, node, clone) != CUDA_SUCCESS)
        copy = nullptr;
    if (!copy) not_kept(cx, exec, "a node update the server could not follow");
    return copy;
}

// An update of `node` (handle `node_id`) in executable graph `exec`, made on its clone too through `set`; one
// the clone cannot follow is noted, and a suspend is then refused.
template <class Set>
void follow_update(call_context& cx, uint64_t exec, uint64_t node_id, CUgraphNode node, Set&& set) {
    CUgraphNode copy = clone_node(cx, exec, node_id, node);
    if (copy && set(copy) != CUDA_SUCCESS) not_kept(cx, exec, "a node update the server could not follow");
}

// The node an executable-graph call names: after a suspend, the node of the clone it was made from.
CUgraphNode exec_node(call_context& cx, uint64_t exec, CUgraphNode node) {
    if (!cx.sess.keeps_graphs()) return node;
    std::lock_guard lock(cx.sess.mu);
    return cx.sess.graph_execs.node_in(exec, node);
}

}  // namespace

// The graph is the driver's until the capture ends (owned: not the application's to destroy yet).
CUresult handle_begin_capture(call_context& cx, const begin_capture_args& a) {
    if (!valid_capture_mode(a.mode) || !valid_capture_mode(a.thread_mode)) return cx.bad_arguments();
    CUstream s = a.stream;
    auto& d = cx.drv();
    if (!d.cuStreamBeginCapture_v2 || !d.cuStreamEndCapture) return cx.unsupported("cuStreamBeginCapture_v2");
    if (CUresult rc = set_thread_capture_mode(cx, a.thread_mode); rc != CUDA_SUCCESS) return rc;
    if (CUresult rc = d.cuStreamBeginCapture_v2(s, driver_capture_mode(cx, a.mode)); rc != CUDA_SUCCESS)
        return rc;
    cuuint64_t id = 0;
    CUgraph g = nullptr;
    if (CUresult rc = begun_capture(cx, s, nullptr, id, g); rc != CUDA_SUCCESS) return rc;
    cx.out(static_cast<uint64_t>(id));
    cx.out_handle(handle_kind::graph, g, 0, /*owned=*/true);
    return CUDA_SUCCESS;
}

CUresult handle_begin_capture_to_graph(call_context& cx, const begin_capture_to_graph_args& a) {
    if (!valid_capture_mode(a.mode) || !valid_capture_mode(a.thread_mode)) return cx.bad_arguments();
    CUstream s = a.stream;
    CUgraph into = a.graph;
    dependencies deps;
    if (CUresult rc = deps.read(cx, a.dependencies, a.edge_data); rc != CUDA_SUCCESS) return rc;
    auto& d = cx.drv();
    if (!d.cuStreamBeginCaptureToGraph || !d.cuStreamEndCapture)
        return cx.unsupported("cuStreamBeginCaptureToGraph");
    if (CUresult rc = set_thread_capture_mode(cx, a.thread_mode); rc != CUDA_SUCCESS) return rc;
    if (CUresult rc = d.cuStreamBeginCaptureToGraph(s, into, deps.nodes.data(), deps.edges, deps.nodes.size(),
                                                    driver_capture_mode(cx, a.mode));
        rc != CUDA_SUCCESS)
        return rc;
    cuuint64_t id = 0;
    CUgraph g = nullptr;
    if (CUresult rc = begun_capture(cx, s, into, id, g); rc != CUDA_SUCCESS) return rc;
    cx.out(static_cast<uint64_t>(id));
    return CUDA_SUCCESS;
}

CUresult handle_end_capture(call_context& cx, const end_capture_args& a) {
    CUstream s = a.stream;
    auto& d = cx.drv();
    if (!d.cuStreamEndCapture) return cx.unsupported("cuStreamEndCapture");
    CUgraph g = nullptr;
    CUresult rc = d.cuStreamEndCapture(s, &g);
    const CUstreamCaptureStatus still =
        rc != CUDA_SUCCESS ? capture_status(d, s) : CU_STREAM_CAPTURE_STATUS_NONE;
    uint64_t begun = a.begun, result = 0;
    {
        std::lock_guard lock(cx.sess.mu);
        handle_entry* e = begun ? cx.sess.handles.find(begun, handle_kind::graph) : nullptr;
        if (rc == CUDA_SUCCESS && e && e->raw == g) {
            e->owned =
                false;  // the application's now: destroyed with the session unless it destroys it first
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
    if (result)
        cx.out(result);
    else
        cx.out_handle(handle_kind::graph, g);
    cx.out(uint64_t{0});
    return CUDA_SUCCESS;
}

// The stream may have joined a capture the client does not know of.
CUresult handle_capture_status(call_context& cx, const capture_status_args& a) {
    CUstreamCaptureStatus status{};
    cuuint64_t id = 0;
    if (CUresult rc = capture_info(cx, a.stream, status, id, nullptr); rc != CUDA_SUCCESS) return rc;
    cx.out(static_cast<unsigned>(status));
    cx.out(uint64_t{status == CU_STREAM_CAPTURE_STATUS_ACTIVE ? id : 0});
    return CUDA_SUCCESS;
}

CUresult handle_capture_mode(call_context& cx, const capture_mode_args& a) {
    if (!valid_capture_mode(a.mode)) return cx.bad_arguments();
    return set_thread_capture_mode(cx, a.mode);
}

// The result and failing node also come back on failure (the executable graph 0).
CUresult handle_graph_instantiate(call_context& cx, const graph_instantiate_args& a) {
    CUgraph g = a.graph;
    auto& d = cx.drv();
    if (!d.cuGraphInstantiateWithParams) return cx.unsupported("cuGraphInstantiateWithParams");
    CUDA_GRAPH_INSTANTIATE_PARAMS params{};
    params.flags = a.flags;
    params.hUploadStream = a.upload;
    CUgraphExec exec = nullptr;
    CUresult rc = d.cuGraphInstantiateWithParams(&exec, g, &params);
    if (rc != CUDA_SUCCESS) {
        cx.out(uint64_t{0});
    } else {
        cx.out_handle(handle_kind::graph_exec, exec);
        keep_origin(cx, cx.outs.back(), g, &params.flags, a.graph_id);
    }
    cx.out(static_cast<uint64_t>(params.result_out));
    CUgraphNodeType type{};
    if (params.hErrNode_out && d.cuGraphNodeGetType &&
        d.cuGraphNodeGetType(params.hErrNode_out, &type) == CUDA_SUCCESS) {
        type = seen_type(d, params.hErrNode_out, type);
        cx.out_handle(handle_kind::graph_node, params.hErrNode_out, a.graph_id, /*owned=*/true);
    } else {
        cx.out(uint64_t{0});
    }
    cx.out(static_cast<uint64_t>(type));
    return rc;
}

namespace {
enum class listing : uint64_t { nodes = 0, root_nodes = 1, dependencies = 2, dependents = 3 };
}  // namespace

// `of`: a graph (nodes, root nodes) or a node (its dependencies or dependents). The nodes listed become the
// session's (those it knows keep their ids), owned by their graph; edge data (empty unless asked) comes with
// a node's own list only.
CUresult handle_graph_nodes(call_context& cx, const graph_nodes_args& a) {
    if (a.what > 3 || a.capacity > max_nodes) return cx.bad_arguments();
    auto what = static_cast<listing>(a.what);
    const bool of_graph = what == listing::nodes || what == listing::root_nodes;
    const bool array = a.array, with_edges = a.with_edges;
    if (with_edges && (!array || of_graph))
        return cx.bad_arguments();  // edge data comes with a node's own list
    void* raw = nullptr;
    handle_entry e;
    if (CUresult rc = cx.lookup(a.of, of_graph ? handle_kind::graph : handle_kind::graph_node, raw, &e);
        rc != CUDA_SUCCESS)
        return rc;
    const uint64_t owner = of_graph ? a.of : e.owner;
    auto& d = cx.drv();
    const size_t capacity = array ? a.capacity : 0;
    size_t n = capacity;
    std::vector<CUgraphNode> nodes(std::max<size_t>(capacity, 1));  // never a null array when one was given
    std::vector<CUgraphEdgeData> edges(with_edges ? nodes.size() : 0);
    CUgraphNode* list = array ? nodes.data() : nullptr;
    CUgraphEdgeData* edge_out = with_edges ? edges.data() : nullptr;
    CUresult rc;
    switch (what) {
        case listing::nodes:
            if (!d.cuGraphGetNodes) return cx.unsupported("cuGraphGetNodes");
            rc = d.cuGraphGetNodes(static_cast<CUgraph>(raw), list, &n);
            break;
        case listing::root_nodes:
            if (!d.cuGraphGetRootNodes) return cx.unsupported("cuGraphGetRootNodes");
            rc = d.cuGraphGetRootNodes(static_cast<CUgraph>(raw), list, &n);
            break;
        case listing::dependencies:
            if (!d.cuGraphNodeGetDependencies_v2) return cx.unsupported("cuGraphNodeGetDependencies_v2");
            rc = d.cuGraphNodeGetDependencies_v2(static_cast<CUgraphNode>(raw), list, edge_out, &n);
            break;
        default:
            if (!d.cuGraphNodeGetDependentNodes_v2) return cx.unsupported("cuGraphNodeGetDependentNodes_v2");
            rc = d.cuGraphNodeGetDependentNodes_v2(static_cast<CUgraphNode>(raw), list, edge_out, &n);
            break;
    }
    if (rc != CUDA_SUCCESS) return rc;
    cx.out(static_cast<uint64_t>(n));
    if (!array) {
        cx.out_blob({});
        return CUDA_SUCCESS;
    }
    if (!d.cuGraphNodeGetType) return cx.unsupported("cuGraphNodeGetType");
    const size_t listed = std::min(n, capacity);
    for (size_t i = 0; i < listed; ++i) {
        CUgraphNodeType type{};
        if (CUresult r = d.cuGraphNodeGetType(nodes[i], &type); r != CUDA_SUCCESS) return r;
        type = seen_type(d, nodes[i], type);
        cx.out_handle(handle_kind::graph_node, nodes[i], owner, /*owned=*/true);
        cx.out(static_cast<uint64_t>(type));
    }
    cx.out_blob(std::as_bytes(std::span(edges.data(), with_edges ? listed : 0)));
    return CUDA_SUCCESS;
}

// The nodes listed become the session's, owned by the graph.
CUresult handle_graph_edge_list(call_context& cx, const graph_edge_list_args& a) {
    if (a.capacity > max_nodes) return cx.bad_arguments();
    const bool array = a.array, with_edges = a.with_edges;
    if (with_edges && !array) return cx.bad_arguments();
    CUgraph g = a.graph;
    auto& d = cx.drv();
    if (!d.cuGraphGetEdges_v2 || !d.cuGraphNodeGetType) return cx.unsupported("cuGraphGetEdges_v2");
    const size_t capacity = array ? a.capacity : 0;
    size_t n = capacity;
    std::vector<CUgraphNode> from(std::max<size_t>(capacity, 1)), to(from.size());
    std::vector<CUgraphEdgeData> edges(with_edges ? from.size() : 0);
    if (CUresult rc = d.cuGraphGetEdges_v2(g, array ? from.data() : nullptr, array ? to.data() : nullptr,
                                           with_edges ? edges.data() : nullptr, &n);
        rc != CUDA_SUCCESS)
        return rc;
    cx.out(static_cast<uint64_t>(n));
    if (!array) {
        cx.out_blob({});
        return CUDA_SUCCESS;
    }
    const size_t listed = std::min(n, capacity);
    for (size_t i = 0; i < listed; ++i)
        for (CUgraphNode node : {from[i], to[i]}) {
            CUgraphNodeType type{};
            if (CUresult rc = d.cuGraphNodeGetType(node, &type); rc != CUDA_SUCCESS) return rc;
            cx.out_handle(handle_kind::graph_node, node, a.graph_id, /*owned=*/true);
            cx.out(static_cast<uint64_t>(seen_type(d, node, type)));
        }
    cx.out_blob(std::as_bytes(std::span(edges.data(), with_edges ? listed : 0)));
    return CUDA_SUCCESS;
}

// The driver writes the text into a memory file of this server's, read back here: the application's path is
// on the client's host.
CUresult handle_graph_dot_print(call_context& cx, const graph_dot_print_args& a) {
    auto& d = cx.drv();
    if (!d.cuGraphDebugDotPrint) return cx.unsupported("cuGraphDebugDotPrint");
    constexpr off_t max_text = off_t{16} << 20;
    int fd = ::memfd_create("vcuda-graph-dot", MFD_CLOEXEC);
    if (fd < 0) return cx.fail(CUDA_ERROR_OPERATING_SYSTEM, "cannot make a file for the graph's description");
    const std::string path = "/proc/self/fd/" + std::to_string(fd);
    CUresult rc = d.cuGraphDebugDotPrint(a.graph, path.c_str(), a.flags);
    struct stat st {};
    if (rc == CUDA_SUCCESS && (::fstat(fd, &st) != 0 || st.st_size > max_text))
        rc = cx.fail(CUDA_ERROR_OPERATING_SYSTEM, "the graph's description is past 16 MiB");
    std::vector<std::byte> text(rc == CUDA_SUCCESS ? static_cast<size_t>(st.st_size) : 0);
    if (rc == CUDA_SUCCESS && ::pread(fd, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size()))
        rc = cx.fail(CUDA_ERROR_OPERATING_SYSTEM, "cannot read the graph's description back");
    ::close(fd);
    if (rc != CUDA_SUCCESS) return rc;
    cx.out_blob(text);
    return CUDA_SUCCESS;
}

namespace {
// The session's id for driver object `raw` of kind `k` (and its entry, when `entry` is given); 0 when it has
// none.
uint64_t session_handle(call_context& cx, handle_kind k, const void* raw, handle_entry* entry = nullptr) {
    std::lock_guard lock(cx.sess.mu);
    return cx.sess.handles.find_raw(k, raw, entry);
}
}  // namespace

CUresult handle_graph_memset_node_params(call_context& cx, const graph_memset_node_params_args& a) {
    auto& d = cx.drv();
    if (!d.cuGraphMemsetNodeGetParams) return cx.unsupported("cuGraphMemsetNodeGetParams");
    CUDA_MEMSET_NODE_PARAMS p{};
    if (CUresult rc = d.cuGraphMemsetNodeGetParams(a.node, &p); rc != CUDA_SUCCESS) return rc;
    for (uint64_t v : {uint64_t{p.dst}, uint64_t{p.pitch}, uint64_t{p.value}, uint64_t{p.elementSize},
                       uint64_t{p.width}, uint64_t{p.height}})
        cx.out(v);
    return CUDA_SUCCESS;
}

// The host copy id is 0 when the copy is between the session's memories. In the CUDA_MEMCPY3D, arrays are
// the session's handles; a host copy's side in the client has no pointer (the client knows it by the id),
// shared pinned memory keeps the server's address.
CUresult handle_graph_memcpy_node_params(call_context& cx, const graph_memcpy_node_params_args& a) {
    CUgraphNode node = a.node;
    CUgraphNodeType type{};
    if (CUresult rc = node_type(cx, node, type); rc != CUDA_SUCCESS) return rc;
    auto& d = cx.drv();
    if (!d.cuGraphMemcpyNodeGetParams) return cx.unsupported("cuGraphMemcpyNodeGetParams");
    CUDA_MEMCPY3D c{};
    uint64_t id = 0;
    if (type == CU_GRAPH_NODE_TYPE_MEMCPY) {
        if (CUresult rc = d.cuGraphMemcpyNodeGetParams(node, &c); rc != CUDA_SUCCESS) return rc;
    } else if (!host_copy_of(d, node, c, id)) {
        return cx.fail(CUDA_ERROR_INVALID_VALUE, "not a memcpy node");
    }
    if (id) {  // the staging buffer stands for the client's memory
        if (c.srcMemoryType == CU_MEMORYTYPE_HOST)
            c.srcHost = nullptr;
        else
            c.dstHost = nullptr;
    }
    for (auto* a : {&c.srcArray, &c.dstArray})
        if (*a) {
            const uint64_t h = session_handle(cx, handle_kind::array, *a);
            if (!h) return cx.fail(CUDA_ERROR_INVALID_VALUE, "the copy's array is not one of the session's");
            *a = reinterpret_cast<CUarray>(h);
        }
    c.reserved0 = c.reserved1 = nullptr;
    cx.out(id);
    cx.out_blob(std::as_bytes(std::span(&c, 1)));
    return CUDA_SUCCESS;
}

// Device locations as the session's indices. A memory free node answers its address only (bytes 0, the
// blobs empty).
CUresult handle_graph_mem_node_params(call_context& cx, const graph_mem_node_params_args& a) {
    CUgraphNode node = a.node;
    CUgraphNodeType type{};
    if (CUresult rc = node_type(cx, node, type); rc != CUDA_SUCCESS) return rc;
    auto& d = cx.drv();
    if (type == CU_GRAPH_NODE_TYPE_MEM_FREE) {
        if (!d.cuGraphMemFreeNodeGetParams) return cx.unsupported("cuGraphMemFreeNodeGetParams");
        CUdeviceptr p = 0;
        if (CUresult rc = d.cuGraphMemFreeNodeGetParams(node, &p); rc != CUDA_SUCCESS) return rc;
        cx.out(uint64_t{p});
        cx.out(uint64_t{0});
        cx.out_blob({});
        cx.out_blob({});
        return CUDA_SUCCESS;
    }
    if (type != CU_GRAPH_NODE_TYPE_MEM_ALLOC) return CUDA_ERROR_INVALID_VALUE;
    if (!d.cuGraphMemAllocNodeGetParams) return cx.unsupported("cuGraphMemAllocNodeGetParams");
    CUDA_MEM_ALLOC_NODE_PARAMS p{};
    if (CUresult rc = d.cuGraphMemAllocNodeGetParams(node, &p); rc != CUDA_SUCCESS) return rc;
    auto to_session = [&](CUmemLocation& loc) {
        if (loc.type == CU_MEM_LOCATION_TYPE_DEVICE) loc.id = cx.sess.session_device(loc.id);
    };
    CUmemPoolProps props = p.poolProps;
    props.win32SecurityAttributes = nullptr;
    to_session(props.location);
    std::vector<CUmemAccessDesc> access(p.accessDescs,
                                        p.accessDescs + (p.accessDescs ? p.accessDescCount : 0));
    for (auto& a : access) to_session(a.location);
    cx.out(uint64_t{p.dptr});
    cx.out(uint64_t{p.bytesize});
    cx.out_blob({reinterpret_cast<const std::byte*>(&props), sizeof props});
    cx.out_blob({reinterpret_cast<const std::byte*>(access.data()), access.size() * sizeof(CUmemAccessDesc)});
    return CUDA_SUCCESS;
}

// The copy is entered as the clone's (those listed before keep their ids).
CUresult handle_graph_find_in_clone(call_context& cx, const graph_find_in_clone_args& a) {
    auto& d = cx.drv();
    if (!d.cuGraphNodeFindInClone) return cx.unsupported("cuGraphNodeFindInClone");
    if (!d.cuGraphNodeGetType) return cx.unsupported("cuGraphNodeGetType");
    CUgraphNode copy = nullptr;
    if (CUresult rc = d.cuGraphNodeFindInClone(&copy, a.node, a.clone); rc != CUDA_SUCCESS) return rc;
    CUgraphNodeType type{};
    if (CUresult rc = d.cuGraphNodeGetType(copy, &type); rc != CUDA_SUCCESS) return rc;
    cx.out_handle(handle_kind::graph_node, copy, a.clone_id, /*owned=*/true);
    cx.out(static_cast<unsigned>(seen_type(d, copy, type)));
    return CUDA_SUCCESS;
}

// The function and kernel are the session's handles (0: none); the parameters are packed at the kernel's
// layout. The driver's answer names the function or kernel the node runs; the session knows its parameter
// layout from when it was looked up.
CUresult handle_graph_kernel_node_params(call_context& cx, const graph_kernel_node_params_args& a) {
    auto& d = cx.drv();
    if (!d.cuGraphKernelNodeGetParams_v2) return cx.unsupported("cuGraphKernelNodeGetParams_v2");
    CUDA_KERNEL_NODE_PARAMS_v2 p{};
    if (CUresult rc = d.cuGraphKernelNodeGetParams_v2(a.node, &p); rc != CUDA_SUCCESS) return rc;
    handle_entry fe, ke;
    const uint64_t f = p.func ? session_handle(cx, handle_kind::function, p.func, &fe) : 0;
    uint64_t k = p.kern ? session_handle(cx, handle_kind::kernel, p.kern, &ke) : 0;
    if (!f && !k && p.func) k = session_handle(cx, handle_kind::kernel, p.func, &ke);  // a kernel run as such
    // A function taken from a kernel (cuKernelGetFunction) names its kernel too, as cudart gave both when it
    // added the node; it finds the kernel by it (a driver that keeps only the function answered no kernel,
    // and cudaGraphKernelNodeGetParams then failed with cudaErrorInvalidDeviceFunction).
    if (f && !k && fe.owned && kind_of(fe.owner) == handle_kind::kernel) k = fe.owner;
    const auto& layout = f ? fe.layout : ke.layout;
    if ((!f && !k) || !layout)
        return cx.fail(CUDA_ERROR_INVALID_VALUE, "the node's kernel is not this session's");
    auto params = kernel_node_params(*layout, p);
    if (!params) params.emplace(layout->total());  // a node given no parameters: zeros, as before
    for (uint64_t v :
         {f, k, uint64_t{p.gridDimX}, uint64_t{p.gridDimY}, uint64_t{p.gridDimZ}, uint64_t{p.blockDimX},
          uint64_t{p.blockDimY}, uint64_t{p.blockDimZ}, uint64_t{p.sharedMemBytes}})
        cx.out(v);
    cx.out_blob(*params);
    return CUDA_SUCCESS;
}

// The event is one of the session's (a node names only events the session has); the child graph is entered
// as the node's (owned by it: destroyed with it, never on its own), keeping the id it has.
CUresult handle_graph_node_object(call_context& cx, const graph_node_object_args& a) {
    if (a.what > 2) return cx.bad_arguments();
    CUgraphNode node = a.node;
    CUgraphNodeType type{};
    if (CUresult rc = node_type(cx, node, type); rc != CUDA_SUCCESS) return rc;
    auto& d = cx.drv();
    type = seen_type(d, node, type);  // a host copy's child graph is not the application's to see
    if (a.what == 2) {  // a host node: the client's host-function id (client/api_hostfn.cpp) names fn, data
        CUDA_HOST_NODE_PARAMS p{};
        uint64_t id = 0;
        if (type != CU_GRAPH_NODE_TYPE_HOST) return cx.fail(CUDA_ERROR_INVALID_VALUE, "not a host node");
        if (!d.cuGraphHostNodeGetParams) return cx.unsupported("cuGraphHostNodeGetParams");
        if (CUresult rc = d.cuGraphHostNodeGetParams(node, &p); rc != CUDA_SUCCESS) return rc;
        if (!graph_host_func_id(p, id))
            return cx.fail(CUDA_ERROR_INVALID_VALUE, "the host node's function is not one of this session's");
        cx.out(id);
        return CUDA_SUCCESS;
    }
    if (a.what == 1) {
        if (type != CU_GRAPH_NODE_TYPE_GRAPH)
            return cx.fail(CUDA_ERROR_INVALID_VALUE, "not a child graph node");
        if (!d.cuGraphChildGraphNodeGetGraph) return cx.unsupported("cuGraphChildGraphNodeGetGraph");
        CUgraph g = nullptr;
        if (CUresult rc = d.cuGraphChildGraphNodeGetGraph(node, &g); rc != CUDA_SUCCESS) return rc;
        if (uint64_t id =
                session_handle(cx, handle_kind::graph, g))  // a graph moved into it, or asked before
            cx.out(id);
        else
            cx.out_handle(handle_kind::graph, g, a.node_id, /*owned=*/true);
        return CUDA_SUCCESS;
    }
    CUevent e = nullptr;
    CUresult rc;
    if (type == CU_GRAPH_NODE_TYPE_EVENT_RECORD) {
        if (!d.cuGraphEventRecordNodeGetEvent) return cx.unsupported("cuGraphEventRecordNodeGetEvent");
        rc = d.cuGraphEventRecordNodeGetEvent(node, &e);
    } else if (type == CU_GRAPH_NODE_TYPE_WAIT_EVENT) {
        if (!d.cuGraphEventWaitNodeGetEvent) return cx.unsupported("cuGraphEventWaitNodeGetEvent");
        rc = d.cuGraphEventWaitNodeGetEvent(node, &e);
    } else {
        return cx.fail(CUDA_ERROR_INVALID_VALUE, "not an event record or event wait node");
    }
    if (rc != CUDA_SUCCESS) return rc;
    const uint64_t found = session_handle(cx, handle_kind::event, e);
    if (!found) return cx.fail(CUDA_ERROR_INVALID_VALUE, "the node's event is not one of this session's");
    cx.out(found);
    return CUDA_SUCCESS;
}

namespace {

// The kernel of a kernel node: args first..first+8 are {function or kernel, grid xyz, block xyz, shared
// bytes, form}, blob `block` its parameters. `args` must outlive the call that reads `p`.
CUresult kernel_node(call_context& cx, size_t first, size_t block, kernel_args& args,
                     CUDA_KERNEL_NODE_PARAMS_v2& p) {
    void* raw = nullptr;
    handle_entry e;
    if (CUresult rc = cx.lookup(cx.arg(first), handle_kind::function, raw, &e); rc != CUDA_SUCCESS) return rc;
    unsigned dims[7];
    if (CUresult rc = launch_dims(cx, first + 1, dims); rc != CUDA_SUCCESS) return rc;
    if (CUresult rc = args.set(cx, cx.blob(block), cx.arg(first + 8), e); rc != CUDA_SUCCESS) return rc;
    p = {};
    // A CUkernel runs in the current context (the session's, made current for this call).
    if (e.kind == handle_kind::kernel)
        p.kern = static_cast<CUkernel>(raw);
    else
        p.func = static_cast<CUfunction>(raw);
    set_dims(p, dims);
    p.kernelParams = args.kernel_params();
    p.extra = args.extra();
    return CUDA_SUCCESS;
}

// One side of a memcpy node's copy as the client sends it (the CUDA_MEMCPY3D's fields of that side): device
// memory of the session, one of its arrays (the handle in the array field), its shared pinned host memory (by
// the server's address), or, where `client` is set, the client's memory (CU_MEMORYTYPE_HOST: the pointer is
// never read, only kept as the copy's key; host_copy_graph puts a staging buffer there).
template <class HostPtr>
struct copy_side {
    CUmemorytype& type;
    HostPtr& host;
    CUdeviceptr& device;
    CUarray& array;
    size_t &x, &y, &z, &pitch, &height;
};

template <class HostPtr>
CUresult check_side(call_context& cx, const CUDA_MEMCPY3D& c, copy_side<HostPtr> s, bool client) {
    switch (s.type) {
        case CU_MEMORYTYPE_DEVICE:
        case CU_MEMORYTYPE_UNIFIED:
            s.type = CU_MEMORYTYPE_DEVICE;
            s.host = nullptr;
            s.array = nullptr;
            return cx.device_box(s.device, s.x, s.y, s.z, s.pitch, s.height, c.WidthInBytes, c.Height,
                                 c.Depth);
        case CU_MEMORYTYPE_ARRAY:
            s.host = nullptr;
            s.device = 0;
            return array_box(cx, reinterpret_cast<uint64_t>(s.array), s.x, s.y, s.z, c.WidthInBytes, c.Height,
                             c.Depth, s.array);
        case CU_MEMORYTYPE_HOST:
            s.device = 0;
            s.array = nullptr;
            if (client) return CUDA_SUCCESS;
            return cx.host_box(reinterpret_cast<uintptr_t>(s.host), s.x, s.y, s.z, s.pitch, s.height,
                               c.WidthInBytes, c.Height, c.Depth);
        default:
            return CUDA_ERROR_INVALID_VALUE;
    }
}

// A memcpy node's copy (blob `i`, a CUDA_MEMCPY3D), each side checked (copy_side). `client`: exactly one side
// is the client's memory.
CUresult memcpy_node(call_context& cx, size_t i, bool client, CUDA_MEMCPY3D& c) {
    auto b = cx.blob(i);
    if (b.size() != sizeof c) return cx.bad_arguments();
    std::memcpy(&c, b.data(), sizeof c);
    if (!c.WidthInBytes || !c.Height || !c.Depth) return cx.fail(CUDA_ERROR_INVALID_VALUE, "empty copy");
    if (client && (c.srcMemoryType == CU_MEMORYTYPE_HOST) == (c.dstMemoryType == CU_MEMORYTYPE_HOST))
        return cx.bad_arguments();  // one side is the client's
    c.reserved0 = c.reserved1 = nullptr;
    copy_side<const void*> src{c.srcMemoryType, c.srcHost, c.srcDevice, c.srcArray, c.srcXInBytes,
                               c.srcY,          c.srcZ,    c.srcPitch,  c.srcHeight};
    copy_side<void*> dst{c.dstMemoryType, c.dstHost, c.dstDevice, c.dstArray, c.dstXInBytes,
                         c.dstY,          c.dstZ,    c.dstPitch,  c.dstHeight};
    if (check_side(cx, c, src, client) != CUDA_SUCCESS)
        return cx.fail(CUDA_ERROR_INVALID_VALUE, "bad source of memcpy node");
    if (check_side(cx, c, dst, client) != CUDA_SUCCESS)
        return cx.fail(CUDA_ERROR_INVALID_VALUE, "bad destination of memcpy node");
    return CUDA_SUCCESS;
}

// What a node's parameters point at until the driver has taken them.
struct node_parts {
    explicit node_parts(call_context& c) : cx(c) {}
    node_parts(const node_parts&) = delete;
    node_parts& operator=(const node_parts&) = delete;
    ~node_parts() {
        if (child) cx.drv().cuGraphDestroy(child);
        if (charged) {  // a memory alloc node that was not made
            std::lock_guard lock(cx.sess.mu);
            cx.sess.memory(alloc_device).credit(charged);
        }
    }
    call_context& cx;
    kernel_args args;
    CUgraph child = nullptr;              // a host copy's graph, cloned into the node
    std::vector<CUmemAccessDesc> access;  // a memory alloc node's
    size_t alloc_device = 0;              // ... the session device charged for it
    uint64_t charged = 0;                 // ... and how much, until the node holds it (hold_allocation)
    uint64_t moved = 0;                   // a child graph moved into the node: its id, the node's once made
};

// At most this many bodies of a conditional node (a SWITCH's cases).
constexpr uint64_t max_bodies = 1024;

// How many arguments each node type takes (node_params), by CUgraphNodeType; -1: not served. Added later, so
// older clients leave them out: a memcpy node's one argument, a child graph node's second (its ownership).
constexpr int type_args[] = {9, 1, 6, 1, 1, 0, 1, 1, -1, -1, 0, 1, -1, 3};

bool valid_type_args(uint64_t type, size_t n) {
    if (type >= std::size(type_args) || type_args[type] < 0) return false;
    return n == static_cast<size_t>(type_args[type]) || (type == CU_GRAPH_NODE_TYPE_MEMCPY && n == 0) ||
           (type == CU_GRAPH_NODE_TYPE_GRAPH && n == 2);
}

// A memory alloc node's parameters (blob `i`: a CUDA_MEM_ALLOC_NODE_PARAMS_v2, then its accessDescCount
// CUmemAccessDesc; locations name the session's devices), checked, and its size charged to the quota of its
// device.
CUresult alloc_node(call_context& cx, size_t i, node_parts& parts, CUDA_MEM_ALLOC_NODE_PARAMS_v2& a) {
    auto b = cx.blob(i);
    if (b.size() < sizeof a) return cx.bad_arguments();
    std::memcpy(&a, b.data(), sizeof a);
    const size_t n = a.accessDescCount;
    if (n > 64 || b.size() != sizeof a + n * sizeof(CUmemAccessDesc)) return cx.bad_arguments();
    parts.access.resize(n);
    if (n) std::memcpy(parts.access.data(), b.data() + sizeof a, n * sizeof(CUmemAccessDesc));
    a.accessDescs = parts.access.empty() ? nullptr : parts.access.data();
    a.dptr = 0;
    if (a.bytesize == 0 || a.poolProps.allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
        a.poolProps.handleTypes != CU_MEM_HANDLE_TYPE_NONE ||
        a.poolProps.location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return cx.fail(CUDA_ERROR_INVALID_VALUE,
                       "memory alloc nodes are served for pinned device memory only");
    a.poolProps.win32SecurityAttributes = nullptr;
    if (CUresult rc = cx.device_location(a.poolProps.location, parts.alloc_device); rc != CUDA_SUCCESS)
        return rc;
    for (auto& d : parts.access) {
        size_t device;
        if (d.location.type != CU_MEM_LOCATION_TYPE_DEVICE) return cx.bad_arguments();
        if (CUresult rc = cx.device_location(d.location, device); rc != CUDA_SUCCESS) return rc;
    }
    std::lock_guard lock(cx.sess.mu);
    if (!cx.sess.memory(parts.alloc_device).charge(a.bytesize))
        return cx.fail(CUDA_ERROR_OUT_OF_MEMORY, "a graph allocation of " + std::to_string(a.bytesize) +
                                                     " bytes exceeds the session's memory quota");
    parts.charged = a.bytesize;
    return CUDA_SUCCESS;
}

// The parameters of a node of `type` from args `first`.. and blob `data`: kernel {function or kernel, grid
// xyz, block xyz, shared bytes, form}, blob its parameters; memset {dst, value, element size, width, height,
// pitch}; memcpy {the client's host copy id (0 or absent: the sides are the session's)}, blob its
// CUDA_MEMCPY3D (a copy with the client's memory becomes a child graph, server/host_functions.hpp); host {the
// client's host function id}; child graph {graph}; event record / wait {event}; memory alloc nothing, blob
// its parameters (alloc_node); memory free {a graph allocation of the session}; conditional {a conditional
// handle of the session, type, body count}; empty nothing.
CUresult node_params(call_context& cx, CUgraphNodeType type, size_t first, size_t data, node_parts& parts,
                     CUgraphNodeParams& p) {
    p = {};
    p.type = type;
    CUcontext ctx = nullptr;
    cx.drv().cuCtxGetCurrent(
        &ctx);  // the session's context on the caller's device, where memsets and copies run
    switch (type) {
        case CU_GRAPH_NODE_TYPE_KERNEL: {
            CUDA_KERNEL_NODE_PARAMS_v2 k;
            if (CUresult rc = kernel_node(cx, first, data, parts.args, k); rc != CUDA_SUCCESS) return rc;
            static_assert(sizeof k == sizeof p.kernel, "the v2 and v3 kernel node layouts are the same");
            std::memcpy(&p.kernel, &k, sizeof k);
            return CUDA_SUCCESS;
        }
        case CU_GRAPH_NODE_TYPE_MEMCPY: {
            const uint64_t id = cx.arg_count() > first ? cx.arg(first) : 0;
            if (CUresult rc = memcpy_node(cx, data, id != 0, p.memcpy.copyParams); rc != CUDA_SUCCESS)
                return rc;
            p.memcpy.copyCtx = ctx;
            if (id == 0) return CUDA_SUCCESS;
            if (CUresult rc = host_copy_graph(cx, p.memcpy.copyParams, id, parts.child); rc != CUDA_SUCCESS)
                return rc;
            p = {};
            p.type = CU_GRAPH_NODE_TYPE_GRAPH;
            p.graph = {parts.child, CU_GRAPH_CHILD_GRAPH_OWNERSHIP_CLONE};
            return CUDA_SUCCESS;
        }
        case CU_GRAPH_NODE_TYPE_MEMSET: {
            CUdeviceptr dst = cx.arg(first);
            uint64_t value = cx.arg(first + 1), elem = cx.arg(first + 2), width = cx.arg(first + 3),
                     height = cx.arg(first + 4), pitch = cx.arg(first + 5);
            if (value > 0xffffffffu) return cx.bad_arguments();
            if (CUresult rc = cx.memset_range(dst, elem, width, height, pitch, [] { return true; });
                rc != CUDA_SUCCESS)
                return rc;
            p.memset = {dst,    pitch, static_cast<unsigned>(value), static_cast<unsigned>(elem), width,
                        height, ctx};
            return CUDA_SUCCESS;
        }
        case CU_GRAPH_NODE_TYPE_HOST:
            if (cx.arg(first) == 0) return cx.bad_arguments();
            {
                const CUDA_HOST_NODE_PARAMS h = graph_host_func(cx, cx.arg(first));
                p.host.fn = h.fn;
                p.host.userData = h.userData;
                return CUDA_SUCCESS;
            }
        case CU_GRAPH_NODE_TYPE_GRAPH: {
            const uint64_t ownership = cx.arg_count() > first + 1
                                           ? cx.arg(first + 1)
                                           : uint64_t{CU_GRAPH_CHILD_GRAPH_OWNERSHIP_CLONE};
            if (ownership != CU_GRAPH_CHILD_GRAPH_OWNERSHIP_CLONE &&
                ownership != CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE)
                return cx.bad_arguments();
            p.graph.ownership = static_cast<CUgraphChildGraphNodeOwnership>(ownership);
            handle_entry e;
            void* raw = nullptr;
            if (CUresult rc = cx.lookup(cx.arg(first), handle_kind::graph, raw, &e); rc != CUDA_SUCCESS)
                return rc;
            p.graph.graph = static_cast<CUgraph>(raw);
            // A graph moved into a node is the node's: not one that already belongs to something (a capture
            // under way, a conditional node's body, another node it moved into).
            if (ownership == CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE && e.owned)
                return cx.fail(CUDA_ERROR_INVALID_VALUE, "that graph belongs to a node or a capture already");
            parts.moved = ownership == CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE ? cx.arg(first) : 0;
            return CUDA_SUCCESS;
        }
        case CU_GRAPH_NODE_TYPE_WAIT_EVENT:
            return cx.handle(first, handle_kind::event, p.eventWait.event);
        case CU_GRAPH_NODE_TYPE_EVENT_RECORD:
            return cx.handle(first, handle_kind::event, p.eventRecord.event);
        case CU_GRAPH_NODE_TYPE_MEM_ALLOC:
            return alloc_node(cx, data, parts, p.alloc);
        case CU_GRAPH_NODE_TYPE_MEM_FREE:
            p.free.dptr = cx.arg(first);
            return cx.sess.graph_memory.find(p.free.dptr)
                       ? CUDA_SUCCESS
                       : cx.fail(CUDA_ERROR_INVALID_VALUE, "not a graph allocation of this session");
        case CU_GRAPH_NODE_TYPE_CONDITIONAL: {
            const uint64_t handle = cx.arg(first), type = cx.arg(first + 1), size = cx.arg(first + 2);
            if (type > CU_GRAPH_COND_TYPE_SWITCH || size == 0 || size > max_bodies) return cx.bad_arguments();
            {
                std::lock_guard lock(cx.sess.mu);
                if (!cx.sess.conditional_handles.count(handle))
                    return cx.fail(CUDA_ERROR_INVALID_VALUE, "not a conditional handle of this session");
            }
            p.conditional.handle = handle;
            p.conditional.type = static_cast<CUgraphConditionalNodeType>(type);
            p.conditional.size = static_cast<unsigned>(size);
            p.conditional.ctx = ctx;
            return CUDA_SUCCESS;
        }
        default:
            return CUDA_SUCCESS;  // empty
    }
}

// A memory alloc node's allocation: held for the session while `g`, or a graph or executable graph made from
// it, holds the node (a user object of `g`); charged to the quota until then.
struct allocation_hold {
    std::weak_ptr<session> sess;
    CUdeviceptr p = 0;
    uint64_t size = 0;
    size_t device = 0;
};

// The user object's destructor, on a thread of the driver's: no driver calls, no session mutex.
void CUDA_CB drop_allocation(void* data) {
    std::unique_ptr<allocation_hold> h(static_cast<allocation_hold*>(data));
    if (auto s = h->sess.lock()) {
        s->graph_memory.drop(h->p);
        if (h->device < s->device_count()) s->memory(h->device).credit_later(h->size);
    }
}

}  // namespace

CUresult hold_graph_allocation(call_context& cx, CUgraph g, CUdeviceptr p, uint64_t size, size_t device) {
    auto& d = cx.drv();
    if (!d.cuUserObjectCreate || !d.cuUserObjectRelease || !d.cuGraphRetainUserObject) {
        std::lock_guard lock(cx.sess.mu);
        cx.sess.memory(device).credit(size);
        return cx.unsupported("cuUserObjectCreate");
    }
    auto* h = new allocation_hold{cx.sess.weak_from_this(), p, size, device};
    CUuserObject obj = nullptr;
    if (CUresult rc = d.cuUserObjectCreate(&obj, h, &drop_allocation, 1, CU_USER_OBJECT_NO_DESTRUCTOR_SYNC);
        rc != CUDA_SUCCESS) {
        delete h;
        std::lock_guard lock(cx.sess.mu);
        cx.sess.memory(device).credit(size);
        return rc;
    }
    cx.sess.graph_memory.add(p, size, device);
    if (CUresult rc = d.cuGraphRetainUserObject(g, obj, 1, CU_GRAPH_USER_OBJECT_MOVE); rc != CUDA_SUCCESS) {
        d.cuUserObjectRelease(obj, 1);  // drops the hold and credits the charge
        return rc;
    }
    return CUDA_SUCCESS;
}

namespace {

// What a node needs once added to `g`: a memory alloc node's allocation held (with its charge); its address
// goes to the client.
CUresult node_added(call_context& cx, CUgraph g, CUgraphNode node, const CUgraphNodeParams& p,
                    node_parts& parts) {
    if (p.type != CU_GRAPH_NODE_TYPE_MEM_ALLOC) return CUDA_SUCCESS;
    const uint64_t charged = std::exchange(parts.charged, 0);  // the hold's from now on
    if (CUresult rc = hold_graph_allocation(cx, g, p.alloc.dptr, charged, parts.alloc_device);
        rc != CUDA_SUCCESS) {
        cx.drv().cuGraphDestroyNode(node);
        return rc;
    }
    return CUDA_SUCCESS;
}

}  // namespace

// The type's parameters (a.params, from argument 2) and data (blob 2) are read by node_params.
CUresult handle_graph_add_node(call_context& cx, const graph_add_node_args& a) {
    if (!valid_type_args(a.type, a.params.size())) return cx.bad_arguments();
    CUgraph g = a.graph;
    dependencies deps;
    if (CUresult rc = deps.read(cx, a.dependencies, a.edge_data); rc != CUDA_SUCCESS) return rc;
    auto& d = cx.drv();
    node_parts parts(cx);
    CUgraphNodeParams p;
    if (CUresult rc = node_params(cx, static_cast<CUgraphNodeType>(a.type), 2, 2, parts, p);
        rc != CUDA_SUCCESS)
        return rc;
    CUgraphNode node = nullptr;
    CUresult rc;
    if (d.cuGraphAddNode_v2)
        rc = d.cuGraphAddNode_v2(&node, g, deps.nodes.data(), deps.edges, deps.nodes.size(), &p);
    else if (d.cuGraphAddNode && !deps.edges)
        rc = d.cuGraphAddNode(&node, g, deps.nodes.data(), deps.nodes.size(), &p);
    else
        return cx.unsupported("cuGraphAddNode_v2");
    if (rc != CUDA_SUCCESS) return rc;
    if (CUresult r = node_added(cx, g, node, p, parts); r != CUDA_SUCCESS) return r;
    cx.out_handle(handle_kind::graph_node, node, a.graph_id, /*owned=*/true);
    if (parts.moved) {  // the driver destroys it with the node from now on
        std::lock_guard lock(cx.sess.mu);
        cx.sess.handles.give_to(parts.moved, cx.outs.back());
    }
    if (p.type == CU_GRAPH_NODE_TYPE_MEM_ALLOC) cx.out(static_cast<uint64_t>(p.alloc.dptr));
    if (p.type == CU_GRAPH_NODE_TYPE_CONDITIONAL) {
        // Its bodies are the driver's, and the node's: session handles that go with it.
        const uint64_t id = cx.outs.back();
        for (unsigned i = 0; i < p.conditional.size; ++i)
            cx.out_handle(handle_kind::graph,
                          p.conditional.phGraph_out ? p.conditional.phGraph_out[i] : nullptr, id,
                          /*owned=*/true);
    }
    return CUDA_SUCCESS;
}

// A node made here, added to the capture of `stream` after the capture's current dependencies and made its
// only one, as captured work is: a copy with the client's memory (which the stream's own copy cannot be).
CUresult handle_capture_add_node(call_context& cx, const capture_add_node_args& a) {
    if (!valid_type_args(a.type, a.params.size())) return cx.bad_arguments();
    CUstream s = a.stream;
    auto& d = cx.drv();
    if (!d.cuStreamGetCaptureInfo_v3 || !d.cuStreamUpdateCaptureDependencies_v2 || !d.cuGraphAddNode_v2)
        return cx.unsupported("cuStreamUpdateCaptureDependencies_v2");
    CUstreamCaptureStatus status{};
    CUgraph g = nullptr;
    const CUgraphNode* deps = nullptr;
    const CUgraphEdgeData* edges = nullptr;
    size_t n = 0;
    if (CUresult rc = d.cuStreamGetCaptureInfo_v3(s, &status, nullptr, &g, &deps, &edges, &n);
        rc != CUDA_SUCCESS)
        return rc;
    if (status == CU_STREAM_CAPTURE_STATUS_INVALIDATED) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    if (status != CU_STREAM_CAPTURE_STATUS_ACTIVE || !g)
        return cx.fail(CUDA_ERROR_INVALID_VALUE, "the stream does not capture");
    std::vector<CUgraphNode> after(deps, deps + n);  // the driver's array is valid only until the next call
    std::vector<CUgraphEdgeData> edge_data;
    if (edges) edge_data.assign(edges, edges + n);
    node_parts parts(cx);
    CUgraphNodeParams p;
    if (CUresult rc = node_params(cx, static_cast<CUgraphNodeType>(a.type), 2, 0, parts, p);
        rc != CUDA_SUCCESS)
        return rc;
    CUgraphNode node = nullptr;
    if (CUresult rc =
            d.cuGraphAddNode_v2(&node, g, after.data(), edges ? edge_data.data() : nullptr, after.size(), &p);
        rc != CUDA_SUCCESS)
        return rc;
    if (CUresult rc = node_added(cx, g, node, p, parts); rc != CUDA_SUCCESS) return rc;
    return d.cuStreamUpdateCaptureDependencies_v2(s, &node, nullptr, 1, CU_STREAM_SET_CAPTURE_DEPENDENCIES);
}

// Conditional nodes name the handle too; it is the session's until it ends.
CUresult handle_conditional_handle_create(call_context& cx, const conditional_handle_create_args& a) {
    if (a.flags & ~unsigned{CU_GRAPH_COND_ASSIGN_DEFAULT}) return cx.bad_arguments();
    auto& d = cx.drv();
    if (!d.cuGraphConditionalHandleCreate) return cx.unsupported("cuGraphConditionalHandleCreate");
    CUcontext ctx = nullptr;
    d.cuCtxGetCurrent(&ctx);
    CUgraphConditionalHandle h = 0;
    if (CUresult rc = d.cuGraphConditionalHandleCreate(&h, a.graph, ctx, a.default_value, a.flags);
        rc != CUDA_SUCCESS)
        return rc;
    {
        std::lock_guard lock(cx.sess.mu);
        cx.sess.conditional_handles.insert(h);
    }
    cx.out(static_cast<uint64_t>(h));
    return CUDA_SUCCESS;
}

// The nodes the stream's next captured work will follow; their edge data when the driver gives it (else the
// blob is empty).
CUresult handle_capture_dependencies(call_context& cx, const capture_dependencies_args& a) {
    CUstream s = a.stream;
    CUgraph raw_graph = a.graph;
    auto& d = cx.drv();
    if (!d.cuStreamGetCaptureInfo_v3 || !d.cuGraphNodeGetType)
        return cx.unsupported("cuStreamGetCaptureInfo_v3");
    CUstreamCaptureStatus status{};
    CUgraph g = nullptr;
    const CUgraphNode* deps = nullptr;
    const CUgraphEdgeData* edges = nullptr;
    size_t n = 0;
    if (CUresult rc = d.cuStreamGetCaptureInfo_v3(s, &status, nullptr, &g, &deps, &edges, &n);
        rc != CUDA_SUCCESS)
        return rc;
    if (status != CU_STREAM_CAPTURE_STATUS_ACTIVE || g != raw_graph || n > max_nodes)
        return cx.fail(CUDA_ERROR_INVALID_VALUE, "the stream does not capture into that graph");
    std::vector<CUgraphNode> nodes(deps, deps + n);  // valid only until the next call
    std::vector<CUgraphEdgeData> edge_data;
    if (edges) edge_data.assign(edges, edges + n);
    cx.out(static_cast<uint64_t>(n));
    for (CUgraphNode node : nodes) {
        CUgraphNodeType type{};
        if (CUresult rc = d.cuGraphNodeGetType(node, &type); rc != CUDA_SUCCESS) return rc;
        cx.out_handle(handle_kind::graph_node, node, a.graph_id, /*owned=*/true);
        cx.out(static_cast<uint64_t>(seen_type(d, node, type)));
    }
    cx.out_blob(std::as_bytes(std::span(edge_data)));
    return CUDA_SUCCESS;
}

// The nodes the stream's next captured work follows.
CUresult handle_capture_update_dependencies(call_context& cx, const capture_update_dependencies_args& a) {
    if (a.flags > CU_STREAM_SET_CAPTURE_DEPENDENCIES) return cx.bad_arguments();
    CUstream s = a.stream;
    dependencies deps;
    if (CUresult rc = deps.read(cx, a.nodes, a.edge_data); rc != CUDA_SUCCESS) return rc;
    auto& d = cx.drv();
    if (!d.cuStreamUpdateCaptureDependencies_v2)
        return cx.unsupported("cuStreamUpdateCaptureDependencies_v2");
    return d.cuStreamUpdateCaptureDependencies_v2(s, deps.nodes.data(), deps.edges, deps.nodes.size(),
                                                  a.flags);
}

// The figures are the server process's, as the driver keeps them per device. A set answers the value after
// it.
CUresult handle_graph_mem_attribute(call_context& cx, const graph_mem_attribute_args& a) {
    if (a.attribute > CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH) return cx.bad_arguments();
    auto& d = cx.drv();
    auto attr = static_cast<CUgraphMem_attribute>(a.attribute);
    cuuint64_t value = a.value;
    if (a.set) {
        if (!d.cuDeviceSetGraphMemAttribute) return cx.unsupported("cuDeviceSetGraphMemAttribute");
        if (CUresult rc = d.cuDeviceSetGraphMemAttribute(a.dev, attr, &value); rc != CUDA_SUCCESS) return rc;
    }
    if (!d.cuDeviceGetGraphMemAttribute) return cx.unsupported("cuDeviceGetGraphMemAttribute");
    if (CUresult rc = d.cuDeviceGetGraphMemAttribute(a.dev, attr, &value); rc != CUDA_SUCCESS) return rc;
    cx.out(static_cast<uint64_t>(value));
    return CUDA_SUCCESS;
}

// The error nodes are entered as nodes of the graph.
CUresult handle_graph_exec_update(call_context& cx, const graph_exec_update_args& a) {
    CUgraphExec exec = a.exec;
    CUgraph g = a.graph;
    auto& d = cx.drv();
    if (!d.cuGraphExecUpdate_v2 || !d.cuGraphNodeGetType) return cx.unsupported("cuGraphExecUpdate_v2");
    CUgraphExecUpdateResultInfo info{};
    CUresult rc = d.cuGraphExecUpdate_v2(exec, g, &info);
    if (rc == CUDA_SUCCESS) keep_origin(cx, a.exec_id, g, nullptr);
    cx.out(static_cast<uint64_t>(info.result));
    for (CUgraphNode node : {info.errorNode, info.errorFromNode}) {
        CUgraphNodeType type{};
        if (node && d.cuGraphNodeGetType(node, &type) == CUDA_SUCCESS) {
            type = seen_type(d, node, type);
            cx.out_handle(handle_kind::graph_node, node, a.graph_id, /*owned=*/true);
        } else {
            cx.out(uint64_t{0});
        }
        cx.out(static_cast<uint64_t>(type));
    }
    return rc;
}

// The launch (arguments from 2, the parameter blob) is read by kernel_node. Queued when it updates an
// executable graph.
CUresult handle_kernel_node_params(call_context& cx, const kernel_node_params_args& a) {
    CUgraphNode node = a.node;
    kernel_args args;
    CUDA_KERNEL_NODE_PARAMS_v2 p;
    if (CUresult rc = kernel_node(cx, 2, 0, args, p); rc != CUDA_SUCCESS) return rc;
    auto& d = cx.drv();
    if (a.exec_id == 0) {
        if (!d.cuGraphKernelNodeSetParams_v2) return cx.unsupported("cuGraphKernelNodeSetParams_v2");
        return d.cuGraphKernelNodeSetParams_v2(node, &p);
    }
    if (!d.cuGraphExecKernelNodeSetParams_v2) return cx.unsupported("cuGraphExecKernelNodeSetParams_v2");
    CUresult rc = d.cuGraphExecKernelNodeSetParams_v2(a.exec, exec_node(cx, a.exec_id, node), &p);
    if (rc == CUDA_SUCCESS)
        follow_update(cx, a.exec_id, a.node_id, node,
                      [&](CUgraphNode copy) { return d.cuGraphKernelNodeSetParams_v2(copy, &p); });
    return rc;
}

// New parameters (from argument 3, read by node_params, and the data blob) of a memset, memcpy (the
// session's memory), host, event record or event wait node. Queued when it updates an executable graph, as
// kernel_node_params.
CUresult handle_node_set_params(call_context& cx, const node_set_params_args& a) {
    if (!valid_type_args(a.type, a.params.size())) return cx.bad_arguments();
    const auto type = static_cast<CUgraphNodeType>(a.type);
    switch (type) {
        case CU_GRAPH_NODE_TYPE_MEMSET:
        case CU_GRAPH_NODE_TYPE_HOST:
        case CU_GRAPH_NODE_TYPE_WAIT_EVENT:
        case CU_GRAPH_NODE_TYPE_EVENT_RECORD:
            break;
        case CU_GRAPH_NODE_TYPE_MEMCPY:
            // A copy with the client's memory is a child graph here (server/host_functions.hpp), whose
            // staging buffer an update cannot swap.
            if (!a.params.empty() && a.params[0] != 0)
                return cx.fail(CUDA_ERROR_NOT_SUPPORTED,
                               "new parameters of a memcpy node with the application's own memory");
            break;
        default:
            return cx.bad_arguments();
    }
    CUgraphNode node = a.node;
    node_parts parts(cx);
    CUgraphNodeParams p;
    if (CUresult rc = node_params(cx, type, 3, 0, parts, p); rc != CUDA_SUCCESS) return rc;
    auto& d = cx.drv();
    if (a.exec_id == 0) {
        if (!d.cuGraphNodeSetParams) return cx.unsupported("cuGraphNodeSetParams");
        return d.cuGraphNodeSetParams(node, &p);
    }
    if (!d.cuGraphExecNodeSetParams) return cx.unsupported("cuGraphExecNodeSetParams");
    CUresult rc = d.cuGraphExecNodeSetParams(a.exec, exec_node(cx, a.exec_id, node), &p);
    if (rc == CUDA_SUCCESS)
        follow_update(cx, a.exec_id, a.node_id, node,
                      [&](CUgraphNode copy) { return d.cuGraphNodeSetParams(copy, &p); });
    return rc;
}

// Edges from[i] -> to[i].
CUresult handle_graph_edges(call_context& cx, const graph_edges_args& a) {
    CUgraph g = a.graph;
    std::vector<CUgraphNode> from, to;
    std::vector<CUgraphEdgeData> edge_store;
    const CUgraphEdgeData* edges = nullptr;
    if (CUresult rc = node_list(cx, a.from, from); rc != CUDA_SUCCESS) return rc;
    if (CUresult rc = node_list(cx, a.to, to); rc != CUDA_SUCCESS) return rc;
    if (from.size() != to.size()) return cx.bad_arguments();
    if (CUresult rc = edge_list(cx, a.edge_data, from.size(), edge_store, edges); rc != CUDA_SUCCESS)
        return rc;
    auto& d = cx.drv();
    if (!a.remove) {
        if (!d.cuGraphAddDependencies_v2) return cx.unsupported("cuGraphAddDependencies_v2");
        return d.cuGraphAddDependencies_v2(g, from.data(), to.data(), edges, from.size());
    }
    if (!d.cuGraphRemoveDependencies_v2) return cx.unsupported("cuGraphRemoveDependencies_v2");
    return d.cuGraphRemoveDependencies_v2(g, from.data(), to.data(), edges, from.size());
}

// cuGraphExecChildGraphNodeSetParams {exec, node, child graph}: a clone of the child is kept for the clone's
// node, and a suspend reads it in the node's place (graph_exec_origins). (Following it by setting the
// clone's nodes one by one was tried in session 28: on the H200 a JAX session suspended after it hit an
// illegal address.)
CUresult handle_exec_child_graph_params(call_context& cx) {
    auto& d = cx.drv();
    if (!d.cuGraphExecChildGraphNodeSetParams) return cx.unsupported("cuGraphExecChildGraphNodeSetParams");
    if (!cx.expect_args(3)) return cx.bad_arguments();
    CUgraphExec exec;
    if (CUresult rc = cx.handle(0, handle_kind::graph_exec, exec); rc != CUDA_SUCCESS) return rc;
    CUgraphNode node;
    if (CUresult rc = cx.handle(1, handle_kind::graph_node, node); rc != CUDA_SUCCESS) return rc;
    CUgraph child;
    if (CUresult rc = cx.handle(2, handle_kind::graph, child); rc != CUDA_SUCCESS) return rc;
    CUresult rc = d.cuGraphExecChildGraphNodeSetParams(exec, exec_node(cx, cx.arg(0), node), child);
    if (rc != CUDA_SUCCESS) return rc;
    CUgraphNode copy = clone_node(cx, cx.arg(0), cx.arg(1), node);
    if (!copy) return rc;
    CUgraph kept = nullptr;
    if (!d.cuGraphClone || d.cuGraphClone(&kept, child) != CUDA_SUCCESS) {
        not_kept(cx, cx.arg(0),
                 "cuGraphExecChildGraphNodeSetParams with a child graph that could not be cloned");
        return rc;
    }
    CUgraph old = kept;  // destroyed below unless kept: the one it replaces, or this one (graph gone)
    {
        std::lock_guard lock(cx.sess.mu);
        if (auto* o = cx.sess.graph_execs.find(cx.arg(0))) old = std::exchange(o->children[copy], kept);
    }
    if (old) d.cuGraphDestroy(old);
    return rc;
}

// cuGraphNodeSetEnabled {exec, node, enabled}: a node switched off is not followed on the clone.
CUresult handle_node_set_enabled(call_context& cx) {
    auto& d = cx.drv();
    if (!d.cuGraphNodeSetEnabled) return cx.unsupported("cuGraphNodeSetEnabled");
    if (!cx.expect_args(3)) return cx.bad_arguments();
    CUgraphExec exec;
    if (CUresult rc = cx.handle(0, handle_kind::graph_exec, exec); rc != CUDA_SUCCESS) return rc;
    CUgraphNode node;
    if (CUresult rc = cx.handle(1, handle_kind::graph_node, node); rc != CUDA_SUCCESS) return rc;
    const auto enabled = cx.scalar<unsigned int>(2);
    CUresult rc = d.cuGraphNodeSetEnabled(exec, exec_node(cx, cx.arg(0), node), enabled);
    if (rc == CUDA_SUCCESS && !enabled)
        not_kept(cx, cx.arg(0), "a node switched off (cuGraphNodeSetEnabled)");
    return rc;
}

// cuGraphExecDestroy {exec}: the clone kept for a suspend goes with it.
CUresult handle_graph_exec_destroy(call_context& cx) {
    auto& d = cx.drv();
    if (!d.cuGraphExecDestroy) return cx.unsupported("cuGraphExecDestroy");
    if (!cx.expect_args(1)) return cx.bad_arguments();
    CUgraphExec exec;
    if (CUresult rc = cx.handle(0, handle_kind::graph_exec, exec); rc != CUDA_SUCCESS) return rc;
    if (CUresult rc = d.cuGraphExecDestroy(exec); rc != CUDA_SUCCESS) return rc;
    {
        std::lock_guard lock(cx.sess.mu);
        cx.sess.graph_execs.forget(d, cx.arg(0));
    }
    cx.forget_handle(0);
    return CUDA_SUCCESS;
}

}  // namespace vcuda::server
