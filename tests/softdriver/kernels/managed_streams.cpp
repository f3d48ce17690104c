// Host kernels of tests/programs/managed_streams.cu.
#include "host_threads.hpp"

namespace {
using vcuda::soft::launch;
using vcuda::soft::kernels::element_count;
using vcuda::soft::kernels::for_each_index_x;

// ms_gemv(const unsigned* a, const unsigned* x, unsigned* y, int n): y[i] += sum_j a[i * n + j] * x[j].
void ms_gemv(const launch& l) {
    auto a = l.param<const unsigned*>(0);
    auto x = l.param<const unsigned*>(1);
    auto y = l.param<unsigned*>(2);
    auto n = element_count(l.param<int>(3));
    for_each_index_x(l, [&](size_t i) {
        if (i >= n) return;
        unsigned s = 0;
        for (size_t j = 0; j < n; ++j) s += a[i * n + j] * x[j];
        y[i] += s;
    });
}

vcuda::soft::registrar r_ms_gemv("ms_gemv", {8, 8, 8, 4}, ms_gemv);
}  // namespace
