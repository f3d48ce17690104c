// Host kernels of tests/programs/graph_suspend.cu.
#include "host_threads.hpp"

namespace {
using vcuda::soft::launch;
using vcuda::soft::kernels::for_each_index_x;

void gs_set(const launch& l) {
    auto x = l.param<unsigned*>(0);
    auto n = static_cast<size_t>(l.param<int>(1));
    auto base = l.param<unsigned>(2);
    for_each_index_x(l, [&](size_t i) {
        if (i < n) x[i] = base + static_cast<unsigned>(i);
    });
}

void gs_add(const launch& l) {
    auto y = l.param<unsigned*>(0);
    auto x = l.param<const unsigned*>(1);
    auto n = static_cast<size_t>(l.param<int>(2));
    auto a = l.param<unsigned>(3);
    for_each_index_x(l, [&](size_t i) {
        if (i < n) y[i] += a * x[i];
    });
}

void gs_mark(const launch& l) { *l.param<unsigned*>(0) = l.param<unsigned>(1); }

struct gs_mark_params {
    unsigned pad;
    unsigned* where;
    unsigned v;
};
void gs_mark_in(const launch& l) {
    auto p = l.param<gs_mark_params>(0);
    *p.where = p.v;
}

vcuda::soft::registrar r_set("gs_set", {8, 4, 4}, gs_set);
vcuda::soft::registrar r_add("gs_add", {8, 8, 4, 4}, gs_add);
vcuda::soft::registrar r_mark("gs_mark", {8, 4}, gs_mark);
vcuda::soft::registrar r_mark_in("gs_mark_in", {sizeof(gs_mark_params)}, gs_mark_in);
vcuda::soft::registrar g_marks("gs_marks", size_t{16});  // __device__ unsigned gs_marks[4]
}  // namespace
