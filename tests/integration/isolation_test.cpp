// Two sessions on one server: neither can read, write or free the other's memory, nor use its handles;
// quotas hold; bad input gets errors and harms no one; a session's end releases what it held.
#include <catch2/catch.hpp>

#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <utility>

#include <sys/mman.h>
#include <unistd.h>

#include "raw_client.hpp"

using namespace vcuda;
using namespace vcuda::test;

namespace {

std::vector<std::byte> pattern(size_t n, uint8_t seed) {
    std::vector<std::byte> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((i * 31 + seed) & 0xff);
    return v;
}

uint64_t alloc(raw_client& c, uint64_t size) {
    auto r = c.call(op::mem_alloc, {size});
    REQUIRE(r.result == CUDA_SUCCESS);
    REQUIRE(r.outs.size() == 1);
    return r.outs[0];
}

}  // namespace

TEST_CASE("a session cannot touch another session's memory or handles", "[integration]") {
    server_process server;
    auto a = raw_client::open(server.address());
    auto b = raw_client::open(server.address());
    REQUIRE(a);
    REQUIRE(b);
    REQUIRE(a->session_id() != b->session_id());

    const size_t n = 1 << 20;
    uint64_t b_ptr = alloc(*b, n);
    auto data = pattern(n, 7);
    REQUIRE(b->call(op::copy_htod, {b_ptr, 0}, {}, data).result == CUDA_SUCCESS);
    auto s = b->call(op::cuStreamCreate, {0});
    REQUIRE(s.result == CUDA_SUCCESS);
    uint64_t b_stream = s.outs.at(0);
    uint64_t a_ptr = alloc(*a, n);

    // Every forwarded way of reaching B's memory from A fails.
    CHECK(a->call(op::copy_dtoh, {b_ptr, n, 0}).result == CUDA_ERROR_INVALID_VALUE);
    CHECK(a->call(op::copy_dtoh, {b_ptr + 4096, 16, 0}).result == CUDA_ERROR_INVALID_VALUE);
    CHECK(a->call(op::copy_htod, {b_ptr, 0}, {}, pattern(64, 1)).result == CUDA_ERROR_INVALID_VALUE);
    CHECK(a->call(op::copy_dtod, {a_ptr, b_ptr, 64, 0}).result == CUDA_ERROR_INVALID_VALUE);
    CHECK(a->call(op::copy_dtod, {b_ptr, a_ptr, 64, 0}).result == CUDA_ERROR_INVALID_VALUE);
    CHECK(a->call(op::memset, {b_ptr, 0, 1, 64, 1, 64, 0}).result == CUDA_ERROR_INVALID_VALUE);
    CHECK(a->call(op::mem_free, {b_ptr}).result == CUDA_ERROR_INVALID_VALUE);
    // A range that starts in A's allocation and runs past its end is refused too (overflow-safe checks).
    CHECK(a->call(op::copy_dtoh, {a_ptr, n + 1, 0}).result == CUDA_ERROR_INVALID_VALUE);
    CHECK(a->call(op::copy_dtoh, {a_ptr + 8, ~uint64_t{0} - 4, 0}).result == CUDA_ERROR_INVALID_VALUE);
    // B's stream is not a handle of A's.
    CHECK(a->call(op::cuStreamSynchronize, {b_stream}).result == CUDA_ERROR_INVALID_HANDLE);
    CHECK(a->call(op::cuStreamDestroy_v2, {b_stream}).result == CUDA_ERROR_INVALID_HANDLE);
    CHECK(a->call(op::copy_dtoh, {a_ptr, 16, b_stream}).result == CUDA_ERROR_INVALID_HANDLE);
    // Forged handles: right kind, wrong index or generation.
    CHECK(a->call(op::cuStreamSynchronize, {b_stream + 1}).result == CUDA_ERROR_INVALID_HANDLE);
    CHECK(a->call(op::cuStreamSynchronize, {b_stream ^ (uint64_t{1} << 33)}).result ==
          CUDA_ERROR_INVALID_HANDLE);

    // B's data and handles are unchanged and still work.
    auto back = b->call(op::copy_dtoh, {b_ptr, n, b_stream});
    REQUIRE(back.result == CUDA_SUCCESS);
    CHECK(back.payload == data);
    CHECK(b->call(op::cuStreamDestroy_v2, {b_stream}).result == CUDA_SUCCESS);
    // A destroyed handle is stale from then on.
    CHECK(b->call(op::cuStreamSynchronize, {b_stream}).result == CUDA_ERROR_INVALID_HANDLE);
}

