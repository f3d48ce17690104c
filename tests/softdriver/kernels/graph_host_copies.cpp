// Host kernels of tests/programs/graph_host_copies.cu.
#include <cstdint>

#include "host_threads.hpp"

namespace {
using vcuda::soft::launch;
using vcuda::soft::kernels::element_count;
using vcuda::soft::kernels::for_each_index_x;

// ghc_affine(const float* x, float* y, int n, float a, float b): y[i] = a * x[i] + b
void ghc_affine(const launch& l) {
    auto x = l.param<const float*>(0);
    auto y = l.param<float*>(1);
    auto n = l.param<int>(2);
    auto a = l.param<float>(3);
    auto b = l.param<float>(4);
    for_each_index_x(l, [&](size_t i) {
        if (i < element_count(n)) y[i] = a * x[i] + b;
    });
}

// ghc_sum(const float* y, double* out, int n): *out = y[0] + ... + y[n-1], in order
void ghc_sum(const launch& l) {
    auto y = l.param<const float*>(0);
    auto out = l.param<double*>(1);
    auto n = l.param<int>(2);
    double s = 0;
    for (size_t i = 0; i < element_count(n); ++i) s += y[i];
    *out = s;
}

vcuda::soft::registrar r_ghc_affine("ghc_affine", {8, 8, 4, 4, 4}, ghc_affine);
vcuda::soft::registrar r_ghc_sum("ghc_sum", {8, 8, 4}, ghc_sum);
}  // namespace
