// Host kernels of tests/programs/tensor_maps.cu: the tensor map parameter is this driver's own descriptor
// (../soft_tensor_map.hpp); the TMA tile load is done here element by element, out-of-bounds elements reading
// zero.
#include <cstring>

#include "../soft_tensor_map.hpp"
#include "host_threads.hpp"

namespace {
using vcuda::soft::launch;

constexpr unsigned box = 16;

// tm_tile_copy(const __grid_constant__ CUtensorMap map, float* out, float scale, float bias): one block per
// box x box tile of the 2D float32 tensor; out[(tile * box + r) * box + c] = tile[r][c] * scale + bias.
void tm_tile_copy(const launch& l) {
    vcuda::soft::tensor_map_desc d;
    if (!vcuda::soft::decode_tensor_map(l.params[0], d) || d.rank != 2 || d.element_bytes != 4 ||
        d.box(0) != box || d.box(1) != box)
        return;  // not a map this kernel can use: the output stays as it was (the program reports the
                 // mismatch)
    auto out = l.param<float*>(1);
    auto scale = l.param<float>(2);
    auto bias = l.param<float>(3);
    const auto* base = reinterpret_cast<const unsigned char*>(d.address);
    for (unsigned by = 0; by < l.grid.y; ++by)
        for (unsigned bx = 0; bx < l.grid.x; ++bx)
            for (unsigned r = 0; r < box; ++r)
                for (unsigned c = 0; c < box; ++c) {
                    const uint64_t x = uint64_t{bx} * box + c, y = uint64_t{by} * box + r;
                    float v = 0.0f;
                    if (x < d.dims[0] && y < d.dims[1])
                        std::memcpy(&v, base + y * d.strides[0] + x * 4, sizeof v);
                    const size_t t = size_t{by} * l.grid.x + bx;
                    out[(t * box + r) * box + c] = v * scale + bias;
                }
}

vcuda::soft::registrar r_tm_tile_copy("tm_tile_copy", {128, 8, 4, 4}, tm_tile_copy);
}  // namespace
