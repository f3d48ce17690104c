// What other handlers need of graphs (server/handlers_graph.cpp): cuMemAllocAsync on a capturing stream makes
// a memory alloc node of the capture's graph, whose allocation the session holds as the graph's. runs on: the
// lane's thread.
#pragma once

#include <cstddef>
#include <cstdint>

#include "server/call_context.hpp"

namespace vcuda::server {

// Holds graph allocation [p, p+size) of session device `device` for the session while `g`, or a graph or
// executable graph made from it, holds the node that made it (a CUDA user object of `g`). Takes over the
// quota charge of `size` on `device`: credited when the hold ends, or at once when it cannot be made.
CUresult hold_graph_allocation(call_context& cx, CUgraph g, CUdeviceptr p, uint64_t size, size_t device);

}  // namespace vcuda::server
