// cuMemHostRegister with CU_MEMHOSTREGISTER_DEVICEMAP: the application's own pages made reachable by the GPU
// of a server on this host (client/host_register.cpp).
#pragma once

#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>

#include "client/state.hpp"

namespace vcuda::client {

// Makes the pages holding [p, p+size) reachable by the current device's server's GPU: private memory moves
// onto pinned pages shared with the server (a memfd the server registers with its driver, as for
// cuMemHostAlloc), keeping its addresses and contents; a shared mapping of a file is mapped and registered by
// the server itself. Fills r's server address and device pointer. CUDA_ERROR_NOT_SUPPORTED (logged with the
// reason) when the server is on another host, sharing is off, or the range is neither
// (client/host_register.cpp).
CUresult share_registered_range(void* p, size_t size, host_allocation& r);

// At cuMemHostUnregister of a range share_registered_range moved: the server lets the pages go; they stay
// mapped here, with their contents, as the application's memory.
void unshare_registered_range(const host_allocation& r);

// Frees the device copies that launches made of pinned host memory at `base` which the GPU cannot reach
// (client/api_launch.cpp): called when that memory is freed or unregistered.
void drop_host_shadows(uintptr_t base);

}  // namespace vcuda::client
