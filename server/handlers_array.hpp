// What other handlers need of CUDA arrays (server/handlers_array.cpp): the copies of handlers_memory.cpp name
// an array as one side of a 2D/3D copy. runs on: the lane's thread.
#pragma once

#include <cstdint>

#include "server/call_context.hpp"

namespace vcuda::server {

// The session's array `id` when the box of w bytes x h rows x depth slices from (x bytes, y, z) lies inside
// it; else CUDA_ERROR_INVALID_HANDLE (not the session's array) or CUDA_ERROR_INVALID_VALUE (past its extent).
CUresult array_box(call_context& cx, uint64_t id, uint64_t x, uint64_t y, uint64_t z, uint64_t w, uint64_t h,
                   uint64_t depth, CUarray& out);

}  // namespace vcuda::server
