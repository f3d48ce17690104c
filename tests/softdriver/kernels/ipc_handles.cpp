// Host kernels of tests/programs/ipc_handles.cu.
#include "host_threads.hpp"

namespace {
using vcuda::soft::launch;
using vcuda::soft::kernels::for_each_index_x;

// ipc_fill(int* p, int n, int add): p[i] = p[i] * 2 + add.
void ipc_fill(const launch& l) {
    auto p = l.param<int*>(0);
    auto n = l.param<int>(1);
    auto add = l.param<int>(2);
    for_each_index_x(l, [&](size_t i) {
        if (i < size_t(n < 0 ? 0 : n)) p[i] = p[i] * 2 + add;
    });
}

vcuda::soft::registrar r_fill("ipc_fill", {8, 4, 4}, ipc_fill);
}  // namespace
