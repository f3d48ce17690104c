// Host kernels of tests/programs/mipmapped_arrays.cu: tex2DLod with point filtering at texel centres of a
// level is an integer read of that level.
#include <cstdint>

#include "host_threads.hpp"

namespace {
using vcuda::soft::dim;
using vcuda::soft::launch;
using vcuda::soft::kernels::for_each_thread;

// mm_tex_lod(cudaTextureObject_t t, float* out, int level, int w, int h): out[y][x] = texel (x, y) of level.
void mm_tex_lod(const launch& l) {
    auto t = l.param<uint64_t>(0);
    auto out = l.param<float*>(1);
    auto level = l.param<int>(2);
    auto w = l.param<int>(3);
    auto h = l.param<int>(4);
    for_each_thread(l, [&](dim b, dim th) {
        int x = int(b.x * l.block.x + th.x), y = int(b.y * l.block.y + th.y);
        if (x >= w || y >= h) return;
        float v = 0;
        vcuda::soft::tex_read_level(t, static_cast<unsigned>(level), x, y, 0, &v, sizeof v);
        out[size_t(y) * w + x] = v;
    });
}

// mm_surf_write(cudaSurfaceObject_t s, int w, int h, float base): surf2Dwrite(base + x + y * w, s, x * 4, y).
void mm_surf_write(const launch& l) {
    auto s = l.param<uint64_t>(0);
    auto w = l.param<int>(1);
    auto h = l.param<int>(2);
    auto base = l.param<float>(3);
    for_each_thread(l, [&](dim b, dim th) {
        int x = int(b.x * l.block.x + th.x), y = int(b.y * l.block.y + th.y);
        if (x >= w || y >= h) return;
        float v = base + static_cast<float>(x + y * w);
        vcuda::soft::surf_write(s, long(x) * 4, y, 0, &v, sizeof v);
    });
}

vcuda::soft::registrar r_tex("mm_tex_lod", {8, 8, 4, 4, 4}, mm_tex_lod);
vcuda::soft::registrar r_surf("mm_surf_write", {8, 4, 4, 4}, mm_surf_write);
}  // namespace
