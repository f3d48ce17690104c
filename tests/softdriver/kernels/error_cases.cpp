// Host kernels of tests/programs/error_cases.cu.
#include "host_threads.hpp"

namespace {
using vcuda::soft::launch;
using vcuda::soft::kernels::for_each_index_x;

// ec_fill(int* p, int n, int v)
void ec_fill(const launch& l) {
    auto p = l.param<int*>(0);
    auto n = l.param<int>(1);
    auto v = l.param<int>(2);
    for_each_index_x(l, [&](size_t i) {
        if (i < size_t(n < 0 ? 0 : n)) p[i] = v;
    });
}

vcuda::soft::registrar r_ec_fill("ec_fill", {8, 4, 4}, ec_fill);
}  // namespace
