// A kernel's parameter layout: (offset, size) of each parameter, in order, as the server reads it from the
// driver (cuFuncGetParamInfo) and sends it with each function or kernel handle. The server's handle table
// (server/handle_table.hpp) and the client's mirror (client/state.hpp) keep one per function and kernel; the
// client packs a launch's kernelParams into one block at this layout and the server unpacks it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace vcuda {

struct param_layout {
    std::vector<std::pair<uint32_t, uint32_t>> params;  // (offset, size) per parameter
    size_t total() const { return params.empty() ? 0 : params.back().first + params.back().second; }
};

}  // namespace vcuda
