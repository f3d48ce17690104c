// Host kernels of tests/programs/host_register.cu.
#include "host_threads.hpp"

namespace {
using vcuda::soft::launch;
using vcuda::soft::kernels::element_count;
using vcuda::soft::kernels::for_each_index_x;

// hr_times3_plus(const unsigned* in, unsigned* out, int n, unsigned k): out[i] = in[i] * 3 + k.
void hr_times3_plus(const launch& l) {
    auto in = l.param<const unsigned*>(0);
    auto out = l.param<unsigned*>(1);
    const size_t n = element_count(l.param<int>(2));
    auto k = l.param<unsigned>(3);
    for_each_index_x(l, [&](size_t i) {
        if (i < n) out[i] = in[i] * 3u + k;
    });
}

vcuda::soft::registrar r_hr_times3_plus("hr_times3_plus", {8, 8, 4, 4}, hr_times3_plus);
}  // namespace
