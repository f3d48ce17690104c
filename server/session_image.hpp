// What a suspended session keeps of its GPU state in this server's memory, to be rebuilt at the same
// addresses and under the same handles (server/session_image.cpp). Handles keep their ids and their table
// entries; the image holds what the driver cannot be asked again once its objects are gone: memory and global
// contents, context settings, each function's and kernel's name and settable attributes, each stream's flags,
// priority and settable attributes.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "server/device_memory.hpp"

namespace vcuda::server {

// How a suspend's, a rebuild's or a move's reason names the driver's error.
inline std::string error_text(CUresult rc) { return "error " + std::to_string(static_cast<int>(rc)); }

// Stream attributes an application may set (cuStreamSetAttribute) besides the priority, which a stream is
// made with again; none holds a handle. A suspend or a move keeps them.
inline constexpr std::array<CUstreamAttrID, 4> settable_stream_attributes = {
    CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW, CU_LAUNCH_ATTRIBUTE_SYNCHRONIZATION_POLICY,
    CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP, CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN};

struct session_image {
    struct device_state {
        bool had_context = false;
        std::vector<std::pair<CUlimit, size_t>> limits;
        CUfunc_cache cache_config = CU_FUNC_CACHE_PREFER_NONE;
        std::vector<device_memory::saved_mapping> memory;
    };
    struct entry_state {
        uint64_t id = 0;
        std::string name;                             // functions and kernels: to look them up again
        std::vector<std::pair<int, int>> attributes;  // settable function attributes, as they were
        unsigned flags = 0;                           // streams and events
        int priority = 0;                             // streams
        std::vector<std::pair<CUstreamAttrID, CUstreamAttrValue>>
            stream_attributes;           // streams: settable ones
        bool recorded = false;           // events: recorded before the suspend
        double age_ms = 0;               // events: how long before the suspend (event_ages)
        uint64_t release_threshold = 0;  // pools the application made: CU_MEMPOOL_ATTR_RELEASE_THRESHOLD
    };
    struct global_state {
        CUdeviceptr address = 0;
        size_t size = 0;
        size_t device = 0;
        uint64_t owner = 0;
        std::string name;
        std::vector<std::byte> bytes;
        bool managed = false;  // a __managed__ variable
    };
    // The application's own VMM use (server/vmm_image.cpp): each physical allocation's properties and
    // contents, and each mapping's access; reservations stay while suspended, mappings are in the session's
    // bookkeeping.
    struct vmm_allocation_state {
        uint64_t id = 0;  // mem_handle id
        size_t size = 0;
        size_t device = 0;
        CUmemAllocationProp prop{};
        bool released = false;  // cuMemRelease'd while mapped: goes again at its last unmap
        unsigned refs = 1;      // the application's references to its handle (vmm_tables::allocation)
        device_memory::saved_mapping::bytes_type bytes{nullptr, device_memory::unmap_bytes{0}};
        // Or, moving to a server on the same GPU, the physical memory itself, exported
        // (save_mode::descriptor); on the target `by_descriptor` until the descriptor comes.
        std::unique_ptr<int, device_memory::close_descriptor> descriptor;
        bool by_descriptor = false;
        int fd() const { return descriptor ? *descriptor : -1; }
    };
    struct vmm_access_state {
        CUdeviceptr va = 0;  // a mapping
        std::vector<CUmemAccessDesc> access;
    };
    // A CUDA array or mipmapped array (server/array_image.cpp): its contents, rows without the driver's
    // padding, level after level; its descriptor stays in the session's array table.
    struct array_state {
        uint64_t id = 0;
        std::vector<uint64_t> levels;  // a mipmapped array's level handles, level 0 first
        std::vector<std::byte> bytes;
    };
    // A graph (server/graph_image.cpp): its nodes in the driver's order, each with what it takes to add it
    // again, and its edges as node positions. Children come before the graphs that hold them.
    struct graph_node_state {
        CUgraphNodeType type = CU_GRAPH_NODE_TYPE_EMPTY;
        std::vector<uint64_t> ids;                  // the session's node handles standing for it
        uint64_t function = 0;                      // kernel: the function or kernel handle
        std::array<unsigned, 7> dims{};             // kernel: grid xyz, block xyz, shared bytes
        std::vector<std::byte> params;              // kernel: its parameters, packed at the function's layout
        std::vector<CUlaunchAttribute> attributes;  // kernel: the node's (kernel_node_attributes) as read
        CUDA_MEMSET_NODE_PARAMS memset{};
        CUDA_MEMCPY3D copy{};
        uint64_t src_array = 0, dst_array = 0;  // memcpy: the array handles of its sides, if any
        uint64_t event = 0;                     // event record and wait: the event handle
        size_t child = 0;                       // child graph: its position in `graphs`
    };
    struct graph_state {
        uint64_t id = 0;    // the graph handle (0: a child, or an executable graph's clone)
        uint64_t exec = 0;  // the executable graph made from it (a clone's)
        unsigned long long flags = 0;
        size_t device = 0;
        std::vector<graph_node_state> nodes;
        std::vector<std::pair<size_t, size_t>> edges;
        std::vector<CUgraphEdgeData> edge_data;
        uint64_t child_id = 0;  // a child: the session's handle for it, if it has one
        // An executable graph's clone: the application's node handles of the graph it came from, with the
        // position of the clone's node each stands for.
        std::vector<std::pair<uint64_t, size_t>> exec_nodes;
    };
    std::vector<device_state> devices;
    std::vector<vmm_allocation_state> vmm_allocations;
    std::vector<vmm_access_state> vmm_access;
    std::vector<entry_state> entries;  // in the order they are made again: owners before what they own
    std::vector<global_state> globals;
    std::vector<array_state> arrays;
    std::vector<graph_state> graphs;                         // children before their parents
    std::vector<std::pair<uintptr_t, size_t>> host_regions;  // registered again at their addresses
    // Came from another server (take_moved_state): what it says of the code is checked against the driver
    // (each function's and kernel's parameter layout, by which launches are packed) when it is made again.
    bool moved_in = false;
    uint64_t bytes = 0;        // device memory and globals saved
    uint64_t handed_over = 0;  // of it, device memory exported as descriptors (a move on the same GPU)
};

}  // namespace vcuda::server
