// Host kernels of tests/programs/copies_2d_3d.cu.
#include <cmath>
#include <cstddef>

#include "host_threads.hpp"

namespace {
using vcuda::soft::dim;
using vcuda::soft::launch;
using vcuda::soft::kernels::for_each_thread;

// c23_add_rows(unsigned char* base, size_t pitch, int width, int height): 2D, row y at base + y * pitch.
void c23_add_rows(const launch& l) {
    auto base = l.param<unsigned char*>(0);
    auto pitch = l.param<size_t>(1);
    auto width = l.param<int>(2);
    auto height = l.param<int>(3);
    for_each_thread(l, [&](dim b, dim t) {
        int x = int(b.x * l.block.x + t.x), y = int(b.y * l.block.y + t.y);
        if (x < width && y < height) base[size_t(y) * pitch + x] += static_cast<unsigned char>(y + 3 * x);
    });
}

// c23_scale3d(float* base, size_t pitch, size_t slice_pitch, int w, int h, int d, float s): 3D; the GPU fuses
// row[x] * s + z into one multiply-add.
void c23_scale3d(const launch& l) {
    auto base = l.param<float*>(0);
    auto pitch = l.param<size_t>(1);
    auto slice_pitch = l.param<size_t>(2);
    auto w = l.param<int>(3);
    auto h = l.param<int>(4);
    auto d = l.param<int>(5);
    auto s = l.param<float>(6);
    for_each_thread(l, [&](dim b, dim t) {
        int x = int(b.x * l.block.x + t.x), y = int(b.y * l.block.y + t.y), z = int(b.z * l.block.z + t.z);
        if (x < w && y < h && z < d) {
            float* row = reinterpret_cast<float*>(reinterpret_cast<char*>(base) + size_t(z) * slice_pitch +
                                                  size_t(y) * pitch);
            row[x] = std::fma(row[x], s, static_cast<float>(z));
        }
    });
}

vcuda::soft::registrar r_rows("c23_add_rows", {8, 8, 4, 4}, c23_add_rows);
vcuda::soft::registrar r_3d("c23_scale3d", {8, 8, 8, 4, 4, 4, 4}, c23_scale3d);
}  // namespace
