// Copies and sets between the application's memory and the server's, each routed to the cheapest path it can
// take: straight from or into pinned memory shared with a server on this host, through the staging slots
// (pinned pages shared with such a server) for large pageable copies, striped over the bulk connections to a
// server over TCP, else in frames on the calling thread's lane. Also the shared pinned allocations
// themselves, which cuMemAllocHost and cuMemHostAlloc use. The exported functions that call these are in
// client/api_memory.cpp. runs on: the calling application thread. locks: the staging-slot pool has its own
// mutex; everything else is the lane's and the state's (client/remote.hpp, client/state.hpp).
#pragma once

#include "client/remote_call.hpp"
#include "client/state.hpp"

namespace vcuda::client {

// CUDA_ERROR_INVALID_HANDLE unless `s` is a live stream or NULL, legacy or per-thread.
CUresult check_stream(CUstream s);

// Pinned memory the server allocates and shares (h.size set by the caller); CUDA_ERROR_NOT_SUPPORTED when the
// server is on another host or sharing is off (VCUDA_SHARED_HOST=0): the caller then uses its own pages.
CUresult shared_host_alloc(host_allocation& h);
void shared_host_free(const host_allocation& h);

// Frees the current session's staging slots when none is in use, for an application allocation the server's
// host memory quota refused; later pageable copies go in frames. False when there were none to free.
bool release_staging_slots();

// `m` sync: the copy is enqueued on the GPU (or done, for device to host) when the call returns; post:
// queued.
CUresult copy_htod(CUdeviceptr dst, const void* src, size_t n, CUstream stream, mode m);
CUresult copy_dtoh(void* dst, CUdeviceptr src, size_t n, CUstream stream, mode m = mode::sync);
CUresult copy_dtod(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream stream, mode m);
// Unified addressing: the direction is found from the allocations the mirror knows.
CUresult copy_any(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream stream, mode m);
CUresult copy_3d(const CUDA_MEMCPY3D& c, CUstream stream, mode m);
CUDA_MEMCPY3D from_2d(const CUDA_MEMCPY2D& p);

// A copy as a graph node (cuGraphAddMemcpyNode, or a copy captured from a stream), rewritten as the server
// must see it: device memory and arrays as they are, shared pinned memory by the server's address, and a side
// in this process's own memory registered as a host copy (client/host_functions.hpp), whose id goes to
// `host_copy` (0: none). CUDA_ERROR_NOT_SUPPORTED, logged under `name`, for a copy between two buffers of
// this process.
CUresult graph_copy(CUDA_MEMCPY3D& c, uint64_t& host_copy, const char* name);
// Adds copy `c` to the capture of `stream` (which captures), as graph_copy describes it.
CUresult capture_copy(const CUDA_MEMCPY3D& c, CUstream stream, const char* name);
// Whether `stream` captures (a round trip only for a stream the mirror does not know, while captures are
// under way: client/api_stream.cpp).
bool stream_captures(CUstream stream);
// True when the box of w bytes x h rows x d slices from (x bytes, y, z) lies inside the array `id` this
// process made (client/api_array.cpp).
bool array_box_fits(uint64_t id, uint64_t x, uint64_t y, uint64_t z, uint64_t w, uint64_t h, uint64_t d);
// The bytes of one element of the array `id` this process made; 0 for no such array.
uint64_t array_element_bytes(uint64_t id);
// Sets `height` rows of `width` elements of `elem` bytes (1, 2 or 4), `pitch` bytes apart.
CUresult memset_2d(CUdeviceptr dst, size_t pitch, uint32_t value, unsigned elem, size_t width, size_t height,
                   CUstream stream, mode m);

}  // namespace vcuda::client
