// Stream and kernel graph node attributes (cuStreamGetAttribute, cuStreamSetAttribute,
// cuGraphKernelNodeGetAttribute, cuGraphKernelNodeSetAttribute): the value is the client's
// CUlaunchAttributeValue, given to the driver as it is for the attributes that hold no handle
// (server/launch_attributes.hpp). runs on: the lane's thread.
#include <cstring>

#include "server/call_context.hpp"
#include "server/launch_attributes.hpp"
#include "server_ops.hpp"

namespace vcuda::server {

namespace {
enum attribute_call : uint64_t { stream_get = 0, stream_set = 1, node_get = 2, node_set = 3 };
}  // namespace

// The value given is empty for a get; the value answered is empty for a set.
CUresult handle_attribute(call_context& cx, const attribute_args& a) {
    const unsigned what = a.what;
    const bool set = what == stream_set || what == node_set;
    if (what > node_set || set == a.value.empty()) return cx.bad_arguments();
    const auto id = static_cast<CUlaunchAttributeID>(a.id);
    if (!plain_launch_attribute(id))
        return cx.fail(CUDA_ERROR_NOT_SUPPORTED,
                       "attribute " + std::to_string(a.id) + " is not served by vcuda (it holds a handle)");
    CUlaunchAttributeValue value{};
    if (set) {
        auto b = a.value;
        if (b.size() != sizeof value) return cx.bad_arguments();
        std::memcpy(&value, b.data(), sizeof value);
    }
    auto& d = cx.drv();
    CUresult rc;
    if (what == stream_get || what == stream_set) {
        if (set ? !d.cuStreamSetAttribute : !d.cuStreamGetAttribute)
            return cx.unsupported(set ? "cuStreamSetAttribute" : "cuStreamGetAttribute");
        void* raw = nullptr;
        if (CUresult r = cx.lookup(a.object, handle_kind::stream, raw); r != CUDA_SUCCESS) return r;
        auto* s = static_cast<CUstream>(raw);
        rc = set ? d.cuStreamSetAttribute(s, id, &value) : d.cuStreamGetAttribute(s, id, &value);
    } else {
        if (set ? !d.cuGraphKernelNodeSetAttribute : !d.cuGraphKernelNodeGetAttribute)
            return cx.unsupported(set ? "cuGraphKernelNodeSetAttribute" : "cuGraphKernelNodeGetAttribute");
        void* raw = nullptr;
        if (CUresult r = cx.lookup(a.object, handle_kind::graph_node, raw); r != CUDA_SUCCESS) return r;
        auto* n = static_cast<CUgraphNode>(raw);
        rc = set ? d.cuGraphKernelNodeSetAttribute(n, id, &value)
                 : d.cuGraphKernelNodeGetAttribute(n, id, &value);
    }
    if (rc != CUDA_SUCCESS) return rc;
    cx.out_blob({reinterpret_cast<const std::byte*>(&value), set ? 0 : sizeof value});
    return CUDA_SUCCESS;
}

}  // namespace vcuda::server
