// Host kernels of tests/programs/linear_textures.cu: tex1Dfetch through soft_kernel.hpp's tex_read.
#include <cstdint>

#include "host_threads.hpp"

namespace {
using vcuda::soft::launch;
using vcuda::soft::kernels::for_each_index_x;

struct f2 {
    float x, y;
};
struct f4 {
    float x, y, z, w;
};
struct i2 {
    int x, y;
};

// lt_fetch2(cudaTextureObject_t t, float2* out, int n): out[i] = (t[i].x * 2, t[i].y - 1).
void lt_fetch2(const launch& l) {
    auto t = l.param<uint64_t>(0);
    auto out = l.param<f2*>(1);
    auto n = l.param<int>(2);
    for_each_index_x(l, [&](size_t i) {
        if (i >= size_t(n < 0 ? 0 : n)) return;
        f2 v{};
        vcuda::soft::tex_read(t, long(i), 0, 0, &v, sizeof v);
        out[i] = {v.x * 2.0f, v.y - 1.0f};
    });
}

// lt_fetch4(cudaTextureObject_t t, float4* out, int n) and lt_fetch_int2(..., int2* out, int n): out[i] =
// t[i].
template <class T>
void fetch(const launch& l) {
    auto t = l.param<uint64_t>(0);
    auto out = l.param<T*>(1);
    auto n = l.param<int>(2);
    for_each_index_x(l, [&](size_t i) {
        if (i >= size_t(n < 0 ? 0 : n)) return;
        T v{};
        vcuda::soft::tex_read(t, long(i), 0, 0, &v, sizeof v);
        out[i] = v;
    });
}

vcuda::soft::registrar r_fetch2("lt_fetch2", {8, 8, 4}, lt_fetch2);
vcuda::soft::registrar r_fetch4("lt_fetch4", {8, 8, 4}, fetch<f4>);
vcuda::soft::registrar r_fetch_int2("lt_fetch_int2", {8, 8, 4}, fetch<i2>);
}  // namespace
