// Host kernels of tests/programs/green_contexts.cu.
#include "host_threads.hpp"

namespace {
using vcuda::soft::launch;
using vcuda::soft::kernels::element_count;
using vcuda::soft::kernels::for_each_index_x;

// gc_fill(int* p, int n, int v): p[i] = v.
void gc_fill(const launch& l) {
    auto p = l.param<int*>(0);
    auto n = element_count(l.param<int>(1));
    auto v = l.param<int>(2);
    for_each_index_x(l, [&](size_t i) {
        if (i < n) p[i] = v;
    });
}

// gc_add(int* p, int n, int v): p[i] += v.
void gc_add(const launch& l) {
    auto p = l.param<int*>(0);
    auto n = element_count(l.param<int>(1));
    auto v = l.param<int>(2);
    for_each_index_x(l, [&](size_t i) {
        if (i < n) p[i] += v;
    });
}

// gc_sm(int* out): out[block] = the SM it ran on. Here every launch runs on the CPU: blocks are spread over
// the smallest partition's 8 "SMs".
void gc_sm(const launch& l) {
    auto out = l.param<int*>(0);
    for (unsigned b = 0; b < l.grid.x; ++b) out[b] = static_cast<int>(b % 8);
}

vcuda::soft::registrar r_sm("gc_sm", {8}, gc_sm);
vcuda::soft::registrar r_fill("gc_fill", {8, 4, 4}, gc_fill);
vcuda::soft::registrar r_add("gc_add", {8, 4, 4}, gc_add);
}  // namespace
