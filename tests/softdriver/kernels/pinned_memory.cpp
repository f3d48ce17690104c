// Host kernels of tests/programs/pinned_memory.cu.
#include "host_threads.hpp"

namespace {
using vcuda::soft::launch;
using vcuda::soft::kernels::for_each_index_x;

// pm_negate(int* d, int n): d[i] = -d[i] + i.
void pm_negate(const launch& l) {
    auto d = l.param<int*>(0);
    auto n = l.param<int>(1);
    for_each_index_x(l, [&](size_t i) {
        if (i < size_t(n < 0 ? 0 : n)) d[i] = -d[i] + static_cast<int>(i);
    });
}

vcuda::soft::registrar r_pm_negate("pm_negate", {8, 4}, pm_negate);
}  // namespace
