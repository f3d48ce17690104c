// Host kernels of tests/programs/graph_memory_nodes.cu.
#include <cstdint>

#include "host_threads.hpp"

namespace {
using vcuda::soft::launch;
using vcuda::soft::kernels::element_count;
using vcuda::soft::kernels::for_each_index_x;

// gmn_affine(const float* x, float* y, int n, float a, float b): y[i] = a * x[i] + b
void gmn_affine(const launch& l) {
    auto x = l.param<const float*>(0);
    auto y = l.param<float*>(1);
    auto n = l.param<int>(2);
    auto a = l.param<float>(3);
    auto b = l.param<float>(4);
    for_each_index_x(l, [&](size_t i) {
        if (i < element_count(n)) y[i] = a * x[i] + b;
    });
}

vcuda::soft::registrar r_gmn_affine("gmn_affine", {8, 8, 4, 4, 4}, gmn_affine);
}  // namespace
