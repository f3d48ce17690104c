// Host kernels of tests/programs/multi_thread.cu.
#include <chrono>
#include <thread>

#include "host_threads.hpp"

namespace {
using vcuda::soft::launch;
using vcuda::soft::kernels::for_each_index_x;

// mt_spin(unsigned long long ns, int* flag): the GPU spins on its global timer; here the launch sleeps as
// long.
void mt_spin(const launch& l) {
    auto ns = l.param<unsigned long long>(0);
    auto flag = l.param<int*>(1);
    if (l.threads() == 0) return;
    std::this_thread::sleep_for(std::chrono::nanoseconds(ns));
    *flag = 1;
}

// mt_work(int* d, int n, int k): d[i] = d[i] * 2 + k.
void mt_work(const launch& l) {
    auto d = l.param<int*>(0);
    auto n = l.param<int>(1);
    auto k = l.param<int>(2);
    for_each_index_x(l, [&](size_t i) {
        if (i < size_t(n < 0 ? 0 : n)) d[i] = d[i] * 2 + k;
    });
}

vcuda::soft::registrar r_spin("mt_spin", {8, 8}, mt_spin);
vcuda::soft::registrar r_work("mt_work", {8, 4, 4}, mt_work);
}  // namespace
