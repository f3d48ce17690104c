// IPC between sessions (server/handlers_ipc.cpp, server/ipc.hpp): a handle opens in another session of the
// same tenant on the same server, in thread and in process isolation, and nowhere else — not in another
// tenant's session (a session opened with another token), not in the exporting session, not on another
// server, not once its allocation was freed, and a forged token opens nothing. What was opened stays readable
// after the exporter freed it, and is the opener's no more once closed.
#include <sys/stat.h>
#include <catch2/catch.hpp>

#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <string>

#include "mgmt/token.hpp"
#include "raw_client.hpp"

using namespace vcuda;
using namespace vcuda::test;
using namespace std::chrono_literals;

namespace {

constexpr uint64_t what_memory = 0, what_event = 1;

std::vector<std::byte> pattern(size_t n, uint8_t seed) {
    std::vector<std::byte> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((i * 13 + seed) & 0xff);
    return v;
}

// A secret file for the server, and tokens signed with it (each a tenant of its own).
struct secret_file {
    std::string path, secret = "ipc-test-secret-0123456789abcdef";
    explicit secret_file(const std::string& dir) : path(dir + "/secret") {
        std::ofstream(path) << secret;
        ::chmod(path.c_str(), 0600);  // the server refuses a secret others can read
    }
    std::string token(int n) const {
        return mgmt::sign_token(
            secret, {"", "*", 0, std::chrono::system_clock::now() + 1h + std::chrono::seconds(n)});
    }
};

std::string temp_dir() {
    char t[] = "/tmp/vcuda-ipc-XXXXXX";
    REQUIRE(mkdtemp(t) != nullptr);
    return t;
}

std::unique_ptr<raw_client> open_session(const server_process& s, const std::string& token) {
    std::string why;
    auto c = raw_client::open(s.address(), 0, {}, &why, 0, token);
    INFO(why);
    REQUIRE(c);
    return c;
}

std::vector<std::byte> exported(raw_client& c, uint64_t what, uint64_t object) {
    auto r = c.call(op::ipc_export, {what, object});
    REQUIRE(r.result == CUDA_SUCCESS);
    REQUIRE(r.blobs.size() == 1);
    REQUIRE(r.blobs[0].size() == 64);
    return r.blobs[0];
}

void isolation_case(const std::vector<std::string>& extra) {
    auto dir = temp_dir();
    secret_file secret(dir);
    std::vector<std::string> args = {"--secret-file", secret.path};
    args.insert(args.end(), extra.begin(), extra.end());
    server_process server(args);
    const std::string alice = secret.token(1), bob = secret.token(2);
    auto a = open_session(server, alice);
    auto b = open_session(server, alice);
    auto c = open_session(server, bob);

    const size_t n = 3 << 20;
    auto m = a->call(op::mem_alloc, {n});
    REQUIRE(m.result == CUDA_SUCCESS);
    uint64_t p = m.outs.at(0);
    auto data = pattern(n, 3);
    REQUIRE(a->call(op::copy_htod, {p, 0}, {}, data).result == CUDA_SUCCESS);
    auto handle = exported(*a, what_memory, p);
    CHECK(exported(*a, what_memory, p) == handle);  // asked again: the same handle

    // The same tenant opens it, at an address of its own, and reads A's bytes.
    auto opened = b->call(op::ipc_open, {what_memory, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS}, {handle});
    REQUIRE(opened.result == CUDA_SUCCESS);
    uint64_t q = opened.outs.at(0);
    CHECK(opened.outs.at(1) == n);
    auto seen = b->call(op::copy_dtoh, {q, n, 0});
    REQUIRE(seen.result == CUDA_SUCCESS);
    CHECK(seen.payload == data);
    auto again = b->call(op::ipc_open, {what_memory, 0}, {handle});
    REQUIRE(again.result == CUDA_SUCCESS);
    CHECK(again.outs.at(0) == q);

    // Another tenant, the exporter itself, a forged token, a handle of another server: refused.
    auto refused = c->call(op::ipc_open, {what_memory, 0}, {handle});
    CHECK(refused.result == CUDA_ERROR_INVALID_VALUE);
    CHECK(server.wait_for_log("of another tenant made: refused"));
    CHECK(c->call(op::copy_dtoh, {q, 16, 0}).result == CUDA_ERROR_INVALID_VALUE);
    CHECK(a->call(op::ipc_open, {what_memory, 0}, {handle}).result == CUDA_ERROR_INVALID_CONTEXT);
    auto forged = handle;
    forged[20] ^= std::byte{1};
    CHECK(b->call(op::ipc_open, {what_memory, 0}, {forged}).result == CUDA_ERROR_INVALID_VALUE);
    auto elsewhere = handle;
    elsewhere[8] ^= std::byte{1};
    auto other = b->call(op::ipc_open, {what_memory, 0}, {elsewhere});
    CHECK(other.result == CUDA_ERROR_NOT_SUPPORTED);
    CHECK(other.detail.find("another vcuda-server") != std::string::npos);
    CHECK(b->call(op::ipc_open, {what_event, 0}, {handle}).result ==
          CUDA_ERROR_INVALID_VALUE);  // another kind

    // Freed by A: its handle opens no more, what B opened stays readable until B closes it.
    REQUIRE(a->call(op::mem_free, {p}).result == CUDA_SUCCESS);
    auto d = open_session(server, alice);
    CHECK(d->call(op::ipc_open, {what_memory, 0}, {handle}).result == CUDA_ERROR_INVALID_VALUE);
    seen = b->call(op::copy_dtoh, {q, n, 0});
    REQUIRE(seen.result == CUDA_SUCCESS);
    CHECK(seen.payload == data);
    CHECK(b->call(op::ipc_close, {q}).result == CUDA_SUCCESS);
    CHECK(b->call(op::copy_dtoh, {q, 16, 0}).result == CUDA_SUCCESS);  // opened twice: once more to close
    CHECK(b->call(op::ipc_close, {q}).result == CUDA_SUCCESS);
    CHECK(b->call(op::copy_dtoh, {q, 16, 0}).result == CUDA_ERROR_INVALID_VALUE);
    CHECK(b->call(op::ipc_close, {q}).result == CUDA_ERROR_INVALID_VALUE);

    // Events: only one made for IPC has a handle; the same tenant opens it, another does not.
    auto plain = a->call(op::cuEventCreate, {0});
    REQUIRE(plain.result == CUDA_SUCCESS);
    CHECK(a->call(op::ipc_export, {what_event, plain.outs.at(0)}).result != CUDA_SUCCESS);
    auto ev = a->call(op::cuEventCreate, {CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS});
    REQUIRE(ev.result == CUDA_SUCCESS);
    if (extra.empty()) {  // sessions as threads: refused with the reason (server/handlers_ipc.cpp)
        auto r = a->call(op::ipc_export, {what_event, ev.outs.at(0)});
        CHECK(r.result == CUDA_ERROR_NOT_SUPPORTED);
        CHECK(r.detail.find("--isolation process") != std::string::npos);
        return;
    }
    auto eh = exported(*a, what_event, ev.outs.at(0));
    auto be = b->call(op::ipc_open, {what_event, 0}, {eh});
    REQUIRE(be.result == CUDA_SUCCESS);
    CHECK(b->call(op::cuEventRecord, {be.outs.at(0), 0}).result == CUDA_SUCCESS);
    CHECK(a->call(op::cuEventSynchronize, {ev.outs.at(0)}).result == CUDA_SUCCESS);
    CHECK(a->call(op::cuEventQuery, {ev.outs.at(0)}).result == CUDA_SUCCESS);
    CHECK(c->call(op::ipc_open, {what_event, 0}, {eh}).result == CUDA_ERROR_INVALID_VALUE);
    CHECK(b->call(op::cuEventDestroy_v2, {be.outs.at(0)}).result == CUDA_SUCCESS);
    CHECK(a->call(op::cuEventDestroy_v2, {ev.outs.at(0)}).result == CUDA_SUCCESS);
    CHECK(d->call(op::ipc_open, {what_event, 0}, {eh}).result == CUDA_ERROR_INVALID_VALUE);  // withdrawn
}

}  // namespace

