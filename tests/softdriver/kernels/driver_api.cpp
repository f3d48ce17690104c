// Host kernels and the global of tests/programs/driver_api_kernels.cu (loaded by driver_api as a fatbin, a
// PTX image and a library).
#include "host_threads.hpp"

namespace {
using vcuda::soft::launch;
using vcuda::soft::kernels::for_each_index_x;

// drv_scale(float* x, float a, int n)
void drv_scale(const launch& l) {
    auto x = l.param<float*>(0);
    auto a = l.param<float>(1);
    auto n = l.param<int>(2);
    for_each_index_x(l, [&](size_t i) {
        if (i < size_t(n < 0 ? 0 : n)) x[i] = x[i] * a;
    });
}

// drv_add_bias(float* x, const float* bias, int n)
void drv_add_bias(const launch& l) {
    auto x = l.param<float*>(0);
    auto bias = l.param<const float*>(1);
    auto n = l.param<int>(2);
    for_each_index_x(l, [&](size_t i) {
        if (i < size_t(n < 0 ? 0 : n)) x[i] = x[i] + *bias;
    });
}

// drv_iota(int* out, int base, int n)
void drv_iota(const launch& l) {
    auto out = l.param<int*>(0);
    auto base = l.param<int>(1);
    auto n = l.param<int>(2);
    for_each_index_x(l, [&](size_t i) {
        if (i < size_t(n < 0 ? 0 : n)) out[i] = base + static_cast<int>(i);
    });
}

vcuda::soft::registrar r_scale("drv_scale", {8, 4, 4}, drv_scale);
vcuda::soft::registrar r_bias("drv_add_bias", {8, 8, 4}, drv_add_bias);
vcuda::soft::registrar r_iota("drv_iota", {8, 4, 4}, drv_iota);
vcuda::soft::registrar g_bias("drv_bias", size_t{4});  // __device__ float drv_bias = 0.5f
}  // namespace
