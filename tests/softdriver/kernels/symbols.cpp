// Host kernels and globals of tests/programs/symbols.cu.
#include <atomic>

#include "host_threads.hpp"

namespace {
using vcuda::soft::launch;
using vcuda::soft::kernels::for_each_index_x;

// sym_apply(const int* table, const float* coeffs, float* out, unsigned long long* counter, int n)
void sym_apply(const launch& l) {
    auto table = l.param<const int*>(0);
    auto coeffs = l.param<const float*>(1);
    auto out = l.param<float*>(2);
    auto counter = l.param<unsigned long long*>(3);
    auto n = l.param<int>(4);
    unsigned long long done = 0;
    for_each_index_x(l, [&](size_t i) {
        if (i < size_t(n < 0 ? 0 : n)) {
            out[i] = coeffs[i % 16] * static_cast<float>(table[i % 256]);
            ++done;
        }
    });
    if (done) std::atomic_ref<unsigned long long>(*counter).fetch_add(done);
}

vcuda::soft::registrar r_apply("sym_apply", {8, 8, 8, 8, 4}, sym_apply);
vcuda::soft::registrar g_table("sym_table", size_t{1024});   // __device__ int sym_table[256]
vcuda::soft::registrar g_coeffs("sym_coeffs", size_t{64});   // __constant__ float sym_coeffs[16]
vcuda::soft::registrar g_counter("sym_counter", size_t{8});  // __device__ unsigned long long sym_counter
vcuda::soft::registrar g_init("sym_init", size_t{16});       // __device__ int sym_init[4] = {11, 22, 33, 44}
}  // namespace