TEST_CASE("IPC handles open only in sessions of the same tenant and server (thread isolation)",
          "[integration]") {
    isolation_case({});
}

TEST_CASE("IPC handles open only in sessions of the same tenant and server (process isolation)",
          "[integration]") {
    isolation_case({"--isolation", "process"});
}

TEST_CASE("an IPC handle of another server is refused with the reason", "[integration]") {
    server_process one, two;
    auto a = raw_client::open(one.address());
    auto b = raw_client::open(two.address());
    REQUIRE(a);
    REQUIRE(b);
    auto m = a->call(op::mem_alloc, {1 << 20});
    REQUIRE(m.result == CUDA_SUCCESS);
    auto handle = exported(*a, what_memory, m.outs.at(0));
    auto r = b->call(op::ipc_open, {what_memory, 0}, {handle});
    CHECK(r.result == CUDA_ERROR_NOT_SUPPORTED);
    CHECK(r.detail.find("another vcuda-server") != std::string::npos);
}

// Memory pools (cuMemPoolExportToShareableHandle, cuMemPoolExportPointer): the pool's handle and each
// allocation's export data open only in sessions of the same tenant; the export data the application holds is
// a handle the server made (forged bytes never reach the driver's import), withdrawn when the allocation is
// freed; what a session imported reads the exporter's bytes, and its free ends only its import.
TEST_CASE(
    "pool IPC: pools and their allocations open only for the same tenant, forged export data is refused",
    "[integration]") {
    constexpr uint64_t what_pool = 3;
    auto dir = temp_dir();
    secret_file secret(dir);
    server_process server({"--secret-file", secret.path});
    const std::string alice = secret.token(1), bob = secret.token(2);
    auto a = open_session(server, alice);
    auto b = open_session(server, alice);
    auto c = open_session(server, bob);

    CUmemPoolProps props{};
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.handleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    props.location = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
    std::vector<std::byte> prop_bytes(sizeof props);
    std::memcpy(prop_bytes.data(), &props, sizeof props);
    auto pool = a->call(op::pool_create, {}, {prop_bytes});
    REQUIRE(pool.result == CUDA_SUCCESS);
    const size_t n = 1 << 20;
    auto m = a->call(op::pool_alloc, {n, 0, pool.outs.at(0)});
    REQUIRE(m.result == CUDA_SUCCESS);
    const uint64_t p = m.outs.at(0);
    auto data = pattern(n, 7);
    REQUIRE(a->call(op::copy_htod, {p, 0}, {}, data).result == CUDA_SUCCESS);

    auto pool_handle = exported(*a, what_pool, pool.outs.at(0));
    auto pointer = a->call(op::pool_export_pointer, {p});
    REQUIRE(pointer.result == CUDA_SUCCESS);
    REQUIRE(pointer.blobs.size() == 1);
    const auto pointer_handle = pointer.blobs[0];
    CHECK(a->call(op::pool_export_pointer, {p}).blobs.at(0) == pointer_handle);  // asked again: the same

    // The same tenant imports the pool, then the allocation, and reads A's bytes.
    auto bpool = b->call(op::ipc_open, {what_pool, 0}, {pool_handle});
    REQUIRE(bpool.result == CUDA_SUCCESS);
    auto imported = b->call(op::pool_import_pointer, {bpool.outs.at(0)}, {pointer_handle});
    REQUIRE(imported.result == CUDA_SUCCESS);
    const uint64_t q = imported.outs.at(0);
    CHECK(imported.outs.at(1) >= n);
    auto seen = b->call(op::copy_dtoh, {q, n, 0});
    REQUIRE(seen.result == CUDA_SUCCESS);
    CHECK(seen.payload == data);

    // Another tenant, forged export data, the pool's handle as an allocation's: refused.
    CHECK(c->call(op::ipc_open, {what_pool, 0}, {pool_handle}).result == CUDA_ERROR_INVALID_VALUE);
    auto forged = pointer_handle;
    forged[20] ^= std::byte{1};
    CHECK(b->call(op::pool_import_pointer, {bpool.outs.at(0)}, {forged}).result == CUDA_ERROR_INVALID_VALUE);
    std::vector<std::byte> garbage(64, std::byte{0x5a});
    CHECK(b->call(op::pool_import_pointer, {bpool.outs.at(0)}, {garbage}).result == CUDA_ERROR_INVALID_VALUE);
    CHECK(b->call(op::pool_import_pointer, {bpool.outs.at(0)}, {pool_handle}).result ==
          CUDA_ERROR_INVALID_VALUE);
    CHECK(a->call(op::pool_export_pointer, {p + 64}).result ==
          CUDA_ERROR_INVALID_VALUE);  // not an allocation

    // B's free ends its import; A's memory stays. A's free withdraws the export data.
    REQUIRE(b->call(op::pool_free, {q, 0}).result == CUDA_SUCCESS);
    seen = a->call(op::copy_dtoh, {p, n, 0});
    REQUIRE(seen.result == CUDA_SUCCESS);
    CHECK(seen.payload == data);
    REQUIRE(a->call(op::pool_free, {p, 0}).result == CUDA_SUCCESS);
    CHECK(b->call(op::pool_import_pointer, {bpool.outs.at(0)}, {pointer_handle}).result ==
          CUDA_ERROR_INVALID_VALUE);
}

