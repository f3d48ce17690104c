// Host kernels of tests/programs/host_functions.cu.
#include "host_threads.hpp"

namespace {
using vcuda::soft::launch;
using vcuda::soft::kernels::for_each_index_x;

// hf_fill(int* d, int n, int k): d[i] = i * 3 + k.
void hf_fill(const launch& l) {
    auto d = l.param<int*>(0);
    auto n = l.param<int>(1);
    auto k = l.param<int>(2);
    for_each_index_x(l, [&](size_t i) {
        if (i < size_t(n < 0 ? 0 : n)) d[i] = static_cast<int>(i) * 3 + k;
    });
}

vcuda::soft::registrar r_hf_fill("hf_fill", {8, 4, 4}, hf_fill);
}  // namespace
