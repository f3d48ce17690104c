// Helpers for the host implementations of the test programs' kernels (tests/programs/): walk a launch's grid
// and blocks as the GPU would number them. A test stand-in only, see ../soft_kernel.hpp.
// runs on: whatever thread the software driver executes a launch on; a kernel touches only its arguments.
#pragma once

#include <cstddef>

#include "../soft_kernel.hpp"

namespace vcuda::soft::kernels {

// Calls f(block_idx, thread_idx) for every thread of the launch, blocks in order, x fastest.
template <class F>
void for_each_thread(const launch& l, F&& f) {
    for (unsigned bz = 0; bz < l.grid.z; ++bz)
        for (unsigned by = 0; by < l.grid.y; ++by)
            for (unsigned bx = 0; bx < l.grid.x; ++bx)
                for (unsigned tz = 0; tz < l.block.z; ++tz)
                    for (unsigned ty = 0; ty < l.block.y; ++ty)
                        for (unsigned tx = 0; tx < l.block.x; ++tx) f(dim{bx, by, bz}, dim{tx, ty, tz});
}

// For 1D kernels indexed by `int i = blockIdx.x * blockDim.x + threadIdx.x`: calls f(i) for every i the
// launch covers. The test programs launch these kernels with 1D grids and blocks only.
template <class F>
void for_each_index_x(const launch& l, F&& f) {
    const size_t total = size_t{l.grid.x} * l.block.x;
    for (size_t i = 0; i < total; ++i) f(i);
}

// An `int n` element count as kernels use it (`if (i < n)`): a negative one covers nothing.
inline size_t element_count(int n) { return n < 0 ? 0 : static_cast<size_t>(n); }

// The number of threads in the x dimension of the whole grid (gridDim.x * blockDim.x), for grid-stride loops.
inline size_t grid_stride_x(const launch& l) { return size_t{l.grid.x} * l.block.x; }

}  // namespace vcuda::soft::kernels