// The server makes the application's physical allocations exportable, so that a move to a server on the same
// GPU hands them over; the application itself may export only what it asked to be exportable.
TEST_CASE("a physical allocation made without a shareable handle type is not exported for the application",
          "[integration]") {
    constexpr uint64_t what_allocation = 2;
    auto dir = temp_dir();
    secret_file secret(dir);
    server_process server({"--secret-file", secret.path});
    auto a = open_session(server, secret.token(1));
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
    auto create = [&](CUmemAllocationHandleType types) {
        prop.requestedHandleTypes = types;
        std::vector<std::byte> blob(sizeof prop);
        std::memcpy(blob.data(), &prop, sizeof prop);
        auto made = a->call(op::vmm_create, {2u << 20, 0}, {blob});
        REQUIRE(made.result == CUDA_SUCCESS);
        return made.outs.at(0);
    };
    auto plain = a->call(op::ipc_export, {what_allocation, create(CU_MEM_HANDLE_TYPE_NONE)});
    CHECK(plain.result == CUDA_ERROR_INVALID_VALUE);
    CHECK(plain.detail.find("not made with a POSIX file descriptor handle type") != std::string::npos);
    CHECK(
        a->call(op::ipc_export, {what_allocation, create(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)}).result ==
        CUDA_SUCCESS);
}

