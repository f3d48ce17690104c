// Host kernels of tests/programs/suspend_resume.cu.
#include "host_threads.hpp"

namespace {
using vcuda::soft::launch;
using vcuda::soft::kernels::for_each_index_x;

void sr_fill(const launch& l) {
    auto x = l.param<float*>(0);
    auto n = l.param<size_t>(1);
    auto base = l.param<float>(2);
    for_each_index_x(l, [&](size_t i) {
        if (i < n) x[i] = base + static_cast<float>(i % 1000);
    });
}

void sr_axpy(const launch& l) {
    auto y = l.param<float*>(0);
    auto x = l.param<const float*>(1);
    auto n = l.param<size_t>(2);
    auto a = l.param<float>(3);
    for_each_index_x(l, [&](size_t i) {
        if (i < n) y[i] += a * x[i];
    });
}

vcuda::soft::registrar r_fill("sr_fill", {8, 8, 4}, sr_fill);
vcuda::soft::registrar r_axpy("sr_axpy", {8, 8, 8, 4}, sr_axpy);
}  // namespace
