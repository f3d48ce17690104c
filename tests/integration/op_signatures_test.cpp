// Every described op (protocol/OPS.md) against what its signature forbids, from the generated table: a call
// with one argument or one blob too many, a payload it does not take, a 32-bit or boolean argument out of
// range, handles of the right kind that the session was never given. Each must be refused with the error the
// generated decoding promises, and the session (and another beside it) must go on working.
#include <catch2/catch.hpp>

#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>

#include <string>
#include <vector>

#include "common/handle_kind.hpp"
#include "op_signatures.hpp"
#include "raw_client.hpp"

using namespace vcuda;
using namespace vcuda::test;

namespace {

using blobs = std::vector<std::vector<std::byte>>;

// A handle of kind `k` with an index no session reaches, for argument `i`.
uint64_t never_given(handle_kind k, size_t i) {
    return make_handle(k, 0x5a5, 0x7fff0000u + static_cast<uint32_t>(i));
}

bool still_works(raw_client& c) {
    auto r = c.call(op::mem_get_info, {});
    return r.connection_ok && r.result == CUDA_SUCCESS && r.outs.size() == 2;
}

}  // namespace

TEST_CASE("described ops refuse what their signature forbids, and the session goes on", "[integration]") {
    server_process server;
    auto c = raw_client::open(server.address());
    auto other = raw_client::open(server.address());
    REQUIRE(c);
    REQUIRE(other);
    REQUIRE(std::size(op_signatures) > 0);
    for (const op_signature& s : op_signatures) {
        const std::string name(op_name(s.id));
        INFO("op " << name);
        const size_t n = s.args.size();
        const blobs empty(s.blobs);

        // One argument too many (for an op whose last argument is a run, one too few), one blob too many.
        auto r = c->call(s.id, std::vector<uint64_t>(s.more_args ? n - 2 : n + 1), empty);
        CHECK(r.result == CUDA_ERROR_INVALID_VALUE);
        CHECK(r.detail.find("malformed") != std::string::npos);
        r = c->call(s.id, std::vector<uint64_t>(n), blobs(s.blobs + 1));
        CHECK(r.result == CUDA_ERROR_INVALID_VALUE);
        // Bulk bytes to an op that takes none.
        if (!s.payload) {
            r = c->call(s.id, std::vector<uint64_t>(n), empty, std::vector<std::byte>(64));
            CHECK(r.result == CUDA_ERROR_INVALID_VALUE);
            CHECK(r.detail.find("malformed") != std::string::npos);
        }

        // A value out of its kind's range: refused, naming the argument, whatever the handles are.
        for (size_t j = 0; j < n; ++j) {
            const std::string_view kind = s.args[j].kind;
            if (kind != "u32" && kind != "i32" && kind != "bool") continue;
            std::vector<uint64_t> args(n);
            args[j] = kind == "bool" ? 2 : uint64_t{1} << 32;
            r = c->call(s.id, args, empty);
            INFO("argument " << s.args[j].name);
            CHECK(r.result == CUDA_ERROR_INVALID_VALUE);
            CHECK(r.detail.find(name + ": " + std::string(s.args[j].name)) != std::string::npos);
        }

        // Handles of the right kind that this session was never given.
        std::vector<uint64_t> args(n);
        bool any_handle = false;
        for (size_t j = 0; j < n; ++j)
            if (s.args[j].handle != handle_kind::none) {
                args[j] = never_given(s.args[j].handle, j);
                any_handle = true;
            }
        if (any_handle) {
            r = c->call(s.id, args, empty);
            CHECK(r.result == CUDA_ERROR_INVALID_HANDLE);
        }
        REQUIRE(still_works(*c));
    }
    CHECK(still_works(*other));
}
