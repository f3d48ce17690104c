// Stream and kernel graph node attributes (cuStreamGetAttribute, cuStreamSetAttribute,
// cuGraphKernelNodeGetAttribute, cuGraphKernelNodeSetAttribute): the value is the client's
// CUlaunchAttributeValue, given to the driver as it is for the attributes that hold no handle
// (server/launch_attributes.hpp). runs on: the lane's thread.
#include <cstring>

#include "server/call_context.hpp"
#include "server/launch_attributes.hpp"

namespace vcuda::server {

namespace {
enum attribute_call : uint64_t { stream_get = 0, stream_set = 1, node_get = 2, node_set = 3 };
}  // namespace

// args {what (attribute_call), stream or graph node, attribute id}; blob {value} for a set. Out: blob {value}
// for a get.
CUresult handle_attribute(call_context& cx) {
    if (!cx.expect_args(3)) return cx.bad_arguments();
    const uint64_t what = cx.arg(0);
    const bool set = what == stream_set || what == node_set;
    if (what > node_set || cx.blob_count() != (set ? 1u : 0u)) return cx.bad_arguments();
    const auto id = static_cast<CUlaunchAttributeID>(cx.arg(2));
    if (!plain_launch_attribute(id))
        return cx.fail(CUDA_ERROR_NOT_SUPPORTED, "attribute " + std::to_string(cx.arg(2)) +
                                                     " is not served by vcuda (it holds a handle)");
    CUlaunchAttributeValue value{};
    if (set) {
        auto b = cx.blob(0);
        if (b.size() != sizeof value) return cx.bad_arguments();
        std::memcpy(&value, b.data(), sizeof value);
    }
    auto& d = cx.drv();
    CUresult rc;
    if (what == stream_get || what == stream_set) {
        if (set ? !d.cuStreamSetAttribute : !d.cuStreamGetAttribute)
            return cx.unsupported(set ? "cuStreamSetAttribute" : "cuStreamGetAttribute");
        CUstream s;
        if (CUresult r = cx.handle(1, handle_kind::stream, s); r != CUDA_SUCCESS) return r;
        rc = set ? d.cuStreamSetAttribute(s, id, &value) : d.cuStreamGetAttribute(s, id, &value);
    } else {
        if (set ? !d.cuGraphKernelNodeSetAttribute : !d.cuGraphKernelNodeGetAttribute)
            return cx.unsupported(set ? "cuGraphKernelNodeSetAttribute" : "cuGraphKernelNodeGetAttribute");
        CUgraphNode n;
        if (CUresult r = cx.handle(1, handle_kind::graph_node, n); r != CUDA_SUCCESS) return r;
        rc = set ? d.cuGraphKernelNodeSetAttribute(n, id, &value)
                 : d.cuGraphKernelNodeGetAttribute(n, id, &value);
    }
    if (rc != CUDA_SUCCESS) return rc;
    if (!set) cx.out_blob({reinterpret_cast<const std::byte*>(&value), sizeof value});
    return CUDA_SUCCESS;
}

}  // namespace vcuda::server
