// Host kernels of tests/programs/late_thread_runtime.cu.
#include "host_threads.hpp"

namespace {
using vcuda::soft::launch;
using vcuda::soft::kernels::for_each_index_x;

// lt_fill(float* out, float v, double w, int n)
void lt_fill(const launch& l) {
    auto out = l.param<float*>(0);
    auto v = l.param<float>(1);
    auto w = l.param<double>(2);
    auto n = l.param<int>(3);
    for_each_index_x(l, [&](size_t i) {
        if (i < size_t(n < 0 ? 0 : n)) out[i] = v + static_cast<float>(w) * static_cast<float>(i % 7);
    });
}

// lt_axpy(const float* x, float* y, float a, long long n, char tag)
void lt_axpy(const launch& l) {
    auto x = l.param<const float*>(0);
    auto y = l.param<float*>(1);
    auto a = l.param<float>(2);
    auto n = l.param<long long>(3);
    auto tag = l.param<char>(4);
    for_each_index_x(l, [&](size_t i) {
        if (static_cast<long long>(i) < n) y[i] = a * x[i] + y[i] + static_cast<float>(tag);
    });
}

vcuda::soft::registrar r_fill("lt_fill", {8, 4, 8, 4}, lt_fill);
vcuda::soft::registrar r_axpy("lt_axpy", {8, 8, 4, 8, 1}, lt_axpy);
}  // namespace
