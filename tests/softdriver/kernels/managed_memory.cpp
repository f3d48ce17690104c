// Host kernels of tests/programs/managed_memory.cu.
#include "host_threads.hpp"

namespace {
using vcuda::soft::launch;
using vcuda::soft::kernels::element_count;
using vcuda::soft::kernels::for_each_index_x;

// mm_affine(int* a, int n, int mul, int add): a[i] = a[i] * mul + add.
void mm_affine(const launch& l) {
    auto a = l.param<int*>(0);
    auto n = element_count(l.param<int>(1));
    auto mul = l.param<int>(2);
    auto add = l.param<int>(3);
    for_each_index_x(l, [&](size_t i) {
        if (i < n) a[i] = a[i] * mul + add;
    });
}

// mm_sum(const int* x, const int* y, int* out, int n): out[i] = x[i] + y[i].
void mm_sum(const launch& l) {
    auto x = l.param<const int*>(0);
    auto y = l.param<const int*>(1);
    auto out = l.param<int*>(2);
    auto n = element_count(l.param<int>(3));
    for_each_index_x(l, [&](size_t i) {
        if (i < n) out[i] = x[i] + y[i];
    });
}

vcuda::soft::registrar r_mm_affine("mm_affine", {8, 4, 4, 4}, mm_affine);
vcuda::soft::registrar r_mm_sum("mm_sum", {8, 8, 8, 4}, mm_sum);
}  // namespace
