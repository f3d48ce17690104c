// Host kernels of tests/programs/arrays_textures.cu: texture and surface objects resolved through
// soft_kernel.hpp (point filtering at texel centres is an integer read).
#include <cstdint>

#include "host_threads.hpp"

namespace {
using vcuda::soft::dim;
using vcuda::soft::launch;
using vcuda::soft::kernels::for_each_thread;

// at_tex_read(cudaTextureObject_t t, float* out, int w, int h): out[y][x] = 2 * tex2D(t, x - 1 + .5, y + .5)
// + 1.
void at_tex_read(const launch& l) {
    auto t = l.param<uint64_t>(0);
    auto out = l.param<float*>(1);
    auto w = l.param<int>(2);
    auto h = l.param<int>(3);
    for_each_thread(l, [&](dim b, dim th) {
        int x = int(b.x * l.block.x + th.x), y = int(b.y * l.block.y + th.y);
        if (x >= w || y >= h) return;
        float v = 0;
        vcuda::soft::tex_read(t, x - 1, y, 0, &v, sizeof v);
        out[size_t(y) * w + x] = 2.0f * v + 1.0f;
    });
}

// at_surf_write(cudaSurfaceObject_t s, int w, int h): surf2Dwrite(float(x * 3 + y * 1000), s, x * 4, y).
void at_surf_write(const launch& l) {
    auto s = l.param<uint64_t>(0);
    auto w = l.param<int>(1);
    auto h = l.param<int>(2);
    for_each_thread(l, [&](dim b, dim th) {
        int x = int(b.x * l.block.x + th.x), y = int(b.y * l.block.y + th.y);
        if (x >= w || y >= h) return;
        float v = static_cast<float>(x * 3 + y * 1000);
        vcuda::soft::surf_write(s, long(x) * 4, y, 0, &v, sizeof v);
    });
}

// at_tex1d(cudaTextureObject_t t, float* out, int n): out[i] = tex1Dfetch(t, i) + i.
void at_tex1d(const launch& l) {
    auto t = l.param<uint64_t>(0);
    auto out = l.param<float*>(1);
    auto n = l.param<int>(2);
    for_each_thread(l, [&](dim b, dim th) {
        int i = int(b.x * l.block.x + th.x);
        if (i >= n) return;
        float v = 0;
        vcuda::soft::tex_read(t, i, 0, 0, &v, sizeof v);
        out[i] = v + static_cast<float>(i);
    });
}

vcuda::soft::registrar r_tex("at_tex_read", {8, 8, 4, 4}, at_tex_read);
vcuda::soft::registrar r_surf("at_surf_write", {8, 4, 4}, at_surf_write);
vcuda::soft::registrar r_tex1d("at_tex1d", {8, 8, 4}, at_tex1d);
}  // namespace
