// Host kernels of tests/programs/graphs_explicit.cu.
#include <cstdint>

#include "host_threads.hpp"

namespace {
using vcuda::soft::launch;
using vcuda::soft::kernels::element_count;
using vcuda::soft::kernels::for_each_index_x;

// ge_set(unsigned* x, int n, unsigned base): x[i] = base + i
void ge_set(const launch& l) {
    auto x = l.param<uint32_t*>(0);
    auto n = l.param<int>(1);
    auto base = l.param<uint32_t>(2);
    for_each_index_x(l, [&](size_t i) {
        if (i < element_count(n)) x[i] = base + static_cast<uint32_t>(i);
    });
}

// ge_axpy(unsigned* y, const unsigned* x, int n, unsigned a): y[i] = y[i] * a + x[i]
void ge_axpy(const launch& l) {
    auto y = l.param<uint32_t*>(0);
    auto x = l.param<const uint32_t*>(1);
    auto n = l.param<int>(2);
    auto a = l.param<uint32_t>(3);
    for_each_index_x(l, [&](size_t i) {
        if (i < element_count(n)) y[i] = y[i] * a + x[i];
    });
}

// ge_add(unsigned* x, int n, unsigned v): x[i] += v
void ge_add(const launch& l) {
    auto x = l.param<uint32_t*>(0);
    auto n = l.param<int>(1);
    auto v = l.param<uint32_t>(2);
    for_each_index_x(l, [&](size_t i) {
        if (i < element_count(n)) x[i] += v;
    });
}

vcuda::soft::registrar r_ge_set("ge_set", {8, 4, 4}, ge_set);
vcuda::soft::registrar r_ge_axpy("ge_axpy", {8, 8, 4, 4}, ge_axpy);
vcuda::soft::registrar r_ge_add("ge_add", {8, 4, 4}, ge_add);
}  // namespace
