// Host kernels of tests/programs/callback_workers.cu.
#include "host_threads.hpp"

namespace {
using vcuda::soft::launch;
using vcuda::soft::kernels::element_count;
using vcuda::soft::kernels::for_each_index_x;

// cw_increment(int* data, int n): data[i] += 1
void cw_increment(const launch& l) {
    auto data = l.param<int*>(0);
    auto n = l.param<int>(1);
    for_each_index_x(l, [&](size_t i) {
        if (i < element_count(n)) data[i] += 1;
    });
}

vcuda::soft::registrar r_cw_increment("cw_increment", {8, 4}, cw_increment);
}  // namespace
