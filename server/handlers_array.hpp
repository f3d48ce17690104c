// What other handlers need of CUDA arrays (server/handlers_array.cpp): the copies of handlers_memory.cpp name
// an array as one side of a 2D/3D copy. runs on: the lane's thread.
#pragma once

#include <cstdint>

#include "server/call_context.hpp"

namespace vcuda::server {

// The session's array `id` when the box of w bytes x h rows x depth slices from (x bytes, y, z) lies inside
// it; else CUDA_ERROR_INVALID_HANDLE (not the session's array) or CUDA_ERROR_INVALID_VALUE (past its extent).
// Bytes of one row of `d`'s elements, and of all of them, without the driver's padding (how a suspend keeps
// an array's contents, server/array_image.cpp); 0 for a format vcuda does not serve.
uint64_t packed_row_bytes(const CUDA_ARRAY3D_DESCRIPTOR& d);
uint64_t packed_bytes(const CUDA_ARRAY3D_DESCRIPTOR& d);
// Level `level` of a mipmapped array made with `d`: every extent halved `level` times, at least 1 (a layered
// array keeps its layers).
CUDA_ARRAY3D_DESCRIPTOR mipmap_level(const CUDA_ARRAY3D_DESCRIPTOR& d, unsigned level);

// Gives the driver back what an array or mipmapped array handle holds: a mipmapped array with its levels, a
// plain array; nothing for a level (it goes with its mipmapped array) or an entry without a driver object. A
// context of its device is current. Used at a session's end and by a suspend (server/array_image.cpp).
void destroy_driver_array(const driver_table& d, const handle_entry& e);

CUresult array_box(call_context& cx, uint64_t id, uint64_t x, uint64_t y, uint64_t z, uint64_t w, uint64_t h,
                   uint64_t depth, CUarray& out);

}  // namespace vcuda::server
