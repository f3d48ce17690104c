// Host kernels and globals of tests/programs/reset_one_device.cu.
#include "host_threads.hpp"

namespace {
using vcuda::soft::launch;
using vcuda::soft::kernels::for_each_index_x;

// rd_double(const int* values, int* out)
void rd_double(const launch& l) {
    auto values = l.param<const int*>(0);
    auto out = l.param<int*>(1);
    for_each_index_x(l, [&](size_t i) {
        if (i < 64) out[i] = 2 * values[i];
    });
}

vcuda::soft::registrar r_double("rd_double", {8, 8}, rd_double);
vcuda::soft::registrar g_values("rd_values", size_t{256});  // __device__ int rd_values[64]
}  // namespace
