// Host kernels of tests/programs/mapped_memory.cu.
#include "host_threads.hpp"

namespace {
using vcuda::soft::launch;
using vcuda::soft::kernels::for_each_index_x;

// mm_square_plus(const unsigned* in, unsigned* out, int n, unsigned k): out[i] = in[i] * in[i] + k.
void mm_square_plus(const launch& l) {
    auto in = l.param<const unsigned*>(0);
    auto out = l.param<unsigned*>(1);
    auto n = l.param<int>(2);
    auto k = l.param<unsigned>(3);
    for_each_index_x(l, [&](size_t i) {
        if (i < size_t(n < 0 ? 0 : n)) out[i] = in[i] * in[i] + k;
    });
}

vcuda::soft::registrar r_mm_square_plus("mm_square_plus", {8, 8, 4, 4}, mm_square_plus);
}  // namespace
