// Host kernels of tests/programs/mem_pools.cu.
#include "host_threads.hpp"

namespace {
using vcuda::soft::launch;
using vcuda::soft::kernels::for_each_index_x;

// mp_fill(int* p, int n, int v): p[i] = v + i.
void mp_fill(const launch& l) {
    auto p = l.param<int*>(0);
    auto n = l.param<int>(1);
    auto v = l.param<int>(2);
    for_each_index_x(l, [&](size_t i) {
        if (i < size_t(n < 0 ? 0 : n)) p[i] = v + static_cast<int>(i);
    });
}

vcuda::soft::registrar r_fill("mp_fill", {8, 4, 4}, mp_fill);
}  // namespace