// cuMemFreeAsync of cuMemAlloc memory (cuSPARSE frees so) withdraws its IPC handle at the free, as cuMemFree
// does: the memory goes back later, once the stream gets there, and may then be another allocation's.
TEST_CASE("an IPC handle of memory freed in stream order opens no more", "[integration]") {
    auto dir = temp_dir();
    secret_file secret(dir);
    server_process server({"--secret-file", secret.path});
    const std::string alice = secret.token(1);
    auto a = open_session(server, alice);
    auto m = a->call(op::mem_alloc, {1u << 20});
    REQUIRE(m.result == CUDA_SUCCESS);
    auto handle = exported(*a, what_memory, m.outs.at(0));
    REQUIRE(a->call(op::pool_free, {m.outs.at(0), 0}).result == CUDA_SUCCESS);
    auto b = open_session(server, alice);
    CHECK(b->call(op::ipc_open, {what_memory, 0}, {handle}).result == CUDA_ERROR_INVALID_VALUE);
    // The same for an allocation of the default pool, which is the session's device memory too.
    auto pooled = a->call(op::pool_alloc, {1u << 20, 0, 0});
    REQUIRE(pooled.result == CUDA_SUCCESS);
    auto pooled_handle = exported(*a, what_memory, pooled.outs.at(0));
    REQUIRE(a->call(op::pool_free, {pooled.outs.at(0), 0}).result == CUDA_SUCCESS);
    CHECK(b->call(op::ipc_open, {what_memory, 0}, {pooled_handle}).result == CUDA_ERROR_INVALID_VALUE);
}
