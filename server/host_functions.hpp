// What graph handlers need of host functions that run in the client (server/handlers_hostfn.cpp): host nodes,
// and copies between the GPU and the client's memory inside graphs, which a server cannot address. Such a
// copy becomes a child graph of two nodes: a copy between the GPU and a staging buffer of the session, and a
// host node at which the client moves the bytes between that buffer and its memory (a copy to the GPU: the
// host node first; from the GPU: the copy first). The application sees one memcpy node. runs on: the lane's
// thread.
#pragma once

#include <cstdint>

#include "server/call_context.hpp"

namespace vcuda::server {

// A host node's function and data for the client's host function `id`, which runs at every launch of the
// graphs holding the node; kept by the session until it ends.
CUDA_HOST_NODE_PARAMS graph_host_func(call_context& cx, uint64_t id);
// The client's host-function id of a host node the session made (explicit or captured from a stream), read
// from the driver's node parameters; false for a node that is not one of those.
bool graph_host_func_id(const CUDA_HOST_NODE_PARAMS& p, uint64_t& id);

// The child graph of the client's copy `id`: `c` with its host side (exactly one, CU_MEMORYTYPE_HOST) the
// client's memory, its other side checked by the caller. The staging buffer is charged to the session's host
// memory quota and freed when the last graph or executable graph made from the child graph is destroyed (a
// CUDA user object). The caller adds it as a child graph node, then destroys it.
CUresult host_copy_graph(call_context& cx, CUDA_MEMCPY3D c, uint64_t id, CUgraph& out);

// True when `node` is a copy made by host_copy_graph (a child graph node that the client sees as a memcpy
// node).
bool is_host_copy_node(const driver_table& d, CUgraphNode node);
// The same, and then the copy as the driver holds it (its host side the staging buffer) and the client's id.
bool host_copy_of(const driver_table& d, CUgraphNode node, CUDA_MEMCPY3D& copy, uint64_t& id);

}  // namespace vcuda::server
