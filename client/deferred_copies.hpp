// Device-to-host copies into the application's own pinned memory, left under way when the call returns, as
// the real driver leaves them. Over TCP the server cannot write this process's pages: the GPU copies into
// pages of the server (server/deferred_copies.hpp), and the bytes are fetched here when the application can
// first know that the copy is done — when a synchronize returns, a query answers ready, an event or stream is
// waited for on the host, a host function or a graph's copy with this process's memory starts, or a
// synchronous copy from the device returns — and before this process reads, writes or frees the destination
// for another copy. Pinned memory
// shared with a server on this host needs none of this: the GPU writes its pages itself.
//
// Limit (README): a program that polls the destination for the bytes without any CUDA call waits in vain.
// Off with VCUDA_DEFER_COPIES=0 (every copy into pinned memory is then complete when it returns).
//
// runs on: application threads and the host-function thread. locks: one mutex for the copies left under way,
// held while their bytes are fetched and written (so that they land in the order they were made), never
// while the server waits for one.
#pragma once

#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>

#include <cstddef>
#include <cstdint>

namespace vcuda::client {

// Leaves the copy of n bytes from `src` into `dst` (the application's own pinned memory, not shared with the
// server) under way on `stream` when it can; false when it cannot (switched off, or past
// common/deferred_copy_limits.hpp's bounds): the caller copies as before. `rc` is the call's answer when
// deferred.
bool defer_dtoh(void* dst, CUdeviceptr src, size_t n, CUstream stream, CUresult& rc);
// The application can now know that some GPU work is done: the bytes of every copy left under way that has
// finished are fetched and written to their destinations. One atomic load while nothing is under way.
void settle_finished();
// Before this process reads, writes or frees [p, p+n) itself: waits for every copy under way into it and
// writes its bytes.
void settle_range(const void* p, size_t n);

}  // namespace vcuda::client