TEST_CASE("the memory quota refuses the allocation that passes it and nothing else breaks", "[integration]") {
    server_process server({"--memory-quota", "64MiB"});
    auto a = raw_client::open(server.address());
    REQUIRE(a);
    auto info = a->call(op::mem_get_info, {});
    REQUIRE(info.result == CUDA_SUCCESS);
    CHECK(info.outs.at(1) == (64u << 20));
    for (int i = 0; i < 4; ++i) alloc(*a, 16u << 20);
    auto over = a->call(op::mem_alloc, {16u << 20});
    CHECK(over.result == CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(over.detail.find("quota") != std::string::npos);
    // The server keeps serving this session and others.
    CHECK(a->call(op::mem_get_info, {}).result == CUDA_SUCCESS);
    auto b = raw_client::open(server.address());
    REQUIRE(b);
    alloc(*b, 16u << 20);
}

TEST_CASE("physical memory released while still mapped stays charged to the quota until its last unmap",
          "[integration]") {
    server_process server({"--memory-quota", "64MiB"});
    auto a = raw_client::open(server.address());
    REQUIRE(a);
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    std::vector<std::byte> blob(sizeof prop);
    std::memcpy(blob.data(), &prop, sizeof prop);
    const uint64_t size = 32u << 20;
    auto create = [&] { return a->call(op::vmm_create, {size, 0}, {blob}); };
    auto va = a->call(op::vmm_reserve, {2 * size, 0, 0, 0});
    REQUIRE(va.result == CUDA_SUCCESS);
    auto first = create();
    REQUIRE(first.result == CUDA_SUCCESS);
    REQUIRE(a->call(op::vmm_map, {va.outs.at(0), size, 0, first.outs.at(0), 0}).result == CUDA_SUCCESS);
    // Its access is its own to ask about (cuMemGetAccess); another session's question is refused.
    std::vector<std::byte> where(sizeof(CUmemLocation));
    std::memcpy(where.data(), &prop.location, sizeof(CUmemLocation));
    CHECK(a->call(op::vmm_get_access, {va.outs.at(0) + 4096}, {where}).result == CUDA_SUCCESS);
    {
        auto b = raw_client::open(server.address());
        REQUIRE(b);
        auto other = b->call(op::vmm_get_access, {va.outs.at(0) + 4096}, {where});
        CHECK(other.result == CUDA_ERROR_INVALID_VALUE);
        CHECK(other.detail.find("not inside a reservation of this session") != std::string::npos);
        CHECK(b->call(op::vmm_get_access, {va.outs.at(0)}, {std::vector<std::byte>(3)}).result ==
              CUDA_ERROR_INVALID_VALUE);  // a malformed location
    }
    // Released, but the mapping keeps the memory in use: it still counts.
    REQUIRE(a->call(op::vmm_release, {first.outs.at(0)}).result == CUDA_SUCCESS);
    REQUIRE(create().result == CUDA_SUCCESS);
    auto over = create();
    CHECK(over.result == CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(over.detail.find("quota") != std::string::npos);
    // The last unmap frees it.
    REQUIRE(a->call(op::vmm_unmap, {va.outs.at(0), size}).result == CUDA_SUCCESS);
    CHECK(create().result == CUDA_SUCCESS);
}

TEST_CASE("a queued call's failure is reported by the next synchronous call, once, with what failed",
          "[integration]") {
    server_process server;
    auto a = raw_client::open(server.address());
    REQUIRE(a);
    uint64_t p = alloc(*a, 4096);
    // A queued memset of memory the session does not own fails on the server; nothing answers it.
    REQUIRE(a->send_queued(op::memset, {p + (1u << 30), 0, 1, 64, 1, 64, 0}));
    auto r = a->call(op::mem_get_info, {});
    CHECK(r.result == CUDA_ERROR_INVALID_VALUE);
    CHECK(r.detail.find("earlier asynchronous call failed: memset") != std::string::npos);
    CHECK(r.outs.empty());
    // Reported once: the next call answers for itself.
    CHECK(a->call(op::mem_get_info, {}).result == CUDA_SUCCESS);
}

TEST_CASE("a session's end releases its memory for others", "[integration]") {
    server_process server({"--memory-quota", "64MiB"});
    {
        auto a = raw_client::open(server.address());
        REQUIRE(a);
        for (int i = 0; i < 4; ++i) alloc(*a, 16u << 20);
    }  // connection closed without any cleanup call, as a crashed client would
    // The software driver's device is 8 GiB; the session end must have returned A's 64 MiB to it, which the
    // server's log reports. Poll the log for the end of A's session.
    bool ended = false;
    for (int i = 0; i < 100 && !ended; ++i) {
        ended = server.log().find("released 64 MiB") != std::string::npos;
        if (!ended) usleep(20000);
    }
    INFO(server.log());
    CHECK(ended);
}

TEST_CASE("bad input gets an error and harms no other session", "[integration]") {
    server_process server;
    auto good = raw_client::open(server.address());
    REQUIRE(good);
    uint64_t p = alloc(*good, 4096);
    auto data = pattern(4096, 3);
    REQUIRE(good->call(op::copy_htod, {p, 0}, {}, data).result == CUDA_SUCCESS);

    auto bad = raw_client::open(server.address());
    REQUIRE(bad);
    // Unknown op: refused by the allowlist, connection kept.
    auto r = bad->call(uint32_t{9999}, {});
    CHECK(r.result == CUDA_ERROR_NOT_SUPPORTED);
    // Wrong number of arguments.
    CHECK(bad->call(op::mem_alloc, {}).result == CUDA_ERROR_INVALID_VALUE);
    CHECK(bad->call(op::copy_dtoh, {1, 2}).result == CUDA_ERROR_INVALID_VALUE);
    // A device index the session does not have.
    CHECK(bad->call(op::mem_alloc, {4096}, {}, {}, 7).result == CUDA_ERROR_INVALID_DEVICE);
    // Garbage bytes: the connection is closed.
    std::vector<std::byte> junk(64, std::byte{0x5a});
    REQUIRE(bad->send_raw(junk));
    CHECK(bad->closed_by_peer());

    // Joining a session with the wrong secret is refused.
    std::string why;
    CHECK(!raw_client::open(server.address(), good->session_id(), altered(good->key()), &why));
    CHECK(why.find("secret") != std::string::npos);

    auto back = good->call(op::copy_dtoh, {p, 4096, 0});
    REQUIRE(back.result == CUDA_SUCCESS);
    CHECK(back.payload == data);
}

TEST_CASE("waits for staging slots name only the session's shared host memory", "[integration]") {
    server_process server;
    auto good = raw_client::open(server.address());
    REQUIRE(good);
    uint64_t p = alloc(*good, 4096);
    auto shared = good->call(op::host_alloc, {1u << 20});
    REQUIRE(shared.result == CUDA_SUCCESS);
    REQUIRE(shared.outs.size() == 2);
    uint64_t slot = shared.outs[0];
    CHECK(good->call(op::host_region_wait, {slot}).result == CUDA_SUCCESS);  // no copy marked yet
    CHECK(good->call(op::copy_htod_shared, {p, slot, 4096, 0, 1}).result == CUDA_SUCCESS);
    CHECK(good->call(op::host_region_wait, {slot + 4096}).result == CUDA_SUCCESS);
    CHECK(good->call(op::copy_dtoh_shared, {slot, p, 4096, 0, 1}).result == CUDA_SUCCESS);
    CHECK(good->call(op::host_region_wait, {slot}).result == CUDA_SUCCESS);
    CHECK(good->call(op::copy_htod_shared, {p, slot, 4096, 0, 2}).result ==
          CUDA_ERROR_INVALID_VALUE);  // no such mark
    CHECK(good->call(op::host_region_wait, {0}).result == CUDA_ERROR_INVALID_VALUE);
    CHECK(good->call(op::host_region_wait, {slot + (1u << 20)}).result == CUDA_ERROR_INVALID_VALUE);

    auto other = raw_client::open(server.address());
    REQUIRE(other);
    uint64_t q = alloc(*other, 4096);
    CHECK(other->call(op::host_region_wait, {slot}).result == CUDA_ERROR_INVALID_VALUE);
    CHECK(other->call(op::copy_dtoh_shared, {slot, q, 4096, 0, 1}).result == CUDA_ERROR_INVALID_VALUE);

    REQUIRE(good->call(op::host_free, {slot}).result == CUDA_SUCCESS);
    CHECK(good->call(op::host_region_wait, {slot}).result == CUDA_ERROR_INVALID_VALUE);
    CHECK(good->call(op::copy_dtoh, {p, 4096, 0}).result == CUDA_SUCCESS);
}

namespace {

std::vector<std::byte> ids(std::initializer_list<uint64_t> v) {
    std::vector<std::byte> b(v.size() * sizeof(uint64_t));
    std::memcpy(b.data(), std::data(v), b.size());
    return b;
}

// A memset node {dst, value, element size, width, height, pitch} added to `graph` after `deps`.
raw_reply add_memset(raw_client& c, uint64_t graph, uint64_t dst, std::vector<std::byte> deps = {}) {
    return c.call(op::graph_add_node, {graph, CU_GRAPH_NODE_TYPE_MEMSET, dst, 0, 4, 16, 1, 64},
                  {std::move(deps), {}, {}});
}

}  // namespace

TEST_CASE("graph nodes are their session's, die with their graph, and name only the session's memory",
          "[integration]") {
    server_process server;
    auto a = raw_client::open(server.address());
    auto b = raw_client::open(server.address());
    REQUIRE(a);
    REQUIRE(b);
    uint64_t a_ptr = alloc(*a, 4096), b_ptr = alloc(*b, 4096);
    // Ids are per session (the same id may name one of B's own objects): A's graph and nodes are put at table
    // slots where B has nothing.
    REQUIRE(a->call(op::cuStreamCreate, {0}).result == CUDA_SUCCESS);
    auto g = a->call(op::cuGraphCreate, {0});
    auto gb = b->call(op::cuGraphCreate, {0});
    REQUIRE(g.result == CUDA_SUCCESS);
    REQUIRE(gb.result == CUDA_SUCCESS);
    auto n1 = add_memset(*a, g.outs.at(0), a_ptr);
    REQUIRE(n1.result == CUDA_SUCCESS);
    uint64_t node = n1.outs.at(0);
    auto n2 = a->call(op::graph_add_node, {g.outs[0], CU_GRAPH_NODE_TYPE_EMPTY}, {ids({node}), {}, {}});
    REQUIRE(n2.result == CUDA_SUCCESS);

    // Listing the graph names the same nodes (ids kept), with their types.
    auto all = a->call(op::graph_nodes, {g.outs[0], 0, 1, 4, 0});
    REQUIRE(all.result == CUDA_SUCCESS);
    REQUIRE(all.outs.size() == 5);
    CHECK(all.outs[0] == 2);
    CHECK(all.outs[1] == node);
    CHECK(all.outs[2] == CU_GRAPH_NODE_TYPE_MEMSET);
    CHECK(all.outs[3] == n2.outs.at(0));
    CHECK(all.outs[4] == CU_GRAPH_NODE_TYPE_EMPTY);

    // B can neither reach A's memory through a node nor use A's nodes and graphs.
    CHECK(add_memset(*b, gb.outs[0], a_ptr).result == CUDA_ERROR_INVALID_VALUE);
    CHECK(add_memset(*b, gb.outs[0], b_ptr, ids({node})).result == CUDA_ERROR_INVALID_HANDLE);
    CHECK(b->call(op::graph_nodes, {g.outs[0], 0, 0, 0, 0}).result == CUDA_ERROR_INVALID_HANDLE);
    CHECK(b->call(op::cuGraphDestroyNode, {node}).result == CUDA_ERROR_INVALID_HANDLE);
    CHECK(b->call(op::graph_memset_node_params, {node}).result == CUDA_ERROR_INVALID_HANDLE);
    CHECK(b->call(op::graph_node_object, {node, 0}).result == CUDA_ERROR_INVALID_HANDLE);
    CHECK(b->call(op::graph_node_object, {node, 2}).result == CUDA_ERROR_INVALID_HANDLE);
    CHECK(b->call(op::graph_kernel_node_params, {node}).result == CUDA_ERROR_INVALID_HANDLE);
    CHECK(b->call(op::graph_mem_node_params, {node}).result == CUDA_ERROR_INVALID_HANDLE);
    CHECK(b->call(op::graph_find_in_clone, {node, gb.outs[0]}).result == CUDA_ERROR_INVALID_HANDLE);
    CHECK(b->call(op::graph_edge_list, {g.outs[0], 0, 0, 0}).result == CUDA_ERROR_INVALID_HANDLE);
    CHECK(b->call(op::graph_dot_print, {g.outs[0], 0}).result == CUDA_ERROR_INVALID_HANDLE);
    CUDA_MEMCPY3D copy{};
    copy.srcMemoryType = copy.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    copy.srcDevice = a_ptr;
    copy.dstDevice = b_ptr;
    copy.WidthInBytes = 64;
    copy.Height = copy.Depth = 1;
    std::vector<std::byte> desc(sizeof copy);
    std::memcpy(desc.data(), &copy, sizeof copy);
    CHECK(b->call(op::graph_add_node, {gb.outs[0], CU_GRAPH_NODE_TYPE_MEMCPY}, {{}, {}, desc}).result ==
          CUDA_ERROR_INVALID_VALUE);
    copy.srcDevice = b_ptr;
    std::memcpy(desc.data(), &copy, sizeof copy);
    CHECK(b->call(op::graph_add_node, {gb.outs[0], CU_GRAPH_NODE_TYPE_MEMCPY}, {{}, {}, desc}).result ==
          CUDA_SUCCESS);
    // Host memory the session does not share with the server is not the server's to name: refused.
    copy.srcMemoryType = CU_MEMORYTYPE_HOST;
    copy.srcHost = reinterpret_cast<const void*>(b_ptr);
    std::memcpy(desc.data(), &copy, sizeof copy);
    CHECK(b->call(op::graph_add_node, {gb.outs[0], CU_GRAPH_NODE_TYPE_MEMCPY}, {{}, {}, desc}).result ==
          CUDA_ERROR_INVALID_VALUE);
    // The client's own memory (host copy 7): staged in a buffer of B's, as large as the copy, that A cannot
    // reach.
    CHECK(b->call(op::graph_add_node, {gb.outs[0], CU_GRAPH_NODE_TYPE_MEMCPY, 7}, {{}, {}, desc}).result ==
          CUDA_SUCCESS);
    auto staged = b->call(op::host_copy_read, {7, 0, 64});
    CHECK(staged.result == CUDA_SUCCESS);
    CHECK(staged.payload.size() == 64);
    CHECK(b->call(op::host_copy_read, {7, 1, 64}).result == CUDA_ERROR_INVALID_VALUE);
    CHECK(a->call(op::host_copy_read, {7, 0, 64}).result == CUDA_ERROR_INVALID_VALUE);
    CHECK(b->call(op::graph_add_node, {gb.outs[0], CU_GRAPH_NODE_TYPE_MEMCPY, 7}, {{}, {}, desc}).result ==
          CUDA_ERROR_INVALID_VALUE);  // the id is taken
    copy.dstMemoryType = CU_MEMORYTYPE_HOST;
    std::memcpy(desc.data(), &copy, sizeof copy);
    CHECK(b->call(op::graph_add_node, {gb.outs[0], CU_GRAPH_NODE_TYPE_MEMCPY, 8}, {{}, {}, desc}).result ==
          CUDA_ERROR_INVALID_VALUE);  // both sides the client's

    // Malformed: a node type not served, node ids that are not 8 bytes each, edge data of the wrong length.
    CHECK(a->call(op::graph_add_node, {g.outs[0], CU_GRAPH_NODE_TYPE_HOST}, {{}, {}, {}}).result ==
          CUDA_ERROR_INVALID_VALUE);
    CHECK(a->call(op::graph_add_node, {g.outs[0], CU_GRAPH_NODE_TYPE_EMPTY},
                  {std::vector<std::byte>(5), {}, {}})
              .result == CUDA_ERROR_INVALID_VALUE);
    CHECK(a->call(op::graph_add_node, {g.outs[0], CU_GRAPH_NODE_TYPE_EMPTY},
                  {ids({node}), std::vector<std::byte>(3), {}})
              .result == CUDA_ERROR_INVALID_VALUE);

    // What a node holds: its session reads it (the other session cannot, above); malformed or mistyped asks
    // are refused (ops graph_memset_node_params, graph_node_object, graph_kernel_node_params,
    // graph_mem_node_params, graph_find_in_clone).
    auto held = a->call(op::graph_memset_node_params, {node});
    REQUIRE(held.result == CUDA_SUCCESS);
    CHECK(held.outs == std::vector<uint64_t>{a_ptr, 64, 0, 4, 16, 1});
    CHECK(a->call(op::graph_memset_node_params, {}).result == CUDA_ERROR_INVALID_VALUE);
    CHECK(a->call(op::graph_node_object, {node, 7}).result == CUDA_ERROR_INVALID_VALUE);
    CHECK(a->call(op::graph_node_object, {node, 0}).result == CUDA_ERROR_INVALID_VALUE);  // not an event node
    CHECK(a->call(op::graph_node_object, {node, 1}).result == CUDA_ERROR_INVALID_VALUE);  // nor a child graph
    CHECK(a->call(op::graph_node_object, {node, 2}).result == CUDA_ERROR_INVALID_VALUE);  // nor a host node
    CHECK(a->call(op::graph_kernel_node_params, {node}).result == CUDA_ERROR_INVALID_VALUE);
    CHECK(a->call(op::graph_mem_node_params, {node}).result == CUDA_ERROR_INVALID_VALUE);  // not alloc/free
    CHECK(a->call(op::graph_find_in_clone, {node, g.outs[0]}).result ==
          CUDA_ERROR_INVALID_VALUE);  // no clone
    CHECK(a->call(op::graph_find_in_clone, {node, node}).result == CUDA_ERROR_INVALID_HANDLE);

    // The graph's one edge, listed with the nodes' ids and types (op graph_edge_list); its DOT text comes
    // back as a blob (op graph_dot_print). Malformed asks are refused.
    auto edges = a->call(op::graph_edge_list, {g.outs[0], 1, 2, 1});
    REQUIRE(edges.result == CUDA_SUCCESS);
    CHECK(edges.outs ==
          std::vector<uint64_t>{1, node, CU_GRAPH_NODE_TYPE_MEMSET, n2.outs[0], CU_GRAPH_NODE_TYPE_EMPTY});
    CHECK((edges.blobs.size() == 1 && edges.blobs[0].size() == sizeof(CUgraphEdgeData)));
    CHECK(a->call(op::graph_edge_list, {g.outs[0], 0, 0, 1}).result == CUDA_ERROR_INVALID_VALUE);  // no array
    CHECK(a->call(op::graph_edge_list, {g.outs[0], 1, uint64_t{1} << 40, 0}).result ==
          CUDA_ERROR_INVALID_VALUE);
    CHECK(a->call(op::graph_edge_list, {node, 0, 0, 0}).result == CUDA_ERROR_INVALID_HANDLE);
    auto dot = a->call(op::graph_dot_print, {g.outs[0], 0});
    REQUIRE(dot.result == CUDA_SUCCESS);
    REQUIRE(dot.blobs.size() == 1);
    CHECK(std::string(reinterpret_cast<const char*>(dot.blobs[0].data()), dot.blobs[0].size())
              .find("digraph") != std::string::npos);
    CHECK(a->call(op::graph_dot_print, {g.outs[0], uint64_t{1} << 32}).result == CUDA_ERROR_INVALID_VALUE);
    CHECK(a->call(op::graph_dot_print, {g.outs[0]}).result == CUDA_ERROR_INVALID_VALUE);

    // The graph takes its nodes with it: their ids are stale.
    REQUIRE(a->call(op::cuGraphDestroy, {g.outs[0]}).result == CUDA_SUCCESS);
    auto g2 = a->call(op::cuGraphCreate, {0});
    REQUIRE(g2.result == CUDA_SUCCESS);
    CHECK(add_memset(*a, g2.outs.at(0), a_ptr, ids({node})).result == CUDA_ERROR_INVALID_HANDLE);
    CHECK(a->call(op::cuGraphDestroyNode, {n2.outs[0]}).result == CUDA_ERROR_INVALID_HANDLE);
    CHECK(a->call(op::graph_nodes, {node, 2, 0, 0, 0}).result == CUDA_ERROR_INVALID_HANDLE);
    CHECK(a->call(op::graph_memset_node_params, {node}).result == CUDA_ERROR_INVALID_HANDLE);
}

namespace {
// The software driver's kernel drv_scale(float* x, float a, int n), looked up in a library loaded on a lane
// with no context: {kernel, parameter count, (offset, size) of each}.
raw_reply scale_kernel(raw_client& c) {
    const std::vector<std::byte> image(16, std::byte{0x5a});  // the software driver does not parse images
    auto lib = c.call(op::module_load, {1, 0, 0x1a7e1a7e, 1, image.size()}, {}, image, -1);
    REQUIRE(lib.result == CUDA_SUCCESS);
    const std::string name = "drv_scale";
    std::vector<std::byte> name_blob(reinterpret_cast<const std::byte*>(name.data()),
                                     reinterpret_cast<const std::byte*>(name.data()) + name.size());
    auto k = c.call(op::library_get_kernel, {lib.outs.at(0)}, {name_blob}, {}, -1);
    REQUIRE(k.result == CUDA_SUCCESS);
    REQUIRE(k.outs.size() == 8);
    return k;
}
}  // namespace

TEST_CASE(
    "a kernel looked up on a lane with no context gets its real layout, and launches that do not match it "
    "are refused",
    "[integration]") {
    // The crash this guards against: a new client thread (no context) looked a kernel up, the
    // parameter-layout query failed for want of a context, the kernel was given out with no parameters, and
    // its launch reached the driver with a parameter array that did not match the kernel (SIGSEGV in the
    // driver, every tenant lost).
    server_process server;
    auto a = raw_client::open(server.address());
    auto b = raw_client::open(server.address());
    REQUIRE(a);
    REQUIRE(b);
    auto k = scale_kernel(*a);
    CHECK(k.outs[1] == 3);
    CHECK((k.outs[2] == 0 && k.outs[3] == 8));
    CHECK((k.outs[4] == 8 && k.outs[5] == 4));
    CHECK((k.outs[6] == 12 && k.outs[7] == 4));

    const int n = 256;
    uint64_t x = alloc(*a, n * sizeof(float));
    std::vector<float> host(n);
    for (int i = 0; i < n; ++i) host[i] = static_cast<float>(i);
    std::vector<std::byte> bytes(n * sizeof(float));
    std::memcpy(bytes.data(), host.data(), bytes.size());
    REQUIRE(a->call(op::copy_htod, {x, 0}, {}, bytes).result == CUDA_SUCCESS);
    auto block = [&](size_t size) {
        std::vector<std::byte> p(size);
        const float scale = 2.0f;
        if (size >= 8) std::memcpy(p.data(), &x, 8);
        if (size >= 12) std::memcpy(p.data() + 8, &scale, 4);
        if (size >= 16) std::memcpy(p.data() + 12, &n, 4);
        return p;
    };
    auto launch = [&](uint64_t form, std::vector<std::byte> params) {
        return a->call(op::launch, {k.outs[0], 1, 1, 1, static_cast<uint64_t>(n), 1, 1, 0, 0, form, 0},
                       {std::move(params)});
    };
    // Too short, too long, empty (what the client packed when the layout came back empty).
    for (size_t size : {0, 12, 24}) {
        INFO("kernelParams block of " << size << " bytes");
        auto r = launch(0, block(size));
        CHECK(r.result == CUDA_ERROR_INVALID_VALUE);
        CHECK(r.detail.find("parameter") != std::string::npos);
    }
    CHECK(server.wait_for_log("launch refused"));
    // A short `extra` buffer is taken, as natively (NCCL passes one): the parameters it leaves out read as
    // zeros (n = 0 here: the kernel does nothing), never as bytes past what the client sent.
    CHECK(launch(1, block(8)).result == CUDA_SUCCESS);
    // The server runs on; the right launch works, in both forms, and the other session is untouched.
    REQUIRE(launch(0, block(16)).result == CUDA_SUCCESS);
    REQUIRE(launch(1, block(16)).result == CUDA_SUCCESS);
    auto back = a->call(op::copy_dtoh, {x, bytes.size(), 0});
    REQUIRE(back.result == CUDA_SUCCESS);
    std::vector<float> out(n);
    std::memcpy(out.data(), back.payload.data(), bytes.size());
    for (int i = 0; i < n; ++i) REQUIRE(out[i] == 4.0f * static_cast<float>(i));
    CHECK(b->call(op::mem_get_info, {}).result == CUDA_SUCCESS);
}

TEST_CASE("a launch records only its own session's events through its attributes", "[integration]") {
    server_process server;
    auto a = raw_client::open(server.address());
    auto b = raw_client::open(server.address());
    REQUIRE(a);
    REQUIRE(b);
    auto k = scale_kernel(*a);
    const int n = 64;
    const uint64_t x = alloc(*a, n * sizeof(float));
    std::vector<float> host(n);
    for (int i = 0; i < n; ++i) host[i] = static_cast<float>(i);
    std::vector<std::byte> bytes(n * sizeof(float));
    std::memcpy(bytes.data(), host.data(), bytes.size());
    REQUIRE(a->call(op::copy_htod, {x, 0}, {}, bytes).result == CUDA_SUCCESS);
    std::vector<std::byte> params(16);
    const float two = 2.0f;
    std::memcpy(params.data(), &x, 8);
    std::memcpy(params.data() + 8, &two, 4);
    std::memcpy(params.data() + 12, &n, 4);
    auto own = a->call(op::cuEventCreate, {CU_EVENT_DISABLE_TIMING});
    auto other = b->call(op::cuEventCreate, {CU_EVENT_DISABLE_TIMING});
    REQUIRE(own.result == CUDA_SUCCESS);
    REQUIRE(other.result == CUDA_SUCCESS);
    auto launch = [&](CUlaunchAttributeID id, uint64_t event) {
        CUlaunchAttribute attr{};
        attr.id = id;
        if (id == CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_EVENT)
            attr.value.programmaticEvent.event = reinterpret_cast<CUevent>(event);
        else
            attr.value.launchCompletionEvent.event = reinterpret_cast<CUevent>(event);
        std::vector<std::byte> attr_blob(sizeof attr);
        std::memcpy(attr_blob.data(), &attr, sizeof attr);
        return a->call(op::launch, {k.outs[0], 1, 1, 1, static_cast<uint64_t>(n), 1, 1, 0, 0, 0, 1},
                       {params, attr_blob});
    };
    for (auto id : {CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_EVENT, CU_LAUNCH_ATTRIBUTE_LAUNCH_COMPLETION_EVENT}) {
        INFO("attribute " << id);
        // Another session's event, or no event at all: refused before the driver sees the launch.
        CHECK(launch(id, other.outs.at(0)).result == CUDA_ERROR_INVALID_HANDLE);
        CHECK(launch(id, 0x5eed).result == CUDA_ERROR_INVALID_HANDLE);
        // Its own: the launch runs and the event is recorded.
        REQUIRE(launch(id, own.outs.at(0)).result == CUDA_SUCCESS);
        CHECK(a->call(op::cuEventSynchronize, {own.outs.at(0)}).result == CUDA_SUCCESS);
    }
    // The two accepted launches ran, the refused ones did not.
    auto back = a->call(op::copy_dtoh, {x, bytes.size(), 0});
    REQUIRE(back.result == CUDA_SUCCESS);
    std::vector<float> out(n);
    std::memcpy(out.data(), back.payload.data(), bytes.size());
    for (int i = 0; i < n; ++i) REQUIRE(out[i] == 4.0f * static_cast<float>(i));
    CHECK(b->call(op::cuEventQuery, {other.outs.at(0)}).result == CUDA_SUCCESS);
}

TEST_CASE("a file registration takes only whole pages of a regular file, and its descriptor only",
          "[integration]") {
    server_process server;
    auto a = raw_client::open(server.address());
    REQUIRE(a);
    auto open_fds = [&] {
        size_t n = 0;
        for ([[maybe_unused]] auto& e :
             std::filesystem::directory_iterator("/proc/" + std::to_string(server.pid()) + "/fd"))
            ++n;
        return n;
    };
    auto file = [](size_t bytes) {
        int fd = ::memfd_create("vcuda-test-file", MFD_CLOEXEC);
        REQUIRE(fd >= 0);
        REQUIRE(::ftruncate(fd, static_cast<off_t>(bytes)) == 0);
        return fd;
    };
    // Device memory first: the software driver opens descriptors of its own for it.
    const uint64_t dev = alloc(*a, 4096);
    REQUIRE(a->call(op::memset, {dev, 0x5a, 1, 4096, 1, 4096, 0}).result == CUDA_SUCCESS);
    const size_t fds_before = open_fds();
    // No descriptor with the call: refused, and nothing is left for a later call to take.
    auto none = a->call(op::host_register_file, {0, 4096});
    CHECK(none.result == CUDA_ERROR_INVALID_VALUE);
    CHECK(none.detail.find("descriptor") != std::string::npos);
    // Not a regular file; pages past the file's end; an offset inside a page; nothing.
    int pipe_fds[2];
    REQUIRE(::pipe(pipe_fds) == 0);
    CHECK(a->call_with_fd(op::host_register_file, {0, 4096}, pipe_fds[0]).result == CUDA_ERROR_INVALID_VALUE);
    ::close(pipe_fds[0]);
    ::close(pipe_fds[1]);
    int f = file(8192);
    CHECK(a->call_with_fd(op::host_register_file, {4096, 8192}, f).result == CUDA_ERROR_INVALID_VALUE);
    CHECK(a->call_with_fd(op::host_register_file, {100, 4096}, f).result == CUDA_ERROR_INVALID_VALUE);
    CHECK(a->call_with_fd(op::host_register_file, {0, 0}, f).result == CUDA_ERROR_INVALID_VALUE);
    CHECK(a->call_with_fd(op::host_register_file, {0, uint64_t{1} << 50}, f).result ==
          CUDA_ERROR_INVALID_VALUE);
    ::close(f);
    // After each refusal the next call without a descriptor still finds none queued.
    CHECK(a->call(op::host_register_file, {0, 4096}).detail.find("descriptor") != std::string::npos);
    // A file whose last page is partly past its end (NCCL's segments): registered, written through the
    // server's mapping, freed.
    f = file(8192 + 4);
    auto ok = a->call_with_fd(op::host_register_file, {0, 12288}, f);
    REQUIRE(ok.result == CUDA_SUCCESS);
    REQUIRE(ok.outs.size() == 2);
    const uint64_t region = ok.outs[0];
    REQUIRE(a->call(op::copy_dtoh_shared, {region + 4096, dev, 4096, 0}).result == CUDA_SUCCESS);
    unsigned char seen = 0;
    REQUIRE(::pread(f, &seen, 1, 4096 + 17) == 1);
    CHECK(seen == 0x5a);  // the server wrote the client's own file
    CHECK(a->call(op::host_free, {region}).result == CUDA_SUCCESS);
    ::close(f);
    // The server kept no descriptor of any of these files.
    CHECK(open_fds() == fds_before);
}

TEST_CASE("a batch of stream memory operations touching another session's memory is refused whole",
          "[integration]") {
    server_process server;
    auto a = raw_client::open(server.address());
    auto b = raw_client::open(server.address());
    REQUIRE(a);
    REQUIRE(b);
    const uint64_t mine = alloc(*a, 4096), theirs = alloc(*b, 4096);
    REQUIRE(a->call(op::memset, {mine, 0, 1, 4096, 1, 4096, 0}).result == CUDA_SUCCESS);
    auto write32 = [](uint64_t addr, uint32_t value) {
        CUstreamBatchMemOpParams o{};
        o.writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
        o.writeValue.address = addr;
        o.writeValue.value = value;
        return o;
    };
    auto batch = [&](std::vector<CUstreamBatchMemOpParams> ops) {
        std::vector<std::byte> blob(ops.size() * sizeof(CUstreamBatchMemOpParams));
        std::memcpy(blob.data(), ops.data(), blob.size());
        return a->call(op::stream_batch_memop, {0, ops.size(), 0, 0}, {blob});
    };
    // The first write is to its own memory, the second to the other tenant's: nothing runs.
    auto r = batch({write32(mine, 7), write32(theirs, 8)});
    CHECK(r.result == CUDA_ERROR_INVALID_VALUE);
    auto misaligned = batch({write32(mine + 2, 9)});
    CHECK(misaligned.result == CUDA_ERROR_INVALID_VALUE);
    CHECK(a->call(op::stream_batch_memop, {0, 3, 0, 0}, {std::vector<std::byte>(8)}).result ==
          CUDA_ERROR_INVALID_VALUE);  // a blob that is not 3 operations
    auto back = a->call(op::copy_dtoh, {mine, 4, 0});
    REQUIRE(back.result == CUDA_SUCCESS);
    uint32_t word = 1;
    std::memcpy(&word, back.payload.data(), 4);
    CHECK(word == 0);
    // A batch of its own memory runs.
    REQUIRE(batch({write32(mine, 7), write32(mine + 4, 8)}).result == CUDA_SUCCESS);
    back = a->call(op::copy_dtoh, {mine, 8, 0});
    REQUIRE(back.result == CUDA_SUCCESS);
    uint32_t words[2] = {};
    std::memcpy(words, back.payload.data(), 8);
    CHECK(words[0] == 7);
    CHECK(words[1] == 8);
}

TEST_CASE("tensor maps are encoded only over the session's own memory, from well-formed arguments",
          "[integration]") {
    server_process server;
    auto a = raw_client::open(server.address());
    auto b = raw_client::open(server.address());
    REQUIRE(a);
    REQUIRE(b);
    const uint64_t rows = 64, cols = 64, bytes = rows * cols * 4;
    uint64_t a_ptr = alloc(*a, bytes);
    uint64_t b_ptr = alloc(*b, bytes);
    auto u64s = [](std::vector<uint64_t> v) {
        std::vector<std::byte> out(v.size() * 8);
        if (!v.empty()) std::memcpy(out.data(), v.data(), out.size());
        return out;
    };
    auto u32s = [](std::vector<uint32_t> v) {
        std::vector<std::byte> out(v.size() * 4);
        if (!v.empty()) std::memcpy(out.data(), v.data(), out.size());
        return out;
    };
    // The op's 13 arguments (protocol/OPS.md), those a kind does not take 0.
    auto all13 = [](std::vector<uint64_t> v) {
        v.resize(13);
        return v;
    };
    auto tiled = [&](raw_client& c, uint64_t addr, uint64_t r, uint64_t stride) {
        return c.call(op::tensor_map_encode, all13({0, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, addr, 0, 0, 0, 0}),
                      {u64s({cols, r}), u64s({stride}), u32s({1, 1}), u32s({16, 16})});
    };
    CHECK(tiled(*a, a_ptr, rows, cols * 4).result == CUDA_SUCCESS);
    CHECK(tiled(*b, b_ptr, rows, cols * 4).result == CUDA_SUCCESS);
    // B's memory, from A.
    auto r = tiled(*a, b_ptr, rows, cols * 4);
    CHECK(r.result == CUDA_ERROR_INVALID_VALUE);
    CHECK(r.detail.find("not memory this session owns") != std::string::npos);
    // A's allocation, but the tensor runs past its end: one row more, or a stride that walks out of it.
    CHECK(tiled(*a, a_ptr, rows + 1, cols * 4).result == CUDA_ERROR_INVALID_VALUE);
    CHECK(tiled(*a, a_ptr, rows, cols * 8).result == CUDA_ERROR_INVALID_VALUE);
    CHECK(tiled(*a, a_ptr, rows, ~uint64_t{0} - 15).result == CUDA_ERROR_INVALID_VALUE);  // overflow
    // A null address is encoded, as the driver does (it names no memory; ReplaceAddress gives it one later).
    CHECK(tiled(*a, 0, rows, cols * 4).result == CUDA_SUCCESS);
    // Malformed: unknown kind, ranks out of range, wrong argument and blob counts and sizes, an unknown type.
    const std::vector<std::vector<std::byte>> good_blobs = {u64s({cols, rows}), u64s({cols * 4}),
                                                            u32s({1, 1}), u32s({16, 16})};
    // {kind, rank}: an unknown kind; ranks 6 and 0; rank 3 with the blobs of rank 2.
    for (auto [kind, rank] : {std::pair<uint64_t, uint64_t>{3, 2}, {0, 6}, {0, 0}, {0, 3}}) {
        INFO("kind " << kind << ", rank " << rank);
        CHECK(a->call(op::tensor_map_encode,
                      all13({kind, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, rank, a_ptr, 0, 0, 0, 0}), good_blobs)
                  .result == CUDA_ERROR_INVALID_VALUE);
    }
    CHECK(a->call(op::tensor_map_encode, all13({0, 99, 2, a_ptr, 0, 0, 0, 0}), good_blobs).result ==
          CUDA_ERROR_INVALID_VALUE);
    CHECK(a->call(op::tensor_map_encode, {0, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, a_ptr, 0, 0, 0}, good_blobs)
              .result == CUDA_ERROR_INVALID_VALUE);
    CHECK(a->call(op::tensor_map_encode, all13({0, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, a_ptr, 0, 0, 0, 0}),
                  {u64s({cols, rows}), u64s({cols * 4}), u32s({1, 1})})
              .result == CUDA_ERROR_INVALID_VALUE);
    CHECK(a->call(op::tensor_map_encode, all13({0, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, a_ptr, 0, 0, 0, 0}),
                  {u64s({cols, rows}), u64s({cols * 4}), u32s({1, 1}), u32s({16, 16, 16})})
              .result == CUDA_ERROR_INVALID_VALUE);
    CHECK(a->call(op::tensor_map_encode,
                  all13({0, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, a_ptr, 1u << 20, 0, 0, 0}), good_blobs)
              .result == CUDA_ERROR_INVALID_VALUE);
    // What a kind does not take must be 0: a tiled map given im2col's channels is malformed.
    auto stray = all13({0, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, a_ptr, 0, 0, 0, 0});
    stray[8] = 16;
    CHECK(a->call(op::tensor_map_encode, stray, good_blobs).result == CUDA_ERROR_INVALID_VALUE);
    // im2col needs rank 3 or more, and its corners.
    CHECK(a->call(op::tensor_map_encode,
                  all13({1, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, a_ptr, 0, 0, 0, 0, 16, 32}),
                  {u64s({cols, rows}), u64s({cols * 4}), u32s({1, 1}), {}})
              .result == CUDA_ERROR_INVALID_VALUE);
    // A's session goes on.
    CHECK(tiled(*a, a_ptr, rows, cols * 4).result == CUDA_SUCCESS);
}

TEST_CASE("a session's stream capture in global mode refuses no call of another session", "[integration]") {
    // The driver's capture-mode rules span its process: under server threads, one tenant's global-mode
    // capture made the driver refuse other tenants' allocations and registrations (session 16, on the H200).
    const std::string isolation = GENERATE("thread", "process");
    INFO("--isolation " << isolation);
    server_process server({"--isolation", isolation});
    auto a = raw_client::open(server.address());
    auto b = raw_client::open(server.address());
    REQUIRE(a);
    REQUIRE(b);
    auto s = a->call(op::cuStreamCreate, {CU_STREAM_NON_BLOCKING});
    REQUIRE(s.result == CUDA_SUCCESS);
    const uint64_t stream = s.outs.at(0);
    auto begun =
        a->call(op::begin_capture, {stream, CU_STREAM_CAPTURE_MODE_GLOBAL, CU_STREAM_CAPTURE_MODE_GLOBAL});
    REQUIRE(begun.result == CUDA_SUCCESS);
    REQUIRE(begun.outs.size() == 2);

    auto other = b->call(op::mem_alloc, {4096});
    CHECK(other.result == CUDA_SUCCESS);
    if (other.result == CUDA_SUCCESS) CHECK(b->call(op::mem_free, {other.outs.at(0)}).result == CUDA_SUCCESS);
    // The capturing thread's own rule holds: its unsafe calls are refused while it captures.
    CHECK(a->call(op::mem_alloc, {4096}).result == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);

    auto ended = a->call(op::end_capture, {stream, begun.outs[1]});
    CHECK(ended.result == CUDA_SUCCESS);
    CHECK(b->call(op::mem_alloc, {4096}).result == CUDA_SUCCESS);
}

TEST_CASE("deferred copies take only the session's memory, stay within their bound and answer once",
          "[integration]") {
    server_process server;
    auto a = raw_client::open(server.address());
    auto b = raw_client::open(server.address());
    REQUIRE(a);
    REQUIRE(b);
    const uint64_t mine = alloc(*a, 8u << 20), theirs = alloc(*b, 4096);
    std::vector<std::byte> pattern(4096);
    for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<std::byte>(i * 7);
    REQUIRE(a->call(op::copy_htod, {mine, 0}, {}, pattern).result == CUDA_SUCCESS);
    // Collected records: ticket -> {status, bytes}.
    auto collect = [&](raw_client& c) {
        std::map<uint64_t, std::pair<uint64_t, std::vector<std::byte>>> got;
        auto r = c.call(op::deferred_collect, {});
        REQUIRE(r.result == CUDA_SUCCESS);
        for (size_t at = 0; at + 24 <= r.payload.size();) {
            uint64_t head[3];
            std::memcpy(head, r.payload.data() + at, sizeof head);
            at += sizeof head;
            REQUIRE(head[1] <= r.payload.size() - at);
            got[head[0]] = {head[2],
                            {r.payload.begin() + static_cast<std::ptrdiff_t>(at),
                             r.payload.begin() + static_cast<std::ptrdiff_t>(at + head[1])}};
            at += head[1];
        }
        return got;
    };
    // Another session's memory, no ticket, no bytes, too many: refused, each error at the next synchronous
    // call; a refused copy with a ticket is answered as failed, so that a client stops waiting for it.
    const std::vector<std::vector<uint64_t>> bad = {
        {theirs, 4096, 0, 1}, {mine, 4096, 0, 0}, {mine, 0, 0, 2}, {mine, (8u << 20) + 1, 0, 3}};
    for (auto& args : bad) {
        INFO("args " << args[0] << " " << args[1] << " ticket " << args[3]);
        REQUIRE(a->send_queued(op::copy_dtoh_deferred, args));
        CHECK(a->call(op::mem_get_info, {}).result == CUDA_ERROR_INVALID_VALUE);
    }
    auto refused = collect(*a);
    CHECK(refused.size() == 3);  // tickets 1, 2, 3 (ticket 0 names nothing)
    for (auto& [ticket, r] : refused) CHECK(r.first != CUDA_SUCCESS);
    // A good one: its bytes, once; a ticket in use is refused without touching the first copy.
    REQUIRE(a->send_queued(op::copy_dtoh_deferred, {mine, 4096, 0, 10}));
    REQUIRE(a->send_queued(op::copy_dtoh_deferred, {mine, 16, 0, 10}));
    CHECK(a->call(op::deferred_wait, {10}).result == CUDA_SUCCESS);
    CHECK(a->call(op::mem_get_info, {}).result == CUDA_ERROR_INVALID_VALUE);  // the second one's error
    auto first = collect(*a);
    REQUIRE(first.count(10) == 1);
    CHECK(first[10].first == CUDA_SUCCESS);
    CHECK(first[10].second == pattern);
    CHECK(collect(*a).empty());
    // Another session collects nothing of this one's, and waits for none of its tickets.
    REQUIRE(a->send_queued(op::copy_dtoh_deferred, {mine, 4096, 0, 11}));
    CHECK(a->call(op::deferred_wait, {11}).result == CUDA_SUCCESS);
    CHECK(b->call(op::deferred_wait, {11}).result == CUDA_SUCCESS);
    CHECK(collect(*b).empty());
    CHECK(collect(*a).count(11) == 1);
    // The bound: 64 MiB under way at most; the copy past it is refused and reported.
    for (uint64_t t = 100; t < 108; ++t)
        REQUIRE(a->send_queued(op::copy_dtoh_deferred, {mine, 8u << 20, 0, t}));
    REQUIRE(a->send_queued(op::copy_dtoh_deferred, {mine, 8u << 20, 0, 108}));
    CHECK(a->call(op::deferred_wait, {107}).result == CUDA_SUCCESS);
    CHECK(a->call(op::mem_get_info, {}).result == CUDA_ERROR_INVALID_VALUE);  // the ninth one's
    auto full = collect(*a);
    CHECK(full.size() == 8);
    CHECK(full.count(108) == 0);
    // An earlier queued call's failure is the application's: the client's own collection and wait neither
    // answer it nor lose their copies to it; the next other call does.
    REQUIRE(a->send_queued(op::copy_dtoh_deferred, {mine, 4096, 0, 300}));
    REQUIRE(a->send_queued(op::memset, {mine + (1u << 30), 0, 1, 64, 1, 64, 0}));
    CHECK(a->call(op::deferred_wait, {300}).result == CUDA_SUCCESS);
    CHECK(collect(*a).count(300) == 1);
    CHECK(a->call(op::mem_get_info, {}).result == CUDA_ERROR_INVALID_VALUE);
    // Collected, the bound is free again; copies left uncollected go with the session.
    REQUIRE(a->send_queued(op::copy_dtoh_deferred, {mine, 8u << 20, 0, 200}));
    CHECK(a->call(op::deferred_wait, {200}).result == CUDA_SUCCESS);
    CHECK(b->call(op::mem_get_info, {}).result == CUDA_SUCCESS);
}

TEST_CASE("user objects: only the session's, only while the application holds a reference, destroyed once",
          "[integration]") {
    server_process server;
    auto a = raw_client::open(server.address());
    auto b = raw_client::open(server.address());
    REQUIRE(a);
    REQUIRE(b);
    auto g = a->call(op::cuGraphCreate, {0});
    auto gb = b->call(op::cuGraphCreate, {0});
    REQUIRE(g.result == CUDA_SUCCESS);
    REQUIRE(gb.result == CUDA_SUCCESS);
    constexpr uint64_t retain = 1, release = 0, move = CU_GRAPH_USER_OBJECT_MOVE;
    // Made: id 0, no reference or too many, an id in use are refused.
    CHECK(a->call(op::user_object_create, {0, 1}).result == CUDA_ERROR_INVALID_VALUE);
    CHECK(a->call(op::user_object_create, {7, 0}).result == CUDA_ERROR_INVALID_VALUE);
    CHECK(a->call(op::user_object_create, {7, uint64_t{1} << 32}).result == CUDA_ERROR_INVALID_VALUE);
    REQUIRE(a->call(op::user_object_create, {7, 1}).result == CUDA_SUCCESS);
    CHECK(a->call(op::user_object_create, {7, 1}).result == CUDA_ERROR_INVALID_VALUE);
    // Another session names nothing of A's: not the object, not with its own graph, not A's graph.
    CHECK(b->call(op::user_object_refs, {7, 1, retain}).result == CUDA_ERROR_INVALID_VALUE);
    CHECK(b->call(op::user_object_refs, {7, 1, release}).result == CUDA_ERROR_INVALID_VALUE);
    CHECK(b->call(op::graph_user_object, {gb.outs.at(0), 7, 1, 0, retain}).result ==
          CUDA_ERROR_INVALID_VALUE);
    CHECK(b->call(op::graph_user_object, {g.outs.at(0), 7, 1, 0, retain}).result != CUDA_SUCCESS);
    // More released than held, a bad count or flags: refused, and the object is still A's.
    CHECK(a->call(op::user_object_refs, {7, 2, release}).result == CUDA_ERROR_INVALID_VALUE);
    CHECK(a->call(op::user_object_refs, {7, 0, retain}).result == CUDA_ERROR_INVALID_VALUE);
    CHECK(a->call(op::graph_user_object, {g.outs.at(0), 7, 2, move, retain}).result ==
          CUDA_ERROR_INVALID_VALUE);
    CHECK(a->call(op::graph_user_object, {g.outs.at(0), 7, 1, 99, retain}).result ==
          CUDA_ERROR_INVALID_VALUE);
    CHECK(a->call(op::graph_user_object, {g.outs.at(0), 7, 1, move, release}).result ==
          CUDA_ERROR_INVALID_VALUE);
    REQUIRE(a->call(op::user_object_refs, {7, 1, retain}).result == CUDA_SUCCESS);
    REQUIRE(a->call(op::graph_user_object, {g.outs.at(0), 7, 1, 0, retain}).result == CUDA_SUCCESS);
    // The application's last two references go: the graph still holds the object, yet no call may name it
    // (the driver's object could go with the graph meanwhile).
    REQUIRE(a->call(op::user_object_refs, {7, 2, release}).result == CUDA_SUCCESS);
    CHECK(a->call(op::user_object_refs, {7, 1, retain}).result == CUDA_ERROR_INVALID_VALUE);
    CHECK(a->call(op::graph_user_object, {g.outs.at(0), 7, 1, 0, release}).result ==
          CUDA_ERROR_INVALID_VALUE);
    // The graph goes: the destructor's id comes to A's host-function thread, once.
    REQUIRE(a->call(op::cuGraphDestroy, {g.outs.at(0)}).result == CUDA_SUCCESS);
    auto hf = a->call(op::host_func_next, {});
    REQUIRE(hf.result == CUDA_SUCCESS);
    REQUIRE(hf.outs.size() >= 1);
    CHECK(hf.outs[0] == 7);
    // The id is free again; B's session was not touched.
    CHECK(a->call(op::user_object_create, {7, 1}).result == CUDA_SUCCESS);
    CHECK(b->call(op::mem_get_info, {}).result == CUDA_SUCCESS);
}
