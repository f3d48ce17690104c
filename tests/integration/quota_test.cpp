// Issue 17, point 7: quotas charge every allocating path, not only cuMemAlloc, VMM and cuMemAllocAsync.
// Against a vcuda-server on the software driver with a 64 MiB quota.
#include <catch2/catch.hpp>

#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>
#include <elf.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "raw_client.hpp"

using namespace vcuda;
using namespace vcuda::test;

namespace {

// A cubin as far as its section table goes: 256 bytes of code, a zero-filled global of `global` bytes
// (.nv.global holds no bytes in the file, as nvcc writes it) and 1 GiB of shared memory (per block, not the
// module's memory).
std::vector<std::byte> cubin(uint64_t global) {
    static constexpr char name_table[] = "\0.shstrtab\0.text.k\0.nv.global\0.nv.shared.k";
    const std::string names(name_table, sizeof name_table);  // the last name's NUL included
    const uint64_t text_size = 256, strings_at = sizeof(Elf64_Ehdr), text_at = 128,
                   sections_at = text_at + text_size;
    std::vector<std::byte> b(sections_at + 5 * sizeof(Elf64_Shdr));
    Elf64_Ehdr e{};
    std::memcpy(e.e_ident, ELFMAG, SELFMAG);
    e.e_ident[EI_CLASS] = ELFCLASS64;
    e.e_ident[EI_DATA] = ELFDATA2LSB;
    e.e_type = ET_EXEC;
    e.e_machine = 190;  // EM_CUDA
    e.e_shoff = sections_at;
    e.e_ehsize = sizeof e;
    e.e_shentsize = sizeof(Elf64_Shdr);
    e.e_shnum = 5;
    e.e_shstrndx = 1;
    std::memcpy(b.data(), &e, sizeof e);
    std::memcpy(b.data() + strings_at, names.data(), names.size());
    auto section = [&](int i, uint32_t name, uint32_t type, uint64_t flags, uint64_t at, uint64_t size) {
        Elf64_Shdr s{};
        s.sh_name = name;
        s.sh_type = type;
        s.sh_flags = flags;
        s.sh_offset = at;
        s.sh_size = size;
        std::memcpy(b.data() + sections_at + i * sizeof s, &s, sizeof s);
    };
    section(1, 1, SHT_STRTAB, 0, strings_at, names.size());
    section(2, 11, SHT_PROGBITS, SHF_ALLOC | SHF_EXECINSTR, text_at, text_size);
    section(3, 19, SHT_NOBITS, SHF_ALLOC | SHF_WRITE, sections_at, global);
    section(4, 30, SHT_NOBITS, SHF_ALLOC | SHF_WRITE, sections_at, uint64_t{1} << 30);
    return b;
}

std::vector<std::byte> bytes(const std::string& text) {
    return {reinterpret_cast<const std::byte*>(text.data()),
            reinterpret_cast<const std::byte*>(text.data()) + text.size()};
}

// A fatbin of one uncompressed ELF entry (sm_90).
std::vector<std::byte> fatbin(const std::vector<std::byte>& elf) {
    std::vector<std::byte> b(16 + 64 + elf.size());
    uint32_t magic = 0xBA55ED50;
    uint16_t version = 1, header = 16, kind = 2, entry_version = 0x101;
    uint64_t files = 64 + elf.size(), payload = elf.size();
    uint32_t entry_header = 64, sm = 90;
    std::memcpy(b.data(), &magic, 4);
    std::memcpy(b.data() + 4, &version, 2);
    std::memcpy(b.data() + 6, &header, 2);
    std::memcpy(b.data() + 8, &files, 8);
    std::memcpy(b.data() + 16, &kind, 2);
    std::memcpy(b.data() + 18, &entry_version, 2);
    std::memcpy(b.data() + 20, &entry_header, 4);
    std::memcpy(b.data() + 24, &payload, 8);
    std::memcpy(b.data() + 16 + 28, &sm, 4);
    std::memcpy(b.data() + 16 + 64, elf.data(), elf.size());
    return b;
}

raw_reply load(raw_client& c, uint64_t target, const std::vector<std::byte>& image, uint64_t hash) {
    return c.call(op::module_load, {target, 0, hash, 1, image.size()}, {}, image, target == 0 ? 0 : -1);
}

uint64_t free_memory(raw_client& c) {
    auto info = c.call(op::mem_get_info, {});
    REQUIRE(info.result == CUDA_SUCCESS);
    return info.outs.at(0);
}

}  // namespace

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
    // A pool the application made with a size limit: the driver's (the session serves only plain ones from
    // its own memory), which keeps what is freed up to its release threshold.
    CUmemPoolProps props{};
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.location = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
    props.maxSize = size_t{60} << 20;
    std::vector<std::byte> prop_bytes(sizeof props);
    std::memcpy(prop_bytes.data(), &props, sizeof props);
    auto made = a->call(op::pool_create, {}, {prop_bytes});
    REQUIRE(made.result == CUDA_SUCCESS);
    const uint64_t pool = made.outs.at(0);
    const uint64_t threshold = CU_MEMPOOL_ATTR_RELEASE_THRESHOLD;
    // Keep everything that is freed (a common setting: no trips back to the driver).
    REQUIRE(a->call(op::pool_set_attribute, {pool, threshold, ~uint64_t{0}}).result == CUDA_SUCCESS);
    auto p = a->call(op::pool_alloc, {48u << 20, 0, pool});
    REQUIRE(p.result == CUDA_SUCCESS);
    REQUIRE(a->call(op::pool_free, {p.outs.at(0), 0}).result == CUDA_SUCCESS);
    // The pool still holds the 48 MiB: only 16 MiB are left to other allocations (it used to be 64).
    auto over = a->call(op::mem_alloc, {32u << 20});
    CHECK(over.result == CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(over.detail.find("quota") != std::string::npos);
    // What the pool keeps is reused by its next allocation.
    auto again = a->call(op::pool_alloc, {48u << 20, 0, pool});
    REQUIRE(again.result == CUDA_SUCCESS);
    REQUIRE(a->call(op::pool_free, {again.outs.at(0), 0}).result == CUDA_SUCCESS);
    // A threshold of 0 lets it all go.
    REQUIRE(a->call(op::pool_set_attribute, {pool, threshold, 0}).result == CUDA_SUCCESS);
    CHECK(a->call(op::mem_alloc, {64u << 20}).result == CUDA_SUCCESS);
}

