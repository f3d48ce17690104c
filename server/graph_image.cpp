// CUDA graphs and executable graphs in a suspend: each graph the application holds is read through the
// driver (its nodes, their parameters, its edges), destroyed, and made again node by node at the resume, each
// node id standing for its new node. An executable graph cannot be read, so each is made again from a clone
// of the graph it was instantiated from, which the server keeps in step with the updates the application
// makes (server/handlers_graph.cpp, graph_exec_origins). Device addresses, functions, kernels and events keep
// their ids through a suspend, so a node's parameters stay valid once its handles are the new objects'.
// Kernel nodes given an `extra` buffer are made again with kernelParams at the function's layout.
// What is not made again refuses the suspend with its reason: host nodes (their functions are the server's
// callbacks with the client), graph copies with the application's own memory, memory alloc/free nodes (the
// driver picks their addresses), conditional nodes, and an executable graph changed in a way its clone
// cannot follow. A child graph the application gave an executable graph's node is read in the place of the
// clone's child there. A stream capture under way refuses it too, in save_and_release, before its
// synchronize. A move carries the same image to another server (moved_graphs, take_moved_graphs), which
// checks every handle, position and memory range in it before it makes anything.
#include <algorithm>
#include <cstring>
#include <optional>
#include <span>
#include <unordered_map>

#include "common/log.hpp"
#include "common/wire.hpp"
#include "server/call_context.hpp"
#include "server/host_functions.hpp"
#include "server/kernel_args.hpp"
#include "server/launch_attributes.hpp"
#include "server/session.hpp"
#include "server/session_image.hpp"

namespace vcuda::server {

namespace {

const char* node_type_name(CUgraphNodeType t) {
    switch (t) {
        case CU_GRAPH_NODE_TYPE_KERNEL:
            return "kernel";
        case CU_GRAPH_NODE_TYPE_MEMCPY:
            return "memcpy";
        case CU_GRAPH_NODE_TYPE_MEMSET:
            return "memset";
        case CU_GRAPH_NODE_TYPE_GRAPH:
            return "child graph";
        case CU_GRAPH_NODE_TYPE_EVENT_RECORD:
            return "event record";
        case CU_GRAPH_NODE_TYPE_WAIT_EVENT:
            return "event wait";
        case CU_GRAPH_NODE_TYPE_EMPTY:
            return "empty";
        case CU_GRAPH_NODE_TYPE_HOST:
            return "host";
        case CU_GRAPH_NODE_TYPE_MEM_ALLOC:
            return "memory alloc";
        case CU_GRAPH_NODE_TYPE_MEM_FREE:
            return "memory free";
        case CU_GRAPH_NODE_TYPE_CONDITIONAL:
            return "conditional";
        case CU_GRAPH_NODE_TYPE_BATCH_MEM_OP:
            return "batch memory operation";
        case CU_GRAPH_NODE_TYPE_EXT_SEMAS_SIGNAL:
        case CU_GRAPH_NODE_TYPE_EXT_SEMAS_WAIT:
            return "external semaphore";
        default:
            return "unknown";
    }
}

// Logs the 8-byte words of a kernel node's parameters (`when`: read or made again; its kernel `kern`, else
// function `func`) that look like device addresses (4 GiB up to 2^48) yet fall in no memory of the session,
// device or shared host: if they are addresses, a suspend does not keep what they point at. A parameter may
// as well be a number, so this only tells the debug log (at most `budget` lines: foreign_word_lines()). The
// session's `mu` is held.
size_t foreign_word_lines() { return log::get()->should_log(spdlog::level::debug) ? 16 : 0; }

void log_foreign_words(session& s, const driver_table& d, const char* when, CUkernel kern, CUfunction func,
                       std::span<const std::byte> params, size_t& budget) {
    const char* name = nullptr;
    bool named = false;
    for (size_t off = 0; off + 8 <= params.size() && budget > 0; off += 8) {
        uint64_t v = 0;
        std::memcpy(&v, params.data() + off, 8);
        if (v < (uint64_t{1} << 32) || v >= (uint64_t{1} << 48) || s.owns_range_locked(v, 1) ||
            s.host.holding(v, 1))
            continue;
        if (!named) {  // asked of the driver once, and only for a node with something to log
            named = true;
            if (kern && d.cuKernelGetName)
                d.cuKernelGetName(&name, kern);
            else if (func && d.cuFuncGetName)
                d.cuFuncGetName(&name, func);
        }
        --budget;
        VCUDA_LOG_DEBUG(
            "session {}: a kernel node of {} {}: its parameter bytes {}-{} hold {:#x}, in no memory of the "
            "session (if it is an address, a suspend does not keep what it points at)",
            s.id(), name ? name : "an unnamed function", when, off, off + 7, v);
    }
}

// Reads graphs into the image: a graph's children first, so that the rebuild finds them made.
class graph_reader {
  public:
    graph_reader(session& s, const driver_table& d, session_image& img, std::string& why)
        : s_(s), d_(d), img_(img), why_(why) {
        // One pass over the table: a suspend of a session with thousands of nodes and handles must not look
        // each one up by a scan.
        s_.handles.for_each([&](uint64_t id, handle_entry& e) {
            if (!e.raw) return;
            if (e.kind == handle_kind::graph_node) node_ids_[e.raw].push_back(id);
            if (e.kind == handle_kind::function || e.kind == handle_kind::kernel ||
                e.kind == handle_kind::event || e.kind == handle_kind::graph || e.kind == handle_kind::array)
                ids_.emplace(std::pair{e.raw, e.kind}, id);
            if (e.kind == handle_kind::kernel) kernels_.emplace_back(id, static_cast<CUkernel>(e.raw));
        });
    }

