// Host kernels of tests/programs/launch_events.cu. Launches run to their end here, so the programmatic
// trigger and grid dependency sync have nothing to order.
#include "host_threads.hpp"

namespace {
using vcuda::soft::launch;
using vcuda::soft::kernels::for_each_index_x;

// le_produce(int* p, int n, int k): p[i] = i * k.
void le_produce(const launch& l) {
    auto p = l.param<int*>(0);
    auto n = l.param<int>(1);
    auto k = l.param<int>(2);
    for_each_index_x(l, [&](size_t i) {
        if (i < size_t(n < 0 ? 0 : n)) p[i] = static_cast<int>(i) * k;
    });
}

// le_consume(const int* p, int* q, int n): q[i] = p[i] + 1.
void le_consume(const launch& l) {
    auto p = l.param<const int*>(0);
    auto q = l.param<int*>(1);
    auto n = l.param<int>(2);
    for_each_index_x(l, [&](size_t i) {
        if (i < size_t(n < 0 ? 0 : n)) q[i] = p[i] + 1;
    });
}

vcuda::soft::registrar r_produce("le_produce", {8, 4, 4}, le_produce);
vcuda::soft::registrar r_consume("le_consume", {8, 8, 4}, le_consume);
}  // namespace
