// Host kernels of tests/programs/vector_add.cu (also built as vector_add_shared).
#include "host_threads.hpp"

namespace {
using vcuda::soft::launch;
using vcuda::soft::kernels::for_each_index_x;

void vector_add(const launch& l) {
    auto a = l.param<const float*>(0);
    auto b = l.param<const float*>(1);
    auto c = l.param<float*>(2);
    auto n = l.param<int>(3);
    for_each_index_x(l, [&](size_t i) {
        if (i < size_t(n < 0 ? 0 : n)) c[i] = a[i] + b[i];
    });
}

vcuda::soft::registrar r_vector_add("vector_add", {8, 8, 8, 4}, vector_add);
}  // namespace
