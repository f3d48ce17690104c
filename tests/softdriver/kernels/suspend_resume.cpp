// Host kernels of tests/programs/suspend_resume.cu.
#include "host_threads.hpp"

namespace {
using vcuda::soft::dim;
using vcuda::soft::launch;
using vcuda::soft::kernels::for_each_index_x;
using vcuda::soft::kernels::for_each_thread;

void sr_fill(const launch& l) {
    auto x = l.param<float*>(0);
    auto n = l.param<size_t>(1);
    auto base = l.param<float>(2);
    for_each_index_x(l, [&](size_t i) {
        if (i < n) x[i] = base + static_cast<float>(i % 1000);
    });
}

void sr_axpy(const launch& l) {
    auto y = l.param<float*>(0);
    auto x = l.param<const float*>(1);
    auto n = l.param<size_t>(2);
    auto a = l.param<float>(3);
    for_each_index_x(l, [&](size_t i) {
        if (i < n) y[i] += a * x[i];
    });
}

// sr_surf_write(cudaSurfaceObject_t s, int w, int h, float base): surf2Dwrite(base + x + 100 * y, s, x * 4,
// y).
void sr_surf_write(const launch& l) {
    auto s = l.param<uint64_t>(0);
    auto w = l.param<int>(1);
    auto h = l.param<int>(2);
    auto base = l.param<float>(3);
    for_each_thread(l, [&](dim, dim th) {
        int x = int(th.x), y = int(th.y);
        if (x >= w || y >= h) return;
        float v = base + static_cast<float>(x + 100 * y);
        vcuda::soft::surf_write(s, long(x) * 4, y, 0, &v, sizeof v);
    });
}

// sr_tex_read(cudaTextureObject_t t, float* out, int w, int h): out[y * w + x] = tex2D(t, x + .5, y + .5).
void sr_tex_read(const launch& l) {
    auto t = l.param<uint64_t>(0);
    auto out = l.param<float*>(1);
    auto w = l.param<int>(2);
    auto h = l.param<int>(3);
    for_each_thread(l, [&](dim, dim th) {
        int x = int(th.x), y = int(th.y);
        if (x >= w || y >= h) return;
        float v = -1;
        vcuda::soft::tex_read(t, x, y, 0, &v, sizeof v);
        out[size_t(y) * w + x] = v;
    });
}

// sr_tex1d(cudaTextureObject_t t, float* out, int n): out[i] = tex1Dfetch(t, i).
void sr_tex1d(const launch& l) {
    auto t = l.param<uint64_t>(0);
    auto out = l.param<float*>(1);
    auto n = l.param<int>(2);
    for_each_thread(l, [&](dim, dim th) {
        int i = int(th.x);
        if (i >= n) return;
        float v = -1;
        vcuda::soft::tex_read(t, i, 0, 0, &v, sizeof v);
        out[i] = v;
    });
}

vcuda::soft::registrar r_fill("sr_fill", {8, 8, 4}, sr_fill);
vcuda::soft::registrar r_surf("sr_surf_write", {8, 4, 4, 4}, sr_surf_write);
vcuda::soft::registrar r_tex("sr_tex_read", {8, 8, 4, 4}, sr_tex_read);
vcuda::soft::registrar r_tex1d("sr_tex1d", {8, 8, 4}, sr_tex1d);
vcuda::soft::registrar r_axpy("sr_axpy", {8, 8, 8, 4}, sr_axpy);
}  // namespace
