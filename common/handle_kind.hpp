// Kinds of the handles an application holds. A handle is a 64-bit id: the kind in the top byte (bits 56-63),
// the session's tag in bits 52-55, a generation in bits 32-51 (below 2^20) and a 32-bit index
// (server/handle_table.hpp sets the tag and wraps the generation). make_handle and handle_generation work on
// bits 32-55, so they see the tag as part of the generation: strip it first. The same id is what the
// application sees, so it never aliases a host pointer (the top byte is never set in user-space addresses).
#pragma once

#include <cstdint>
#include <string_view>

namespace vcuda {

enum class handle_kind : uint8_t {
    none = 0,
    context = 1,
    module = 2,
    function = 3,
    library = 4,
    kernel = 5,
    stream = 6,
    event = 7,
    graph = 8,
    graph_exec = 9,
    graph_node = 10,
    mem_pool = 11,
    link_state = 12,
    array = 13,
    mem_handle = 14,  // cuMemCreate's physical allocations (CUmemGenericAllocationHandle)
    mipmapped_array = 15,
    green_ctx = 16,      // cuGreenCtxCreate's (an SM partition); its CUcontext is the session's too
    resource_desc = 17,  // cuDevResourceGenerateDesc's
};
inline constexpr int handle_kind_count = 18;

constexpr handle_kind kind_of(uint64_t id) { return static_cast<handle_kind>(id >> 56); }
constexpr uint64_t make_handle(handle_kind k, uint32_t generation, uint32_t index) {
    return (uint64_t{static_cast<uint8_t>(k)} << 56) | (uint64_t{generation & 0xffffff} << 32) | index;
}
constexpr uint32_t handle_index(uint64_t id) { return static_cast<uint32_t>(id); }
constexpr uint32_t handle_generation(uint64_t id) { return static_cast<uint32_t>(id >> 32) & 0xffffff; }

constexpr std::string_view to_string(handle_kind k) {
    switch (k) {
        case handle_kind::none:
            return "none";
        case handle_kind::context:
            return "context";
        case handle_kind::module:
            return "module";
        case handle_kind::function:
            return "function";
        case handle_kind::library:
            return "library";
        case handle_kind::kernel:
            return "kernel";
        case handle_kind::stream:
            return "stream";
        case handle_kind::event:
            return "event";
        case handle_kind::graph:
            return "graph";
        case handle_kind::graph_exec:
            return "graph_exec";
        case handle_kind::graph_node:
            return "graph_node";
        case handle_kind::mem_pool:
            return "mem_pool";
        case handle_kind::link_state:
            return "link_state";
        case handle_kind::array:
            return "array";
        case handle_kind::mem_handle:
            return "mem_handle";
        case handle_kind::green_ctx:
            return "green_ctx";
        case handle_kind::resource_desc:
            return "resource_desc";
        case handle_kind::mipmapped_array:
            return "mipmapped_array";
    }
    return "unknown";
}

// Stream handles with a fixed meaning in CUDA, valid in every session.
inline constexpr uint64_t stream_null = 0, stream_legacy = 0x1, stream_per_thread = 0x2;

}  // namespace vcuda
