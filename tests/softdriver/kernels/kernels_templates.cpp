// Host kernels of tests/programs/kernels_templates.cu: the template instances by their mangled names.
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "host_threads.hpp"

namespace {
using vcuda::soft::launch;
using vcuda::soft::kernels::for_each_index_x;
using vcuda::soft::kernels::grid_stride_x;

// kt::reduce_sum<T>(const T* in, T* out, unsigned n): per-thread grid-stride sums, then the same
// shared-memory tree per block, in the same order, so the results match the GPU's bit for bit.
template <class T>
void reduce_sum(const launch& l) {
    auto in = l.param<const T*>(0);
    auto out = l.param<T*>(1);
    auto n = l.param<unsigned>(2);
    const unsigned bd = l.block.x, stride = l.grid.x * l.block.x;
    std::vector<T> buf(bd);
    for (unsigned b = 0; b < l.grid.x; ++b) {
        for (unsigned t = 0; t < bd; ++t) {
            T acc = T(0);
            for (unsigned i = b * bd + t; i < n; i += stride) acc += in[i];
            buf[t] = acc;
        }
        for (unsigned s = bd / 2; s > 0; s >>= 1)
            for (unsigned t = 0; t < s; ++t) buf[t] += buf[t + s];
        out[b] = buf[0];
    }
}

// kt::axpy<T>(T* y, const T* x, T alpha, unsigned n): nvcc contracts alpha * x + y into a fused multiply-add.
template <class T>
void axpy(const launch& l) {
    auto y = l.param<T*>(0);
    auto x = l.param<const T*>(1);
    auto alpha = l.param<T>(2);
    auto n = l.param<unsigned>(3);
    for_each_index_x(l, [&](size_t i) {
        if (i < n) {
            if constexpr (std::is_floating_point_v<T>)
                y[i] = std::fma(alpha, x[i], y[i]);
            else
                y[i] = static_cast<T>(static_cast<uint32_t>(alpha) * static_cast<uint32_t>(x[i]) +
                                      static_cast<uint32_t>(y[i]));
        }
    });
}

// kt::fill_mod<T, N>(T* out, unsigned n): grid-stride, so every element below n.
template <class T, int N>
void fill_mod(const launch& l) {
    auto out = l.param<T*>(0);
    auto n = l.param<unsigned>(1);
    if (grid_stride_x(l) == 0) return;
    for (unsigned i = 0; i < n; ++i) out[i] = T(i % N);
}

// kt::matmul_tiled<16>(const float* A, const float* B, float* C, int M, int N, int K): each output element
// accumulates over k in ascending order with fused multiply-adds, as the tiled loop does (padding adds 0*0).
void matmul_tiled_16(const launch& l) {
    constexpr int tile = 16;
    auto A = l.param<const float*>(0);
    auto B = l.param<const float*>(1);
    auto C = l.param<float*>(2);
    auto M = l.param<int>(3);
    auto N = l.param<int>(4);
    auto K = l.param<int>(5);
    if (l.block.x != tile || l.block.y != tile) return;  // the kernel assumes TILE x TILE blocks
    const int rows = int(l.grid.y) * tile, cols = int(l.grid.x) * tile;
    for (int row = 0; row < rows && row < M; ++row)
        for (int col = 0; col < cols && col < N; ++col) {
            float acc = 0.0f;
            const int kend = (K + tile - 1) / tile * tile;
            for (int k = 0; k < kend; ++k) {
                float a = k < K ? A[row * K + k] : 0.0f;
                float b = k < K ? B[k * N + col] : 0.0f;
                acc = std::fma(a, b, acc);
            }
            C[row * N + col] = acc;
        }
}

// kt_mixed_params(char c, double d, short s, int* out, float f, long long ll, unsigned char uc)
void kt_mixed_params(const launch& l) {
    if (l.threads() == 0) return;
    auto c = l.param<char>(0);
    auto d = l.param<double>(1);
    auto s = l.param<short>(2);
    auto out = l.param<int*>(3);
    auto f = l.param<float>(4);
    auto ll = l.param<long long>(5);
    auto uc = l.param<unsigned char>(6);
    out[0] = c;
    out[1] = static_cast<int>(d * 1000.0);
    out[2] = s;
    out[3] = static_cast<int>(f * 100.0f);
    out[4] = static_cast<int>(ll >> 32);
    out[5] = static_cast<int>(ll & 0xffffffff);
    out[6] = uc;
}

using vcuda::soft::registrar;
registrar r1("_ZN2kt10reduce_sumIfEEvPKT_PS1_j", {8, 8, 4}, reduce_sum<float>);
registrar r2("_ZN2kt10reduce_sumIiEEvPKT_PS1_j", {8, 8, 4}, reduce_sum<int>);
registrar r3("_ZN2kt10reduce_sumIdEEvPKT_PS1_j", {8, 8, 4}, reduce_sum<double>);
registrar r4("_ZN2kt4axpyIfEEvPT_PKS1_S1_j", {8, 8, 4, 4}, axpy<float>);
registrar r5("_ZN2kt4axpyIdEEvPT_PKS1_S1_j", {8, 8, 8, 4}, axpy<double>);
registrar r6("_ZN2kt4axpyIiEEvPT_PKS1_S1_j", {8, 8, 4, 4}, axpy<int>);
registrar r7("_ZN2kt8fill_modIiLi7EEEvPT_j", {8, 4}, fill_mod<int, 7>);
registrar r8("_ZN2kt8fill_modIdLi3EEEvPT_j", {8, 4}, fill_mod<double, 3>);
registrar r9("_ZN2kt12matmul_tiledILi16EEEvPKfS2_Pfiii", {8, 8, 8, 4, 4, 4}, matmul_tiled_16);
registrar r10("kt_mixed_params", {1, 8, 2, 8, 4, 8, 1}, kt_mixed_params);
}  // namespace
