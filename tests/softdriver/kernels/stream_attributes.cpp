// Host kernels of tests/programs/stream_attributes.cu.
#include "host_threads.hpp"

namespace {
using vcuda::soft::launch;
using vcuda::soft::kernels::for_each_index_x;

// sa_scale(int* p, int n, int k): p[i] = p[i] * k + 1.
void sa_scale(const launch& l) {
    auto p = l.param<int*>(0);
    auto n = l.param<int>(1);
    auto k = l.param<int>(2);
    for_each_index_x(l, [&](size_t i) {
        if (i < size_t(n < 0 ? 0 : n)) p[i] = p[i] * k + 1;
    });
}

vcuda::soft::registrar r_scale("sa_scale", {8, 4, 4}, sa_scale);
}  // namespace