    // The session's id of driver object `raw` of kind `k`, or 0.
    uint64_t id_of(handle_kind k, const void* raw) const {
        auto it = ids_.find({const_cast<void*>(raw), k});
        return it == ids_.end() ? 0 : it->second;
    }

    // The child graph nodes given new children in the executable graph read next, and those children (null:
    // none, a graph that is not an executable graph's clone). They must outlive the read.
    void replaced_children(const std::unordered_map<CUgraphNode, CUgraph>* children) { replaced_ = children; }

    // The graph's position in the image, or nothing (why_ says what stopped it).
    std::optional<size_t> read(CUgraph g, size_t device) {
        size_t n = 0;
        if (!call(d_.cuGraphGetNodes(g, nullptr, &n), "its nodes could not be listed")) return std::nullopt;
        std::vector<CUgraphNode> nodes(n);
        if (n && !call(d_.cuGraphGetNodes(g, nodes.data(), &n), "its nodes could not be listed"))
            return std::nullopt;
        session_image::graph_state gs;
        gs.device = device;
        std::unordered_map<CUgraphNode, size_t> position;
        for (size_t i = 0; i < nodes.size(); ++i) {
            position[nodes[i]] = i;
            auto ns = read_node(nodes[i], device);
            if (!ns) return std::nullopt;
            gs.nodes.push_back(std::move(*ns));
        }
        size_t edges = 0;
        if (!call(d_.cuGraphGetEdges_v2(g, nullptr, nullptr, nullptr, &edges),
                  "its edges could not be listed"))
            return std::nullopt;
        std::vector<CUgraphNode> from(edges), to(edges);
        gs.edge_data.resize(edges);
        if (edges && !call(d_.cuGraphGetEdges_v2(g, from.data(), to.data(), gs.edge_data.data(), &edges),
                           "its edges could not be listed"))
            return std::nullopt;
        for (size_t i = 0; i < edges; ++i) gs.edges.emplace_back(position.at(from[i]), position.at(to[i]));
        img_.graphs.push_back(std::move(gs));
        return img_.graphs.size() - 1;
    }

  private:
    CUgraph replaced_child(CUgraphNode node) const {
        if (!replaced_) return nullptr;
        auto it = replaced_->find(node);
        return it == replaced_->end() ? nullptr : it->second;
    }
    bool call(CUresult rc, const char* what) {
        if (rc == CUDA_SUCCESS) return true;
        why_ = std::string("a graph of the session: ") + what + " (" + error_text(rc) + ")";
        return false;
    }
    bool refuse(std::string what) {
        why_ = std::move(what);
        return false;
    }

    // The session's function or kernel handle for the driver's function of a kernel node.
    uint64_t function_id(const CUDA_KERNEL_NODE_PARAMS_v2& p) {
        if (p.kern)
            if (uint64_t id = id_of(handle_kind::kernel, p.kern)) return id;
        if (uint64_t id = id_of(handle_kind::function, p.func)) return id;
        if (uint64_t id = id_of(handle_kind::kernel, p.func)) return id;
        // A launch of a CUkernel may be recorded as its function in the current context: each kernel's
        // function asked once.
        if (!kernel_functions_made_) {
            kernel_functions_made_ = true;
            for (auto [id, k] : kernels_)
                if (CUfunction f = nullptr; d_.cuKernelGetFunction(&f, k) == CUDA_SUCCESS && f)
                    kernel_functions_.emplace(f, id);
        }
        auto it = kernel_functions_.find(p.func);
        return it == kernel_functions_.end() ? 0 : it->second;
    }

    bool read_kernel(CUgraphNode node, session_image::graph_node_state& ns) {
        CUDA_KERNEL_NODE_PARAMS_v2 p{};
        if (!call(d_.cuGraphKernelNodeGetParams_v2(node, &p), "a kernel node's parameters could not be read"))
            return false;
        ns.function = function_id(p);
        handle_entry* e = ns.function ? s_.handles.find(ns.function, kind_of(ns.function)) : nullptr;
        if (!e || !e->layout) return refuse("a kernel node whose function is not one the session knows");
        ns.dims = {p.gridDimX,  p.gridDimY,  p.gridDimZ,      p.blockDimX,
                   p.blockDimY, p.blockDimZ, p.sharedMemBytes};
        auto params = kernel_node_params(*e->layout, p);
        if (!params) return refuse("a kernel node without its parameters");
        ns.params = std::move(*params);
        if (foreign_budget_ > 0)
            log_foreign_words(s_, d_, "read", p.kern, p.func, ns.params, foreign_budget_);
        // Its attributes (cluster dimensions, cooperative, priority...): each the driver answers for.
        if (d_.cuGraphKernelNodeGetAttribute) {
            CUlaunchAttributeValue v{};
            if (d_.cuGraphKernelNodeGetAttribute(node, CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE,
                                                 &v) == CUDA_SUCCESS &&
                v.deviceUpdatableKernelNode.deviceUpdatable)
                return refuse("a device-updatable kernel node (its device handle would change)");
            for (CUlaunchAttributeID id : kernel_node_attributes) {
                CUlaunchAttribute a{};
                a.id = id;
                if (d_.cuGraphKernelNodeGetAttribute(node, id, &a.value) == CUDA_SUCCESS)
                    ns.attributes.push_back(a);
            }
        }
        return true;
    }

