// Host kernels of tests/programs/peer_copies.cu.
#include "host_threads.hpp"

namespace {
using vcuda::soft::launch;

// pc_copy(int* dst, const int* src, int n): dst[i] = src[i] + 1 for every i < n (a grid-stride loop on the
// GPU).
void pc_copy(const launch& l) {
    auto dst = l.param<int*>(0);
    auto src = l.param<const int*>(1);
    auto n = l.param<int>(2);
    for (int i = 0; i < n; ++i) dst[i] = src[i] + 1;
}

vcuda::soft::registrar r_copy("pc_copy", {8, 8, 4}, pc_copy);
}  // namespace
