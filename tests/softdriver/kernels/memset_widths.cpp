// Host kernels of tests/programs/memset_widths.cu.
#include <atomic>
#include <cstdint>

#include "host_threads.hpp"

namespace {
using vcuda::soft::launch;

// mw_count_mismatch(const unsigned char* p, unsigned long long n, unsigned char v, unsigned long long*
// count): grid-stride, so it counts over all n bytes; the GPU adds with atomics, so may this.
void mw_count_mismatch(const launch& l) {
    auto p = l.param<const unsigned char*>(0);
    auto n = l.param<unsigned long long>(1);
    auto v = l.param<unsigned char>(2);
    auto count = l.param<unsigned long long*>(3);
    if (vcuda::soft::kernels::grid_stride_x(l) == 0) return;
    unsigned long long local = 0;
    for (unsigned long long i = 0; i < n; ++i) local += p[i] != v;
    if (local) std::atomic_ref<unsigned long long>(*count).fetch_add(local);
}

vcuda::soft::registrar r_mw("mw_count_mismatch", {8, 8, 1, 8}, mw_count_mismatch);
}  // namespace
