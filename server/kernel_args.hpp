// Kernel parameters as the driver takes them, from the block a launch-shaped call carries (a launch, a kernel
// node, a kernel node's update): the client packs kernelParams into one block at the kernel's layout (form 0)
// or sends an `extra` buffer as given (form 1). Shared by server/handlers_module.cpp and handlers_graph.cpp.
// runs on: the lane's thread; an instance lives for one call.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <vector>

#include "server/call_context.hpp"

namespace vcuda::server {

// Kernels take at most 32,764 bytes of parameters: a layout this long is none the driver can mean.
constexpr size_t max_kernel_params = 32768;

// The parameter layout the driver reports through query(i, &offset, &size) (cuFuncGetParamInfo,
// cuKernelGetParamInfo): it ends where the driver answers CUDA_ERROR_INVALID_VALUE. Another error is
// answered; a list that does not end within max_kernel_params leaves `out` that long, for the caller to
// refuse.
template <class Query>
CUresult driver_param_layout(Query&& query, param_layout& out) {
    out.params.clear();
    for (size_t i = 0; i < max_kernel_params; ++i) {
        size_t off = 0, size = 0;
        CUresult rc = query(i, &off, &size);
        if (rc == CUDA_ERROR_INVALID_VALUE) return CUDA_SUCCESS;
        if (rc != CUDA_SUCCESS) return rc;
        out.params.emplace_back(static_cast<uint32_t>(off), static_cast<uint32_t>(size));
    }
    return CUDA_SUCCESS;
}

// Grid xyz, block xyz and shared bytes: arguments first..first+6 of a launch-shaped call, each a 32-bit
// value.
CUresult launch_dims(call_context& cx, size_t first, unsigned (&dims)[7]);

// launch_dims' answer (or seven saved values) into a CUlaunchConfig or a CUDA_KERNEL_NODE_PARAMS (their
// fields have the same names).
template <class P, class Dims>
void set_dims(P& p, const Dims& dims) {
    p.gridDimX = dims[0];
    p.gridDimY = dims[1];
    p.gridDimZ = dims[2];
    p.blockDimX = dims[3];
    p.blockDimY = dims[4];
    p.blockDimZ = dims[5];
    p.sharedMemBytes = dims[6];
}

// The driver's form of kernel parameters (one pointer per parameter) packed into one block at `layout`, the
// form the client sends: what a kernel node reports, for the client or for a suspend
// (server/graph_image.cpp).
inline std::vector<std::byte> pack_kernel_params(const param_layout& layout, void* const* kernel_params) {
    std::vector<std::byte> block(layout.total());
    for (size_t i = 0; i < layout.params.size(); ++i)
        std::memcpy(block.data() + layout.params[i].first, kernel_params[i], layout.params[i].second);
    return block;
}

// A kernel node's parameters as the driver reports them (cuGraphKernelNodeGetParams_v2), packed at `layout`:
// from kernelParams, else from an `extra` buffer ({CU_LAUNCH_PARAM_BUFFER_POINTER, data,
// CU_LAUNCH_PARAM_BUFFER_SIZE, &size, END}, laid out as the block already). Nothing: neither was given.
inline std::optional<std::vector<std::byte>> kernel_node_params(const param_layout& layout,
                                                                const CUDA_KERNEL_NODE_PARAMS_v2& p) {
    if (p.kernelParams) return pack_kernel_params(layout, p.kernelParams);
    std::vector<std::byte> block(layout.total());
    if (!p.extra) return layout.params.empty() ? std::optional(block) : std::nullopt;
    const void* data = nullptr;
    size_t size = 0;
    for (size_t i = 0; i < 8 && p.extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
        if (p.extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER) data = p.extra[i + 1];
        if (p.extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE) size = *static_cast<const size_t*>(p.extra[i + 1]);
    }
    if (!data) return layout.params.empty() ? std::optional(block) : std::nullopt;
    std::memcpy(block.data(), data, std::min(size, block.size()));
    return block;
}

class kernel_args {
  public:
    kernel_args() = default;
    kernel_args(const kernel_args&) = delete;  // extra() points into the object
    kernel_args& operator=(const kernel_args&) = delete;

    // `block` in `form`, for the function or kernel `e` (its parameter layout). The block is copied into
    // 8-byte-aligned storage; small blocks (nearly every launch) stay inside the object: no allocation.
    CUresult set(call_context& cx, std::span<const std::byte> block, uint64_t form, const handle_entry& e);
    void** kernel_params() { return form_ == 0 ? pointers_ : nullptr; }
    void** extra() { return form_ == 1 ? extra_ : nullptr; }

  private:
    static constexpr size_t small_words = 128, small_params = 64;
    uint64_t small_storage_[small_words];
    void* small_pointers_[small_params];
    std::vector<uint64_t> big_storage_;
    std::vector<void*> big_pointers_;
    void** pointers_ = small_pointers_;
    size_t size_ = 0;
    void* extra_[5] = {};
    uint64_t form_ = 0;
};

}  // namespace vcuda::server
