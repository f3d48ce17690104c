// What both sides of deferred copies (client/deferred_copies.hpp, server/deferred_copies.hpp) must agree on:
// the bounds, which the client keeps under so that the server never refuses a copy it made, and the record in
// which deferred_collect answers each finished copy (protocol/README.md).
#pragma once

#include <cstddef>
#include <cstdint>

namespace vcuda::deferred_copy {

inline constexpr size_t max_copy = size_t{8} << 20;  // bytes of one copy
inline constexpr size_t max_bytes = size_t{64}
                                    << 20;  // under way in one session, each copy counted by charge()

// What a copy counts against max_bytes: at least 4 KiB, so that a flood of tiny (or refused) copies is
// bounded.
constexpr size_t charge(size_t n) { return n < 4096 ? size_t{4096} : n; }

// One finished copy in deferred_collect's payload, followed by `size` bytes when `status` is 0.
struct record_head {
    uint64_t ticket = 0;
    uint64_t size = 0;
    uint64_t status = 0;
};
static_assert(sizeof(record_head) == 24);

}  // namespace vcuda::deferred_copy
