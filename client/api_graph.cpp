// Graphs: the hand-written entry points. The plain ones (cuGraphCreate, cuGraphDestroy, cuGraphInstantiateWithFlags,
// cuGraphExecDestroy, cuGraphLaunch, cuGraphUpload) are generated from the spec; graphs come from them or from
// cuStreamEndCapture (client/api_stream.cpp) and are session handles like streams. Graph nodes have no client
// handles, so what would name one (a failing node, node arrays) answers none or is not supported.
#include "client/plain_call.hpp"
#include "client/state.hpp"
#include "client/trace.hpp"

#define VCUDA_API extern "C" __attribute__((visibility("default"))) CUresult

using namespace vcuda;
using namespace vcuda::client;

namespace {

// The pre-12.0 form: no flags, and a log buffer the driver writes only on failure.
CUresult instantiate_with_log(CUgraphExec* exec, CUgraph g, CUgraphNode* error_node, char* log, size_t log_size) {
    if (error_node) *error_node = nullptr;
    if (log && log_size) log[0] = '\0';
    return cuGraphInstantiateWithFlags(exec, g, 0);
}

// cuGraphInstantiateWithParams: the driver instantiates (and uploads, with CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD)
// in one call; its result code comes back even when it fails.
CUresult instantiate_with_params(CUgraphExec* exec, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS* params, CUstream upload,
                                 const char* name) {
    VCUDA_REQUIRE_INIT();
    if (!exec || !params) return CUDA_ERROR_INVALID_VALUE;
    bool uploads = params->flags & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD;
    plain_call c(op::graph_instantiate, name);
    c.handle(g, handle_kind::graph);
    c.arg(static_cast<uint64_t>(params->flags));
    c.handle(uploads ? upload : nullptr, handle_kind::stream);  // the driver reads the stream only to upload
    CUresult rc = c.send_sync();
    params->hErrNode_out = nullptr;
    params->result_out = c.reply().outs.size() >= 2 ? c.out<CUgraphInstantiateResult>(1)
                         : rc == CUDA_SUCCESS        ? CUDA_GRAPH_INSTANTIATE_SUCCESS
                                                     : CUDA_GRAPH_INSTANTIATE_ERROR;
    if (rc != CUDA_SUCCESS) return rc;
    *exec = c.out_handle<CUgraphExec>(0, handle_kind::graph_exec);
    return CUDA_SUCCESS;
}

enum class graph_count_of : uint64_t { nodes = 0, root_nodes = 1 };

// cuGraphGetNodes / cuGraphGetRootNodes: counts only (an array would need node handles).
CUresult graph_count(CUgraph g, CUgraphNode* nodes, size_t* count, graph_count_of what, const char* name) {
    VCUDA_REQUIRE_INIT();
    if (!count) return CUDA_ERROR_INVALID_VALUE;
    if (nodes && *count) return static_cast<CUresult>(unsupported(name));
    plain_call c(op::graph_count, name);
    c.handle(g, handle_kind::graph);
    c.arg(static_cast<uint64_t>(what));
    if (CUresult rc = c.send_sync(); rc != CUDA_SUCCESS) return rc;
    *count = c.out<uint64_t>(0);
    return CUDA_SUCCESS;
}

}  // namespace

VCUDA_API cuGraphInstantiate(CUgraphExec* exec, CUgraph g, CUgraphNode* error_node, char* log, size_t log_size) noexcept {
    VCUDA_TRACE_HOOK(cuGraphInstantiate, exec, g, error_node, log, log_size);
    return instantiate_with_log(exec, g, error_node, log, log_size);
}

VCUDA_API cuGraphInstantiate_v2(CUgraphExec* exec, CUgraph g, CUgraphNode* error_node, char* log, size_t log_size) noexcept {
    VCUDA_TRACE_HOOK(cuGraphInstantiate_v2, exec, g, error_node, log, log_size);
    return instantiate_with_log(exec, g, error_node, log, log_size);
}

VCUDA_API cuGraphInstantiateWithParams(CUgraphExec* exec, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS* params) noexcept {
    VCUDA_TRACE_HOOK(cuGraphInstantiateWithParams, exec, g, params);
    return instantiate_with_params(exec, g, params, params ? params->hUploadStream : nullptr, "cuGraphInstantiateWithParams");
}

// The per-thread-stream variant: the upload stream inside the parameters is the one to map.
VCUDA_API cuGraphInstantiateWithParams_ptsz(CUgraphExec* exec, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS* params) noexcept {
    VCUDA_TRACE_HOOK(cuGraphInstantiateWithParams_ptsz, exec, g, params);
    return instantiate_with_params(exec, g, params, params ? per_thread_stream(params->hUploadStream) : nullptr,
                                   "cuGraphInstantiateWithParams_ptsz");
}

VCUDA_API cuGraphGetNodes(CUgraph g, CUgraphNode* nodes, size_t* count) noexcept {
    VCUDA_TRACE_HOOK(cuGraphGetNodes, g, nodes, count);
    return graph_count(g, nodes, count, graph_count_of::nodes, "cuGraphGetNodes");
}

VCUDA_API cuGraphGetRootNodes(CUgraph g, CUgraphNode* nodes, size_t* count) noexcept {
    VCUDA_TRACE_HOOK(cuGraphGetRootNodes, g, nodes, count);
    return graph_count(g, nodes, count, graph_count_of::root_nodes, "cuGraphGetRootNodes");
}
