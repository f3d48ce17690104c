// Host functions that run in this process at the server's word (client/api_hostfn.cpp): those of streams, of
// graph host nodes, and the host side of graph copies with this process's memory (server/host_functions.hpp),
// for which the server asks at the copy's place in the graph. Graph ones are kept for the process's life: a
// graph runs them at every launch and gives no sign of its end here. runs on: the calling application thread
// (registration); the session's host-function thread (the runs). locks: the registry's own mutex.
#pragma once

#include <cstddef>
#include <cstdint>

#include "client/state.hpp"

namespace vcuda::client {

// The id under which the server asks for fn(data) at each run of a graph host node.
uint64_t graph_host_function(CUhostFn fn, void* data);

// This process's side of a graph copy: w bytes x h rows x depth slices at (x bytes, y, z) of a pitch x height
// layout from `base`. to_device: read at the host node, before the node's copy to the GPU; else written
// there, after the copy from the GPU.
struct host_copy_side {
    bool to_device = false;
    char* base = nullptr;
    size_t x = 0, y = 0, z = 0, pitch = 0, height = 0;
    size_t w = 0, h = 0, depth = 0;
};
// The id under which the server asks for the copy's host side.
uint64_t graph_host_copy(const host_copy_side& c);

// The side in this process of the graph copy registered under `id` (false: none, or a host function).
bool graph_host_copy_of(uint64_t id, host_copy_side& side);

// The function and data registered under `id` for a graph host node (false: none, or a copy's side).
bool graph_host_function_of(uint64_t id, CUhostFn& fn, void*& data);

// Forgets a registration the server refused.
void forget_host_function(uint64_t id);

}  // namespace vcuda::client