TEST_CASE(
    "the default pool's allocations are the session's memory: what it keeps is charged, and given up "
    "after a synchronize for an allocation that needs the room",
    "[integration]") {
    server_process server({"--memory-quota", "64MiB"});
    auto a = raw_client::open(server.address());
    REQUIRE(a);
    auto p = a->call(op::pool_alloc, {48u << 20, 0, 0});  // the current pool: the default one
    REQUIRE(p.result == CUDA_SUCCESS);
    CHECK(free_memory(*a) == (16u << 20));
    REQUIRE(a->call(op::pool_free, {p.outs.at(0), 0}).result == CUDA_SUCCESS);
    // Its mapping is kept for the next allocation of its size, charged meanwhile.
    CHECK(free_memory(*a) == (16u << 20));
    auto again = a->call(op::pool_alloc, {48u << 20, 0, 0});
    REQUIRE(again.result == CUDA_SUCCESS);
    CHECK(again.outs.at(0) == p.outs.at(0));
    REQUIRE(a->call(op::pool_free, {again.outs.at(0), 0}).result == CUDA_SUCCESS);
    // Until the application synchronizes, the pool keeps what was freed, as the driver's does: cuMemAlloc
    // cannot have it (CuPy's test_free_all_blocks_large_chunk checks this natively).
    CHECK(a->call(op::mem_alloc, {32u << 20}).result == CUDA_ERROR_OUT_OF_MEMORY);
    REQUIRE(a->call(op::ctx_synchronize, {}).result == CUDA_SUCCESS);
    // Then an allocation that needs the room gets it, and the quota still holds.
    auto plain = a->call(op::mem_alloc, {32u << 20});
    REQUIRE(plain.result == CUDA_SUCCESS);
    CHECK(free_memory(*a) == (32u << 20));
    auto over = a->call(op::pool_alloc, {48u << 20, 0, 0});
    CHECK(over.result == CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(over.detail.find("quota") != std::string::npos);
    CHECK(a->call(op::pool_alloc, {32u << 20, 0, 0}).result == CUDA_SUCCESS);
    CHECK(free_memory(*a) == 0);
}

TEST_CASE("a module's globals, constants and code are charged to the session's memory quota at load",
          "[integration]") {
    server_process server({"--memory-quota", "64MiB"});
    auto a = raw_client::open(server.address());
    REQUIRE(a);
    // A 256 MiB __device__ array under a 64 MiB quota: refused, as a module, a library and inside a fatbin
    // (all three used to load, the driver holding the 256 MiB outside the quota).
    for (uint64_t target : {0, 1}) {
        auto huge = load(*a, target, cubin(256u << 20), 1 + target);
        CHECK(huge.result == CUDA_ERROR_OUT_OF_MEMORY);
        CHECK(huge.detail.find("quota") != std::string::npos);
    }
    CHECK(load(*a, 0, fatbin(cubin(256u << 20)), 3).result == CUDA_ERROR_OUT_OF_MEMORY);
    // PTX: what it declares (.extern declarations hold nothing here).
    auto ptx = load(*a, 0,
                    bytes(".version 8.0\n.target sm_90\n.address_size 64\n"
                          ".extern .global .align 4 .b8 elsewhere[1073741824];\n"
                          "// .global .b8 commented[1073741824];\n"
                          ".visible .global .align 4 .v2 .u32 big[9000000];\n"
                          ".visible .entry k(.param .u64 p) { ld.global.u32 %r1, [big]; ret; }\n"),
                    4);
    CHECK(ptx.result == CUDA_ERROR_OUT_OF_MEMORY);  // 72,000,000 bytes
    CHECK(free_memory(*a) == (64u << 20));
    // 48 MiB of globals and 256 bytes of code load and leave the rest; shared memory is not the module's.
    auto m = load(*a, 0, cubin(48u << 20), 5);
    REQUIRE(m.result == CUDA_SUCCESS);
    CHECK(free_memory(*a) == (16u << 20) - 256);
    CHECK(a->call(op::mem_alloc, {32u << 20}).result == CUDA_ERROR_OUT_OF_MEMORY);
    // Unloading gives it back.
    REQUIRE(a->call(op::module_unload, {m.outs.at(0)}).result == CUDA_SUCCESS);
    CHECK(free_memory(*a) == (64u << 20));
    // A library is charged on its devices the same way, and a malformed image refused before the driver.
    auto lib = load(*a, 1, cubin(40u << 20), 6);
    REQUIRE(lib.result == CUDA_SUCCESS);
    CHECK(free_memory(*a) == (24u << 20) - 256);
    auto bad = cubin(0);
    bad[offsetof(Elf64_Ehdr, e_shoff)] = std::byte{0xff};
    CHECK(load(*a, 0, bad, 7).result == CUDA_ERROR_INVALID_IMAGE);
    REQUIRE(a->call(op::module_unload, {lib.outs.at(0)}).result == CUDA_SUCCESS);
    CHECK(a->call(op::mem_alloc, {64u << 20}).result == CUDA_SUCCESS);
}

TEST_CASE("graph allocations are charged while a graph holds their node; staging buffers of graph copies too",
          "[integration]") {
    server_process server({"--memory-quota", "64MiB", "--host-memory-quota", "8MiB"});
    auto a = raw_client::open(server.address());
    REQUIRE(a);
    auto alloc_node = [&](uint64_t graph, uint64_t size) {
        CUDA_MEM_ALLOC_NODE_PARAMS_v2 p{};
        p.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
        p.poolProps.location = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
        p.bytesize = size;
        std::vector<std::byte> blob(sizeof p);
        std::memcpy(blob.data(), &p, sizeof p);
        return a->call(op::graph_add_node, {graph, CU_GRAPH_NODE_TYPE_MEM_ALLOC}, {{}, {}, blob});
    };
    auto g = a->call(op::cuGraphCreate, {0});
    REQUIRE(g.result == CUDA_SUCCESS);
    // 128 MiB under a 64 MiB quota: refused; 48 MiB leaves 16.
    auto huge = alloc_node(g.outs.at(0), 128u << 20);
    CHECK(huge.result == CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(huge.detail.find("quota") != std::string::npos);
    auto node = alloc_node(g.outs.at(0), 48u << 20);
    REQUIRE(node.result == CUDA_SUCCESS);
    REQUIRE(node.outs.size() == 2);
    CHECK(node.outs[1] != 0);  // the allocation's address
    CHECK(a->call(op::mem_alloc, {32u << 20}).result == CUDA_ERROR_OUT_OF_MEMORY);
    // A free node names only the session's graph allocations.
    CHECK(
        a->call(op::graph_add_node, {g.outs[0], CU_GRAPH_NODE_TYPE_MEM_FREE, node.outs[1] + 64}, {{}, {}, {}})
            .result == CUDA_ERROR_INVALID_VALUE);
    CHECK(a->call(op::graph_add_node, {g.outs[0], CU_GRAPH_NODE_TYPE_MEM_FREE, node.outs[1]}, {{}, {}, {}})
              .result == CUDA_SUCCESS);
    // Once no graph holds the node, the charge goes (the driver's destructor runs on a thread of its own).
    REQUIRE(a->call(op::cuGraphDestroy, {g.outs[0]}).result == CUDA_SUCCESS);
    bool freed = false;
    for (int i = 0; i < 100 && !freed; ++i) {
        freed = a->call(op::mem_alloc, {32u << 20}).result == CUDA_SUCCESS;
        if (!freed) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    CHECK(freed);

    // The staging buffer of a copy with the client's memory counts against the host memory quota.
    auto g2 = a->call(op::cuGraphCreate, {0});
    auto dev = a->call(op::mem_alloc, {16u << 20});
    REQUIRE(dev.result == CUDA_SUCCESS);
    auto host_copy = [&](uint64_t id, uint64_t size) {
        CUDA_MEMCPY3D copy{};
        copy.srcMemoryType = CU_MEMORYTYPE_DEVICE;
        copy.srcDevice = dev.outs.at(0);
        copy.dstMemoryType = CU_MEMORYTYPE_HOST;
        copy.WidthInBytes = size;
        copy.Height = copy.Depth = 1;
        std::vector<std::byte> desc(sizeof copy);
        std::memcpy(desc.data(), &copy, sizeof copy);
        return a->call(op::graph_add_node, {g2.outs.at(0), CU_GRAPH_NODE_TYPE_MEMCPY, id}, {{}, {}, desc});
    };
    CHECK(host_copy(9, 4u << 20).result == CUDA_SUCCESS);
    auto staged = host_copy(10, 16u << 20);  // 4 + 16 MiB under 8
    CHECK(staged.result == CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(staged.detail.find("host memory quota") != std::string::npos);
}
