// Host kernels of tests/programs/async_copies.cu.
#include <cstdint>

#include "host_threads.hpp"

namespace {
using vcuda::soft::launch;
using vcuda::soft::kernels::for_each_index_x;

// ac_transform(int* d, int n, int salt): d[i] = d[i] * 3 + salt, in 32-bit wrapping arithmetic.
void ac_transform(const launch& l) {
    auto d = l.param<int32_t*>(0);
    auto n = l.param<int>(1);
    auto salt = l.param<int>(2);
    for_each_index_x(l, [&](size_t i) {
        if (i < size_t(n < 0 ? 0 : n))
            d[i] = static_cast<int32_t>(static_cast<uint32_t>(d[i]) * 3u + static_cast<uint32_t>(salt));
    });
}

vcuda::soft::registrar r_ac_transform("ac_transform", {8, 4, 4}, ac_transform);
}  // namespace
