// Host kernels and __managed__ variables of tests/programs/managed_globals.cu.
#include <stdexcept>

#include "host_threads.hpp"

namespace {
using vcuda::soft::launch;
using vcuda::soft::kernels::element_count;
using vcuda::soft::kernels::for_each_index_x;

struct bias_t {
    int add;
    int calls;
};

template <class T>
T* variable(const char* name) {
    void* p = vcuda::soft::kernel_global(name);
    if (p == nullptr) throw std::runtime_error(name);  // the launch fails, as a GPU's would on a bad address
    return static_cast<T*>(p);
}

// mg_step(int round, int n): names mg_table, mg_bias and mg_counter in its code.
void mg_step(const launch& l) {
    auto round = l.param<int>(0);
    auto n = element_count(l.param<int>(1));
    int* table = variable<int>("mg_table");
    auto* bias = variable<bias_t>("mg_bias");
    int* counter = variable<int>("mg_counter");
    const int add = bias->add;
    for_each_index_x(l, [&](size_t i) {
        if (i < n) table[i] += add * round;
    });
    *counter += round;
    bias->calls += 1;
}

// mg_sum(const int* p, int n, unsigned long long* out)
void mg_sum(const launch& l) {
    auto p = l.param<const int*>(0);
    auto n = element_count(l.param<int>(1));
    auto out = l.param<unsigned long long*>(2);
    unsigned long long s = 0;
    for (size_t i = 0; i < n; ++i) s += static_cast<unsigned long long>(p[i]);
    *out = s;
}

vcuda::soft::registrar r_step("mg_step", {4, 4}, mg_step);
vcuda::soft::registrar r_sum("mg_sum", {8, 4, 8}, mg_sum);
vcuda::soft::registrar g_counter("mg_counter", sizeof(int));
vcuda::soft::registrar g_bias("mg_bias", sizeof(bias_t));
vcuda::soft::registrar g_table("mg_table", size_t{16384} * sizeof(int));
vcuda::soft::registrar g_total("mg_total", sizeof(unsigned long long));
}  // namespace