    // A copy side is kept when the rebuild finds it at the same place: session device memory (its address
    // stays), an array (by its handle) or the session's shared pinned host memory (registered again there).
    bool copy_side_kept(CUmemorytype type, const void* host, CUarray& array, uint64_t& array_id) {
        switch (type) {
            case CU_MEMORYTYPE_DEVICE:
            case CU_MEMORYTYPE_UNIFIED:
                return true;
            case CU_MEMORYTYPE_ARRAY:
                array_id = id_of(handle_kind::array, array);
                array = nullptr;
                return array_id != 0;
            case CU_MEMORYTYPE_HOST:  // the session's `mu` is held (owns_host would take it again)
                return s_.host.holding(reinterpret_cast<uintptr_t>(host), 1) != nullptr;
            default:
                return false;
        }
    }

    std::optional<session_image::graph_node_state> read_node(CUgraphNode node, size_t device) {
        session_image::graph_node_state ns;
        if (!call(d_.cuGraphNodeGetType(node, &ns.type), "a node's type could not be read"))
            return std::nullopt;
        if (auto it = node_ids_.find(node); it != node_ids_.end()) ns.ids = it->second;
        bool ok = true;
        switch (ns.type) {
            case CU_GRAPH_NODE_TYPE_KERNEL:
                ok = read_kernel(node, ns);
                break;
            case CU_GRAPH_NODE_TYPE_MEMSET:
                ok = call(d_.cuGraphMemsetNodeGetParams(node, &ns.memset),
                          "a memset node's parameters could not be read");
                break;
            case CU_GRAPH_NODE_TYPE_MEMCPY:
                ok = call(d_.cuGraphMemcpyNodeGetParams(node, &ns.copy),
                          "a memcpy node's parameters could not be read");
                if (ok &&
                    !(copy_side_kept(ns.copy.srcMemoryType, ns.copy.srcHost, ns.copy.srcArray,
                                     ns.src_array) &&
                      copy_side_kept(ns.copy.dstMemoryType, ns.copy.dstHost, ns.copy.dstArray, ns.dst_array)))
                    ok = refuse(
                        "a memcpy node with memory that is not the session's device memory, arrays or "
                        "shared pinned memory");
                break;
            case CU_GRAPH_NODE_TYPE_EVENT_RECORD:
            case CU_GRAPH_NODE_TYPE_WAIT_EVENT: {
                CUevent ev = nullptr;
                ok = call(ns.type == CU_GRAPH_NODE_TYPE_EVENT_RECORD
                              ? d_.cuGraphEventRecordNodeGetEvent(node, &ev)
                              : d_.cuGraphEventWaitNodeGetEvent(node, &ev),
                          "an event node's event could not be read");
                ns.event = ok ? id_of(handle_kind::event, ev) : 0;
                if (ok && !ns.event) ok = refuse("an event node whose event is not the session's");
                break;
            }
            case CU_GRAPH_NODE_TYPE_GRAPH: {
                if (is_host_copy_node(d_, node)) {
                    refuse("a graph copy with the application's own memory (its staging buffer)");
                    return std::nullopt;
                }
                // The child given to it in the executable graph since (graph_exec_origins), else its own.
                CUgraph child = replaced_child(node);
                if (!child)
                    ok = call(d_.cuGraphChildGraphNodeGetGraph(node, &child),
                              "a child graph could not be read");
                if (!ok) break;
                auto at = read(child, device);
                if (!at) return std::nullopt;
                ns.child = *at;
                img_.graphs[*at].child_id = id_of(handle_kind::graph, child);
                break;
            }
            case CU_GRAPH_NODE_TYPE_EMPTY:
                break;
            default:
                ok = refuse(std::string("a graph with a ") + node_type_name(ns.type) + " node");
        }
        if (!ok) return std::nullopt;
        return ns;
    }

