// Host kernels of tests/programs/device_copies.cu.
#include <atomic>
#include <cstdint>

#include "host_threads.hpp"

namespace {
using vcuda::soft::launch;

// dc_checksum(const unsigned* p, unsigned long long n, unsigned long long* out): grid-stride over all n
// words; out[0] += sum of words, out[1] += sum of word * (index + 1), both modulo 2^64.
void dc_checksum(const launch& l) {
    auto p = l.param<const uint32_t*>(0);
    auto n = l.param<unsigned long long>(1);
    auto out = l.param<unsigned long long*>(2);
    if (vcuda::soft::kernels::grid_stride_x(l) == 0) return;
    unsigned long long s = 0, ws = 0;
    for (unsigned long long i = 0; i < n; ++i) {
        s += p[i];
        ws += p[i] * (i + 1);
    }
    std::atomic_ref<unsigned long long>(out[0]).fetch_add(s);
    std::atomic_ref<unsigned long long>(out[1]).fetch_add(ws);
}

vcuda::soft::registrar r_dc("dc_checksum", {8, 8, 8}, dc_checksum);
}  // namespace
