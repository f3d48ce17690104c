// Host kernels of tests/programs/streams_events.cu.
#include <cstdint>

#include "host_threads.hpp"

namespace {
using vcuda::soft::launch;
using vcuda::soft::kernels::for_each_index_x;

// se_lcg(unsigned* data, int n, int iters): iterates a 32-bit LCG on each element.
void se_lcg(const launch& l) {
    auto data = l.param<uint32_t*>(0);
    auto n = l.param<int>(1);
    auto iters = l.param<int>(2);
    for_each_index_x(l, [&](size_t i) {
        if (i < size_t(n < 0 ? 0 : n)) {
            uint32_t x = data[i];
            for (int k = 0; k < iters; ++k) x = x * 1664525u + 1013904223u;
            data[i] = x;
        }
    });
}

vcuda::soft::registrar r_se_lcg("se_lcg", {8, 4, 4}, se_lcg);
}  // namespace