    session& s_;
    const driver_table& d_;
    session_image& img_;
    std::string& why_;
    const std::unordered_map<CUgraphNode, CUgraph>* replaced_ = nullptr;  // the executable graph's being read
    size_t foreign_budget_ = foreign_word_lines();                        // log_foreign_words' lines left
    std::unordered_map<void*, std::vector<uint64_t>> node_ids_;
    struct raw_kind_hash {
        size_t operator()(const std::pair<void*, handle_kind>& k) const {
            return std::hash<void*>()(k.first) ^ static_cast<size_t>(k.second);
        }
    };
    std::unordered_map<std::pair<void*, handle_kind>, uint64_t, raw_kind_hash> ids_;
    std::vector<std::pair<uint64_t, CUkernel>> kernels_;
    std::unordered_map<CUfunction, uint64_t> kernel_functions_;
    bool kernel_functions_made_ = false;
};

}  // namespace

CUresult session::save_graphs(session_image& img, std::string& why) {
    auto& d = api();
    bool any = false;
    handles.for_each([&](uint64_t, handle_entry& e) {
        any = any || e.kind == handle_kind::graph || e.kind == handle_kind::graph_exec;
    });
    if (!any) return CUDA_SUCCESS;
    if (!keeps_graphs()) {
        why =
            "the session holds CUDA graphs, which a suspend does not keep: vcuda-server runs with "
            "--no-suspend-graphs";
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    if (!d.cuGraphGetNodes || !d.cuGraphGetEdges_v2 || !d.cuGraphNodeGetType || !d.cuGraphCreate ||
        !d.cuGraphAddNode_v2 || !d.cuGraphAddDependencies_v2 || !d.cuGraphInstantiateWithParams) {
        why = "the driver cannot list and make graphs, so the session's CUDA graphs cannot be made again";
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    std::string blocker;
    auto current_for = [&](size_t device) {
        if (device < devices_.size() && devices_[device].ctx) d.cuCtxSetCurrent(devices_[device].ctx);
    };
    handles.for_each([&](uint64_t id, handle_entry& e) {
        if (!blocker.empty()) return;
        if (e.kind == handle_kind::graph && e.owned && e.owner &&
            !handles.find(e.owner, handle_kind::graph_node))
            blocker = "the graph of a stream capture under way";
        if (e.kind == handle_kind::graph_exec) {
            auto* o = graph_execs.find(id);
            if (!o || !o->clone)
                blocker = "an executable graph whose graph was not kept";
            else if (!o->not_kept.empty())
                blocker = "an executable graph changed by " + o->not_kept;
        }
    });
    if (!blocker.empty()) {
        why = "the session holds " + blocker + ", which a suspend cannot make again";
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    graph_reader reader(*this, d, img, why);
    std::unordered_map<uint64_t, std::vector<std::pair<uint64_t, void*>>> nodes_of;  // by graph
    handles.for_each([&](uint64_t id, handle_entry& e) {
        if (e.kind == handle_kind::graph_node && e.raw) nodes_of[e.owner].emplace_back(id, e.raw);
    });
    bool ok = true;
    handles.for_each([&](uint64_t id, handle_entry& e) {
        if (!ok || (e.kind != handle_kind::graph && e.kind != handle_kind::graph_exec)) return;
        if (e.kind == handle_kind::graph && e.owned) return;  // a child: read with its parent
        auto device = static_cast<size_t>(e.device);
        current_for(device);
        const bool exec = e.kind == handle_kind::graph_exec;
        auto* o = exec ? graph_execs.find(id) : nullptr;
        reader.replaced_children(exec ? &o->children : nullptr);
        auto at = reader.read(exec ? o->clone : static_cast<CUgraph>(e.raw), device);
        if (!at) {
            ok = false;
            return;
        }
        auto& gs = img.graphs[*at];
        (exec ? gs.exec : gs.id) = id;
        if (!exec) return;
        gs.flags = o->flags;
        // The application's nodes of the graph it came from, by the position of the clone's node each is.
        size_t n = gs.nodes.size();
        std::vector<CUgraphNode> clone_nodes(n);
        if (n && d.cuGraphGetNodes(o->clone, clone_nodes.data(), &n) != CUDA_SUCCESS) return;
        std::unordered_map<CUgraphNode, size_t> position;
        for (size_t i = 0; i < clone_nodes.size(); ++i) position[clone_nodes[i]] = i;
        if (!o->source) return;
        for (auto [node_id, raw] : nodes_of[o->source]) {
            // The clone's node: the one a rebuild made for it, else (updated since: a new clone) the driver's
            // answer.
            CUgraphNode copy = nullptr;
            if (auto it = o->nodes.find(raw); it != o->nodes.end() && position.count(it->second))
                copy = it->second;
            else if (!d.cuGraphNodeFindInClone ||
                     d.cuGraphNodeFindInClone(&copy, static_cast<CUgraphNode>(raw), o->clone) != CUDA_SUCCESS)
                continue;
            if (auto it = position.find(copy); it != position.end())
                gs.exec_nodes.emplace_back(node_id, it->second);
        }
    });
    if (!ok) {
        why = "the session holds CUDA graphs a suspend cannot make again: " + why;
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    return CUDA_SUCCESS;
}

void session::release_graphs() {
    auto& d = api();
    auto current_for = [&](const handle_entry& e) {
        auto dev = static_cast<size_t>(e.device);
        if (dev < devices_.size() && devices_[dev].ctx) d.cuCtxSetCurrent(devices_[dev].ctx);
    };
    // Executable graphs, then the clones they came from and the application's graphs (children go with their
    // parents); every id stays, standing for nothing until the rebuild.
    handles.for_each([&](uint64_t id, handle_entry& e) {
        if (e.kind != handle_kind::graph_exec || !e.raw) return;
        current_for(e);
        d.cuGraphExecDestroy(static_cast<CUgraphExec>(e.raw));
        handles.rebind(id, nullptr);
    });
    for (auto& [id, o] : graph_execs.all()) {
        if (o.clone) d.cuGraphDestroy(o.clone);
        for (CUgraph g : o.retired) d.cuGraphDestroy(g);
        o.drop_children(d);  // read into the image: the clone made again holds them
        o.clone = nullptr;
        o.retired.clear();
    }
    handles.for_each([&](uint64_t id, handle_entry& e) {
        if (e.kind == handle_kind::graph && e.raw && !e.owned) d.cuGraphDestroy(static_cast<CUgraph>(e.raw));
        if (e.kind == handle_kind::graph || e.kind == handle_kind::graph_node) handles.rebind(id, nullptr);
    });
}

CUresult session::rebuild_graphs(const session_image& img, std::string& what) {
    auto& d = api();
    std::vector<CUgraph> made(img.graphs.size(), nullptr);
    size_t foreign_budget = foreign_word_lines();  // log_foreign_words' lines left
    std::vector<std::vector<CUgraphNode>> made_nodes(img.graphs.size());
    for (size_t gi = 0; gi < img.graphs.size(); ++gi) {
        const auto& gs = img.graphs[gi];
        if (gs.device < devices_.size() && devices_[gs.device].ctx)
            d.cuCtxSetCurrent(devices_[gs.device].ctx);
        // The context memset and memcpy nodes name: the driver refuses a memset node without one
        // (CUDA_ERROR_INVALID_VALUE on the H200).
        CUcontext ctx = nullptr;
        d.cuCtxGetCurrent(&ctx);
        CUgraph g = nullptr;
        if (CUresult rc = d.cuGraphCreate(&g, 0); rc != CUDA_SUCCESS) {
            what = "a graph could not be made again";
            return rc;
        }
        auto fail = [&](CUresult rc, const std::string& why) {
            d.cuGraphDestroy(g);
            what = why;
            return rc;
        };
        std::vector<CUgraphNode> nodes(gs.nodes.size(), nullptr);
        for (size_t i = 0; i < gs.nodes.size(); ++i) {
            const auto& ns = gs.nodes[i];
            CUgraphNodeParams p{};
            p.type = ns.type;
            std::vector<void*> args;
            std::vector<std::byte> params;
            // A device address of the node's, moved with its global if it points into one.
            auto now_at = [&](CUdeviceptr p) { return globals.relocated(p).value_or(p); };
            switch (ns.type) {
                case CU_GRAPH_NODE_TYPE_KERNEL: {
                    const handle_entry* e = handles.find(ns.function, kind_of(ns.function));
                    if (!e || !e->raw || !e->layout)
                        return fail(CUDA_ERROR_INVALID_HANDLE, "a kernel node's function was not made again");
                    (e->kind == handle_kind::kernel ? reinterpret_cast<void*&>(p.kernel.kern)
                                                    : reinterpret_cast<void*&>(p.kernel.func)) = e->raw;
                    set_dims(p.kernel, ns.dims);
                    // Its pointers into module globals the driver placed elsewhere when their modules were
                    // loaded again (XLA passes its constants' addresses so).
                    params.assign(ns.params.begin(), ns.params.end());
                    globals.relocate_params(params, *e->layout);
                    if (foreign_budget > 0)
                        log_foreign_words(*this, d, "made again", p.kernel.kern, p.kernel.func, params,
                                          foreign_budget);
                    for (auto [offset, size] : e->layout->params) args.push_back(params.data() + offset);
                    p.kernel.kernelParams = args.data();
                    break;
                }
                case CU_GRAPH_NODE_TYPE_MEMSET: {
                    const auto& m = ns.memset;
                    p.memset = {now_at(m.dst), m.pitch, m.value, m.elementSize, m.width, m.height, ctx};
                    break;
                }
                case CU_GRAPH_NODE_TYPE_MEMCPY: {
                    p.memcpy.copyParams = ns.copy;
                    auto& c = p.memcpy.copyParams;
                    if (c.srcMemoryType == CU_MEMORYTYPE_DEVICE || c.srcMemoryType == CU_MEMORYTYPE_UNIFIED)
                        c.srcDevice = now_at(c.srcDevice);
                    if (c.dstMemoryType == CU_MEMORYTYPE_DEVICE || c.dstMemoryType == CU_MEMORYTYPE_UNIFIED)
                        c.dstDevice = now_at(c.dstDevice);
                    for (auto [id, slot] : {std::pair{ns.src_array, &p.memcpy.copyParams.srcArray},
                                            std::pair{ns.dst_array, &p.memcpy.copyParams.dstArray}}) {
                        if (!id) continue;
                        const handle_entry* a = handles.find(id, handle_kind::array);
                        if (!a || !a->raw)
                            return fail(CUDA_ERROR_INVALID_HANDLE,
                                        "a memcpy node's array was not made again");
                        *slot = static_cast<CUarray>(a->raw);
                    }
                    p.memcpy.copyCtx = ctx;
                    break;
                }
                case CU_GRAPH_NODE_TYPE_EVENT_RECORD:
                case CU_GRAPH_NODE_TYPE_WAIT_EVENT: {
                    const handle_entry* e = handles.find(ns.event, handle_kind::event);
                    if (!e || !e->raw)
                        return fail(CUDA_ERROR_INVALID_HANDLE, "an event node's event is gone");
                    (ns.type == CU_GRAPH_NODE_TYPE_EVENT_RECORD ? p.eventRecord.event : p.eventWait.event) =
                        static_cast<CUevent>(e->raw);
                    break;
                }
                case CU_GRAPH_NODE_TYPE_GRAPH:
                    // Moved in, so that the child keeps the nodes its ids were given.
                    p.graph = {made[ns.child], CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE};
                    made[ns.child] = nullptr;
                    break;
                default:
                    break;
            }
            if (CUresult rc = d.cuGraphAddNode_v2(&nodes[i], g, nullptr, nullptr, 0, &p);
                rc != CUDA_SUCCESS) {
                // What the driver refused, for whoever reads the log: the node's memory.
                if (ns.type == CU_GRAPH_NODE_TYPE_MEMSET)
                    VCUDA_LOG_WARN("session {}: memset node at {:#x}, {} x {} of {} bytes, pitch {}, refused",
                                   id_, ns.memset.dst, ns.memset.width, ns.memset.height,
                                   ns.memset.elementSize, ns.memset.pitch);
                if (ns.type == CU_GRAPH_NODE_TYPE_MEMCPY)
                    VCUDA_LOG_WARN(
                        "session {}: memcpy node from {:#x} (type {}) to {:#x} (type {}), {} x {} x {}, "
                        "refused",
                        id_, ns.copy.srcDevice, static_cast<int>(ns.copy.srcMemoryType), ns.copy.dstDevice,
                        static_cast<int>(ns.copy.dstMemoryType), ns.copy.WidthInBytes, ns.copy.Height,
                        ns.copy.Depth);
                return fail(rc, std::string("a graph's ") + node_type_name(ns.type) + " node (" +
                                    std::to_string(i + 1) + " of " + std::to_string(gs.nodes.size()) +
                                    ") could not be made again");
            }
            // A kernel node's attributes, those that differ from a new node's.
            if (!ns.attributes.empty() &&
                (!d.cuGraphKernelNodeGetAttribute || !d.cuGraphKernelNodeSetAttribute))
                return fail(CUDA_ERROR_NOT_SUPPORTED, "the driver cannot set a kernel node's attributes");
            for (const auto& a : ns.attributes) {
                CUlaunchAttributeValue now{};
                if (d.cuGraphKernelNodeGetAttribute(nodes[i], a.id, &now) == CUDA_SUCCESS &&
                    same_launch_attribute(a.id, now, a.value))
                    continue;
                if (CUresult rc = d.cuGraphKernelNodeSetAttribute(nodes[i], a.id, &a.value);
                    rc != CUDA_SUCCESS)
                    return fail(
                        rc, "a kernel node's attribute " + std::to_string(a.id) + " could not be set again");
            }
            for (uint64_t id : ns.ids) handles.rebind(id, nodes[i]);
            if (ns.type == CU_GRAPH_NODE_TYPE_GRAPH && img.graphs[ns.child].child_id) {
                CUgraph child = nullptr;
                if (d.cuGraphChildGraphNodeGetGraph(nodes[i], &child) == CUDA_SUCCESS)
                    handles.rebind(img.graphs[ns.child].child_id, child);
            }
        }
        std::vector<CUgraphNode> from, to;
        for (auto [a, b] : gs.edges) {
            from.push_back(nodes[a]);
            to.push_back(nodes[b]);
        }
        if (!from.empty())
            if (CUresult rc = d.cuGraphAddDependencies_v2(g, from.data(), to.data(),
                                                          const_cast<CUgraphEdgeData*>(gs.edge_data.data()),
                                                          from.size());
                rc != CUDA_SUCCESS)
                return fail(rc, "a graph's edges could not be made again");
        made[gi] = g;
        made_nodes[gi] = nodes;
        if (gs.id) {
            handles.rebind(gs.id, g);
            made[gi] = nullptr;  // the application's now
        }
        if (gs.exec) {
            CUDA_GRAPH_INSTANTIATE_PARAMS params{};
            params.flags = gs.flags;
            CUgraphExec exec = nullptr;
            if (CUresult rc = d.cuGraphInstantiateWithParams(&exec, g, &params); rc != CUDA_SUCCESS)
                return fail(rc, "an executable graph could not be instantiated again");
            handles.rebind(gs.exec, exec);
            if (auto* o = graph_execs.find(gs.exec)) o->clone = g;
            made[gi] = nullptr;
        }
    }
    // Executable-graph calls name the application's nodes: each stands for its clone's node now.
    for (size_t gi = 0; gi < img.graphs.size(); ++gi) {
        auto* o = img.graphs[gi].exec ? graph_execs.find(img.graphs[gi].exec) : nullptr;
        if (!o) continue;
        o->nodes.clear();
        for (auto [node_id, pos] : img.graphs[gi].exec_nodes)
            if (const handle_entry* e = handles.find(node_id, handle_kind::graph_node); e && e->raw)
                o->nodes[e->raw] = made_nodes[gi][pos];
    }
    return CUDA_SUCCESS;
}

flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<wire::MovedGraph>>> session::moved_graphs(
    flatbuffers::FlatBufferBuilder& b, const session_image& img) {
    std::vector<flatbuffers::Offset<wire::MovedGraph>> out;
    for (const auto& gs : img.graphs) {
        std::vector<flatbuffers::Offset<wire::MovedGraphNode>> nodes;
        for (const auto& ns : gs.nodes) {
            const std::vector<uint32_t> dims(ns.dims.begin(), ns.dims.end());
            nodes.push_back(wire::CreateMovedGraphNode(
                b, static_cast<int32_t>(ns.type), b.CreateVector(ns.ids), ns.function, b.CreateVector(dims),
                b.CreateVector(reinterpret_cast<const uint8_t*>(ns.params.data()), ns.params.size()),
                struct_vector(b, ns.memset), struct_vector(b, ns.copy), ns.src_array, ns.dst_array, ns.event,
                ns.child,
                b.CreateVector(reinterpret_cast<const uint8_t*>(ns.attributes.data()),
                               ns.attributes.size() * sizeof(CUlaunchAttribute))));
        }
        std::vector<uint64_t> edges, exec_nodes;
        for (auto [from, to] : gs.edges) edges.insert(edges.end(), {from, to});
        for (auto [id, at] : gs.exec_nodes) exec_nodes.insert(exec_nodes.end(), {id, at});
        const auto* o = gs.exec ? graph_execs.find(gs.exec) : nullptr;
        out.push_back(
            wire::CreateMovedGraph(b, gs.id, gs.exec, gs.flags, static_cast<uint32_t>(gs.device),
                                   b.CreateVector(nodes), b.CreateVector(edges),
                                   b.CreateVector(reinterpret_cast<const uint8_t*>(gs.edge_data.data()),
                                                  gs.edge_data.size() * sizeof(CUgraphEdgeData)),
                                   gs.child_id, b.CreateVector(exec_nodes), o ? o->source : 0));
    }
    return b.CreateVector(out);
}

CUresult session::take_moved_graphs(const wire::SessionState& st, session_image& img, std::string& why) {
    if (!st.graphs()) return CUDA_SUCCESS;
    auto bad = [&](const std::string& what) {
        why = "the moved session's state is malformed: " + what;
        return CUDA_ERROR_INVALID_VALUE;
    };
    auto is = [&](uint64_t id, handle_kind k) { return id && handles.find(id, k) != nullptr; };
    // Shared pinned host memory moves with the session: a copy's host side must lie in it.
    auto in_host_regions = [&](uint64_t p, uint64_t n) {
        const auto* r = st.host_regions();
        for (flatbuffers::uoffset_t k = 0; r && k + 1 < r->size(); k += 2)
            if (p >= r->Get(k) && p - r->Get(k) <= r->Get(k + 1) && n <= r->Get(k + 1) - (p - r->Get(k)))
                return true;
        return false;
    };
    // A device range a node may name: the session's memory, or a placeholder (as call_context::memset_range).
    auto device_side = [&](uint64_t p, uint64_t n) {
        return owns_range_locked(p, n) || placeholder_range(api(), p, n);
    };
    auto copy_side = [&](const CUDA_MEMCPY3D& c, CUmemorytype type, uint64_t device, uintptr_t host,
                         uint64_t array, uint64_t x, uint64_t y, uint64_t z, uint64_t pitch,
                         uint64_t height) {
        uint64_t first = 0, last = 0;
        const bool box = box_span(x, y, z, pitch, height, c.WidthInBytes, c.Height, c.Depth, first, last);
        switch (type) {
            case CU_MEMORYTYPE_DEVICE:
            case CU_MEMORYTYPE_UNIFIED:
                return box && device + first >= device && device_side(device + first, last - first);
            case CU_MEMORYTYPE_HOST:
                return box && host + first >= host && in_host_regions(host + first, last - first);
            case CU_MEMORYTYPE_ARRAY:
                return is(array, handle_kind::array);
            default:
                return false;
        }
    };
    const auto count = st.graphs()->size();
    std::vector<bool> child_taken(count, false);
    for (flatbuffers::uoffset_t gi = 0; gi < count; ++gi) {
        const auto* m = st.graphs()->Get(gi);
        session_image::graph_state gs;
        gs.id = m->id();
        gs.exec = m->exec();
        gs.flags = m->flags();
        gs.device = m->device();
        gs.child_id = m->child_id();
        if (gs.device >= devices_.size() || !allowed(gs.device)) return bad("a graph's GPU");
        if ((gs.id && gs.exec) || (gs.id && !is(gs.id, handle_kind::graph)) ||
            (gs.exec && (!is(gs.exec, handle_kind::graph_exec) || graph_execs.find(gs.exec))) ||
            (gs.child_id && !is(gs.child_id, handle_kind::graph)) ||
            (m->source() && !is(m->source(), handle_kind::graph)))
            return bad("a graph's handles");
        const auto n = m->nodes() ? m->nodes()->size() : 0;
        for (flatbuffers::uoffset_t i = 0; i < n; ++i) {
            const auto* x = m->nodes()->Get(i);
            session_image::graph_node_state ns;
            ns.type = static_cast<CUgraphNodeType>(x->type());
            if (x->ids())
                for (uint64_t id : *x->ids()) {
                    if (!is(id, handle_kind::graph_node)) return bad("a graph node's handle");
                    ns.ids.push_back(id);
                }
            bool ok = true;
            switch (ns.type) {
                case CU_GRAPH_NODE_TYPE_KERNEL: {
                    ns.function = x->function();
                    const handle_entry* e =
                        ns.function ? handles.find(ns.function, kind_of(ns.function)) : nullptr;
                    ok = e && (e->kind == handle_kind::function || e->kind == handle_kind::kernel) &&
                         e->layout && x->dims() && x->dims()->size() == ns.dims.size() && x->params();
                    if (!ok) break;
                    std::copy(x->dims()->begin(), x->dims()->end(), ns.dims.begin());
                    ns.params.assign(
                        reinterpret_cast<const std::byte*>(x->params()->data()),
                        reinterpret_cast<const std::byte*>(x->params()->data()) + x->params()->size());
                    for (auto [offset, size] : e->layout->params)
                        ok = ok && offset <= ns.params.size() && size <= ns.params.size() - offset;
                    // Attributes: whole records of the ones a suspend carries; an access policy window over
                    // the session's memory.
                    if (const auto* a = x->attributes(); ok && a) {
                        ok = a->size() % sizeof(CUlaunchAttribute) == 0 &&
                             a->size() / sizeof(CUlaunchAttribute) <= std::size(kernel_node_attributes);
                        ns.attributes.resize(ok ? a->size() / sizeof(CUlaunchAttribute) : 0);
                        if (ok) std::memcpy(ns.attributes.data(), a->data(), a->size());
                        for (const auto& at : ns.attributes) {
                            ok = ok && std::find(std::begin(kernel_node_attributes),
                                                 std::end(kernel_node_attributes),
                                                 at.id) != std::end(kernel_node_attributes);
                            const auto& w = at.value.accessPolicyWindow;
                            if (ok && at.id == CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW && w.num_bytes)
                                ok = device_side(reinterpret_cast<uintptr_t>(w.base_ptr), w.num_bytes);
                        }
                    }
                    break;
                }
                case CU_GRAPH_NODE_TYPE_MEMSET: {
                    auto& s = ns.memset;
                    uint64_t row = 0, span = 0;
                    ok = vector_as(x->memset(), s) &&
                         memset_span(s.elementSize, s.width, s.height, s.pitch, row, span) &&
                         (s.height == 1 || s.pitch >= row) &&
                         (device_side(s.dst, span) || in_host_regions(s.dst, span));
                    break;
                }
                case CU_GRAPH_NODE_TYPE_MEMCPY: {
                    auto& c = ns.copy;
                    ns.src_array = x->src_array();
                    ns.dst_array = x->dst_array();
                    ok = vector_as(x->copy(), c) && c.WidthInBytes && c.Height && c.Depth;
                    if (!ok) break;
                    c.srcArray = c.dstArray = nullptr;  // the handles above stand for them
                    c.reserved0 = c.reserved1 = nullptr;
                    ok = copy_side(c, c.srcMemoryType, c.srcDevice, reinterpret_cast<uintptr_t>(c.srcHost),
                                   ns.src_array, c.srcXInBytes, c.srcY, c.srcZ, c.srcPitch, c.srcHeight) &&
                         copy_side(c, c.dstMemoryType, c.dstDevice, reinterpret_cast<uintptr_t>(c.dstHost),
                                   ns.dst_array, c.dstXInBytes, c.dstY, c.dstZ, c.dstPitch, c.dstHeight);
                    break;
                }
                case CU_GRAPH_NODE_TYPE_EVENT_RECORD:
                case CU_GRAPH_NODE_TYPE_WAIT_EVENT:
                    ns.event = x->event();
                    ok = is(ns.event, handle_kind::event);
                    break;
                case CU_GRAPH_NODE_TYPE_GRAPH: {
                    // An earlier graph of the state that is nobody else's: moved into this node.
                    ns.child = x->child();
                    ok = ns.child < gi && !child_taken[ns.child] && !img.graphs[ns.child].id &&
                         !img.graphs[ns.child].exec && img.graphs[ns.child].device == gs.device;
                    if (ok) child_taken[ns.child] = true;
                    break;
                }
                case CU_GRAPH_NODE_TYPE_EMPTY:
                    break;
                default:
                    ok = false;
            }
            if (!ok) return bad("a graph's " + std::string(node_type_name(ns.type)) + " node");
            gs.nodes.push_back(std::move(ns));
        }
        if (const auto* e = m->edges()) {
            const size_t edges = e->size() / 2;
            if (e->size() % 2 || !m->edge_data() || m->edge_data()->size() != edges * sizeof(CUgraphEdgeData))
                return bad("a graph's edges");
            for (flatbuffers::uoffset_t k = 0; k < e->size(); k += 2) {
                if (e->Get(k) >= n || e->Get(k + 1) >= n) return bad("a graph's edges");
                gs.edges.emplace_back(e->Get(k), e->Get(k + 1));
            }
            gs.edge_data.resize(edges);
            std::memcpy(gs.edge_data.data(), m->edge_data()->data(), m->edge_data()->size());
        }
        if (const auto* e = m->exec_nodes()) {
            if (e->size() % 2 || (e->size() && !gs.exec)) return bad("an executable graph's nodes");
            for (flatbuffers::uoffset_t k = 0; k < e->size(); k += 2) {
                if (!is(e->Get(k), handle_kind::graph_node) || e->Get(k + 1) >= n)
                    return bad("an executable graph's nodes");
                gs.exec_nodes.emplace_back(e->Get(k), e->Get(k + 1));
            }
        }
        img.graphs.push_back(std::move(gs));
    }
    // Every graph is the application's, an executable graph's clone, or one node's child.
    for (size_t gi = 0; gi < count; ++gi)
        if (!img.graphs[gi].id && !img.graphs[gi].exec && !child_taken[gi])
            return bad("a graph nobody holds");
    for (size_t gi = 0; gi < count; ++gi)
        if (img.graphs[gi].exec) {
            auto& o = graph_execs.add(img.graphs[gi].exec);
            o.flags = img.graphs[gi].flags;
            o.source = st.graphs()->Get(static_cast<flatbuffers::uoffset_t>(gi))->source();
        }
    if (count) carried_graphs_.store(true);
    return CUDA_SUCCESS;
}

}  // namespace vcuda::server
