// Issue 17, point 7: quotas charge every allocating path, not only cuMemAlloc, VMM and cuMemAllocAsync.
// Against a vcuda-server on the software driver with a 64 MiB quota.
#include <catch2/catch.hpp>

#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>

#include "raw_client.hpp"

using namespace vcuda;
using namespace vcuda::test;

TEST_CASE("the malloc heap a context's limit reserves is charged to the session's memory quota",
          "[integration]") {
    server_process server({"--memory-quota", "64MiB"});
    auto a = raw_client::open(server.address());
    REQUIRE(a);
    const uint64_t heap = CU_LIMIT_MALLOC_HEAP_SIZE;
    // 16 GiB of heap under a 64 MiB quota: refused (it used to be accepted).
    auto huge = a->call(op::cuCtxSetLimit, {heap, uint64_t{16} << 30});
    CHECK(huge.result == CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(huge.detail.find("quota") != std::string::npos);
    // 32 MiB of heap leaves 32 MiB for allocations.
    REQUIRE(a->call(op::cuCtxSetLimit, {heap, uint64_t{32} << 20}).result == CUDA_SUCCESS);
    auto info = a->call(op::mem_get_info, {});
    REQUIRE(info.result == CUDA_SUCCESS);
    CHECK(info.outs.at(0) == (32u << 20));  // free
    CHECK(a->call(op::mem_alloc, {48u << 20}).result == CUDA_ERROR_OUT_OF_MEMORY);
    REQUIRE(a->call(op::mem_alloc, {16u << 20}).result == CUDA_SUCCESS);
    // A smaller heap gives the difference back; other limits are not memory of the quota's.
    REQUIRE(a->call(op::cuCtxSetLimit, {heap, uint64_t{8} << 20}).result == CUDA_SUCCESS);
    REQUIRE(a->call(op::mem_alloc, {32u << 20}).result == CUDA_SUCCESS);
    CHECK(a->call(op::cuCtxSetLimit, {uint64_t{CU_LIMIT_STACK_SIZE}, 4096}).result == CUDA_SUCCESS);
    // Raising the heap past what is left is refused and changes nothing.
    CHECK(a->call(op::cuCtxSetLimit, {heap, uint64_t{32} << 20}).result == CUDA_ERROR_OUT_OF_MEMORY);
    REQUIRE(a->call(op::mem_alloc, {8u << 20}).result == CUDA_SUCCESS);
}

TEST_CASE("memory a pool keeps reserved after frees stays charged until its release threshold lets it go",
          "[integration]") {
    server_process server({"--memory-quota", "64MiB"});
    auto a = raw_client::open(server.address());
    REQUIRE(a);
    auto pool = a->call(op::device_pool, {0, 1});  // the device's current pool, as cudaMallocAsync uses
    REQUIRE(pool.result == CUDA_SUCCESS);
    const uint64_t threshold = CU_MEMPOOL_ATTR_RELEASE_THRESHOLD;
    // Keep everything that is freed (a common setting: no trips back to the driver).
    REQUIRE(a->call(op::pool_set_attribute, {pool.outs.at(0), threshold, ~uint64_t{0}}).result ==
            CUDA_SUCCESS);
    auto p = a->call(op::pool_alloc, {48u << 20, 0, 0});
    REQUIRE(p.result == CUDA_SUCCESS);
    REQUIRE(a->call(op::pool_free, {p.outs.at(0), 0}).result == CUDA_SUCCESS);
    // The pool still holds the 48 MiB: only 16 MiB are left to other allocations (it used to be 64).
    auto over = a->call(op::mem_alloc, {32u << 20});
    CHECK(over.result == CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(over.detail.find("quota") != std::string::npos);
    // What the pool keeps is reused by its next allocation.
    auto again = a->call(op::pool_alloc, {48u << 20, 0, 0});
    REQUIRE(again.result == CUDA_SUCCESS);
    REQUIRE(a->call(op::pool_free, {again.outs.at(0), 0}).result == CUDA_SUCCESS);
    // A threshold of 0 lets it all go.
    REQUIRE(a->call(op::pool_set_attribute, {pool.outs.at(0), threshold, 0}).result == CUDA_SUCCESS);
    CHECK(a->call(op::mem_alloc, {64u << 20}).result == CUDA_SUCCESS);
}
