// A kernel's launch shape and parameters as the client checks and packs them, for launches (api_launch.cpp)
// and kernel graph nodes (api_graph.cpp): checked like the real driver checks at call time, kernelParams
// packed into one block at the layout the server reported (server/kernel_args.hpp unpacks it), the `extra`
// form as given.
#pragma once

#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "client/state.hpp"

namespace vcuda::client {

enum class param_form : uint64_t { kernel_params = 0, extra_buffer = 1 };

// Grid and block against the limits of client device `device`.
CUresult check_shape(int device, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                     unsigned bz);
// Packs kernelParams (or takes the `extra` buffer as given) for function or kernel `f` into `buf`.
CUresult pack_params(const handle_info& f, void** kernel_params, void** extra, std::vector<std::byte>& buf,
                     param_form& form);

}  // namespace vcuda::client
