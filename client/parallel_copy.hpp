// Large host memory copies split over helper threads: one core copies pageable memory at 6-9 GB/s, well
// under what PCIe and the memory take, and the staging slots (client/copy_paths.cpp) would cap pageable
// copies there. The calling thread copies a part itself and runs any part no helper has started yet.
#pragma once

#include <cstddef>

namespace vcuda::client {

// memcpy(dst, src, n) for non-overlapping ranges; pieces of at least 1 MiB go to up to 3 helper threads
// (fewer on a machine with fewer cores; none on one core).
void parallel_copy(void* dst, const void* src, size_t n);

}  // namespace vcuda::client
