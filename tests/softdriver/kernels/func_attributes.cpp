// Host kernels of tests/programs/func_attributes.cu.
#include <cmath>

#include "host_threads.hpp"

namespace {
using vcuda::soft::launch;
using vcuda::soft::kernels::for_each_index_x;

// fa_small(int* p, int n)
void fa_small(const launch& l) {
    auto p = l.param<int*>(0);
    auto n = l.param<int>(1);
    for_each_index_x(l, [&](size_t i) {
        if (i < size_t(n < 0 ? 0 : n)) p[i] = static_cast<int>(i) * 2;
    });
}

// fa_bounded(float* p, int n): p * 0.5 + 1, fused on the GPU.
void fa_bounded(const launch& l) {
    auto p = l.param<float*>(0);
    auto n = l.param<int>(1);
    for_each_index_x(l, [&](size_t i) {
        if (i < size_t(n < 0 ? 0 : n)) p[i] = std::fma(p[i], 0.5f, 1.0f);
    });
}

// fa_shared(const float* in, float* out, int n): each block reverses its 256-element segment.
void fa_shared(const launch& l) {
    auto in = l.param<const float*>(0);
    auto out = l.param<float*>(1);
    auto n = l.param<int>(2);
    const long long nn = n;
    for (unsigned b = 0; b < l.grid.x; ++b) {
        const long long base = static_cast<long long>(b) * 256;
        for (unsigned t = 0; t < l.block.x && t < 256; ++t) {
            const long long src = 255 - static_cast<long long>(t);
            if (base + t < nn && base + src < nn && src < static_cast<long long>(l.block.x))
                out[base + t] = in[base + src] + 0.0f;
        }
    }
}

// fa_dynamic(float* out, int n): out[i] = i + 1.
void fa_dynamic(const launch& l) {
    auto out = l.param<float*>(0);
    auto n = l.param<int>(1);
    for_each_index_x(l, [&](size_t i) {
        if (i < size_t(n < 0 ? 0 : n)) out[i] = static_cast<float>(i) + 1.0f;
    });
}

vcuda::soft::registrar r_small("fa_small", {8, 4}, fa_small);
vcuda::soft::registrar r_bounded("fa_bounded", {8, 4}, fa_bounded);
vcuda::soft::registrar r_shared("fa_shared", {8, 8, 4}, fa_shared);
vcuda::soft::registrar r_dynamic("fa_dynamic", {8, 4}, fa_dynamic);
}  // namespace
