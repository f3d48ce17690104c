// Host kernels of tests/programs/two_devices.cu.
#include "host_threads.hpp"

namespace {
using vcuda::soft::launch;
using vcuda::soft::kernels::for_each_index_x;

void td_scale_add(const launch& l) {
    auto x = l.param<const float*>(0);
    auto y = l.param<float*>(1);
    auto a = l.param<float>(2);
    auto n = l.param<int>(3);
    for_each_index_x(l, [&](size_t i) {
        if (i < size_t(n < 0 ? 0 : n)) y[i] = a * x[i] + y[i];
    });
}

vcuda::soft::registrar r_td_scale_add("td_scale_add", {8, 8, 4, 4}, td_scale_add);
}  // namespace
