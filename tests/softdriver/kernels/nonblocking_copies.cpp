// Host kernels of tests/programs/nonblocking_copies.cu.
#include <chrono>
#include <thread>

#include "host_threads.hpp"

namespace {
using vcuda::soft::launch;
using vcuda::soft::kernels::for_each_index_x;

// nb_spin(unsigned long long ns): the GPU spins on its global timer; here the launch sleeps as long.
void nb_spin(const launch& l) {
    if (l.threads() == 0) return;
    std::this_thread::sleep_for(std::chrono::nanoseconds(l.param<unsigned long long>(0)));
}

// nb_fill(int* d, int n, int k): d[i] = i * k.
void nb_fill(const launch& l) {
    auto d = l.param<int*>(0);
    auto n = l.param<int>(1);
    auto k = l.param<int>(2);
    for_each_index_x(l, [&](size_t i) {
        if (i < size_t(n < 0 ? 0 : n)) d[i] = static_cast<int>(i) * k;
    });
}

vcuda::soft::registrar r_spin("nb_spin", {8}, nb_spin);
vcuda::soft::registrar r_fill("nb_fill", {8, 4, 4}, nb_fill);
}  // namespace
