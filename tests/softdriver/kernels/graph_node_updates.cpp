// Host kernels of tests/programs/graph_node_updates.cu.
#include <cstdint>

#include "host_threads.hpp"

namespace {
using vcuda::soft::launch;
using vcuda::soft::kernels::element_count;
using vcuda::soft::kernels::for_each_index_x;

// gu_fill(unsigned* x, int n, unsigned base): x[i] = base + i
void gu_fill(const launch& l) {
    auto x = l.param<uint32_t*>(0);
    auto n = l.param<int>(1);
    auto base = l.param<uint32_t>(2);
    for_each_index_x(l, [&](size_t i) {
        if (i < element_count(n)) x[i] = base + static_cast<uint32_t>(i);
    });
}

// gu_scale(unsigned* x, int n, unsigned k): x[i] *= k
void gu_scale(const launch& l) {
    auto x = l.param<uint32_t*>(0);
    auto n = l.param<int>(1);
    auto k = l.param<uint32_t>(2);
    for_each_index_x(l, [&](size_t i) {
        if (i < element_count(n)) x[i] *= k;
    });
}

vcuda::soft::registrar r_gu_fill("gu_fill", {8, 4, 4}, gu_fill);
vcuda::soft::registrar r_gu_scale("gu_scale", {8, 4, 4}, gu_scale);
}  // namespace
