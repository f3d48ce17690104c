// Host kernels of tests/programs/cooperative_launch.cu. The grid barrier splits the kernel into two phases;
// here the first runs for every block before the second starts, which is what grid.sync() guarantees on a
// GPU.
#include "host_threads.hpp"

namespace {
using vcuda::soft::launch;
using vcuda::soft::kernels::element_count;
using vcuda::soft::kernels::grid_stride_x;

// coop_add_total(const int* in, int* partial, int* out, int n): partial[b] = block b's grid-stride share of
// in; grid.sync(); out[i] = in[i] + the sum of all partials.
void coop_add_total(const launch& l) {
    auto in = l.param<const int*>(0);
    auto partial = l.param<int*>(1);
    auto out = l.param<int*>(2);
    const size_t n = element_count(l.param<int>(3));
    const size_t stride = grid_stride_x(l);
    for (unsigned b = 0; b < l.grid.x; ++b) {  // phase 1
        int s = 0;
        for (unsigned t = 0; t < l.block.x; ++t)
            for (size_t i = size_t{b} * l.block.x + t; i < n; i += stride) s += in[i];
        partial[b] = s;
    }
    int total = 0;  // phase 2, after the grid barrier
    for (unsigned b = 0; b < l.grid.x; ++b) total += partial[b];
    for (size_t i = 0; i < n; ++i) out[i] = in[i] + total;
}

vcuda::soft::registrar r_coop_add_total("coop_add_total", {8, 8, 8, 4}, coop_add_total);
}  // namespace
