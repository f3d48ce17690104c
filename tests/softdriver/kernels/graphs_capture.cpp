// Host kernels of tests/programs/graphs_capture.cu.
#include <cstdint>

#include "host_threads.hpp"

namespace {
using vcuda::soft::launch;
using vcuda::soft::kernels::element_count;
using vcuda::soft::kernels::for_each_index_x;

// gc_step(unsigned* x, int n, unsigned mul, unsigned add): x[i] = x[i] * mul + add
void gc_step(const launch& l) {
    auto x = l.param<uint32_t*>(0);
    auto n = l.param<int>(1);
    auto mul = l.param<uint32_t>(2);
    auto add = l.param<uint32_t>(3);
    for_each_index_x(l, [&](size_t i) {
        if (i < element_count(n)) x[i] = x[i] * mul + add;
    });
}

// gc_accumulate(unsigned* acc, const unsigned* x, int n): acc[i] += x[i]
void gc_accumulate(const launch& l) {
    auto acc = l.param<uint32_t*>(0);
    auto x = l.param<const uint32_t*>(1);
    auto n = l.param<int>(2);
    for_each_index_x(l, [&](size_t i) {
        if (i < element_count(n)) acc[i] += x[i];
    });
}

vcuda::soft::registrar r_gc_step("gc_step", {8, 4, 4, 4}, gc_step);
vcuda::soft::registrar r_gc_accumulate("gc_accumulate", {8, 8, 4}, gc_accumulate);
}  // namespace
