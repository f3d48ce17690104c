// Launches: validated here like the real driver validates at call time, parameters packed into one buffer
// using the layout the server reported, and queued. Execution errors surface at the next synchronizing call.
#include <cstring>
#include <vector>

#include "client/entry_point.hpp"
#include "client/kernel_params.hpp"
#include "client/managed.hpp"
#include "client/plain_call.hpp"
#include "client/state.hpp"
#include "client/trace.hpp"

using namespace vcuda;
using namespace vcuda::client;

namespace vcuda::client {

CUresult check_shape(int device, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                     unsigned bz) {
    auto& st = state::get();
    auto a = [&](CUdevice_attribute x) { return static_cast<unsigned>(st.attribute(device, x)); };
    if (!gx || !gy || !gz || !bx || !by || !bz) return CUDA_ERROR_INVALID_VALUE;
    if (bx > a(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X) || by > a(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y) ||
        bz > a(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z))
        return CUDA_ERROR_INVALID_VALUE;
    if (uint64_t{bx} * by * bz > a(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK))
        return CUDA_ERROR_INVALID_VALUE;
    if (gx > a(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X) || gy > a(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y) ||
        gz > a(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z))
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

CUresult pack_params(const handle_info& f, void** kernel_params, void** extra, std::vector<std::byte>& buf,
                     param_form& form) {
    if (kernel_params) {
        if (!f.layout) return CUDA_ERROR_INVALID_HANDLE;
        buf.assign(f.layout->total(), std::byte{0});
        for (size_t i = 0; i < f.layout->params.size(); ++i) {
            auto [off, size] = f.layout->params[i];
            if (!kernel_params[i]) return CUDA_ERROR_INVALID_VALUE;
            std::memcpy(buf.data() + off, kernel_params[i], size);
        }
        form = param_form::kernel_params;
        return CUDA_SUCCESS;
    }
    if (extra) {
        const void* ptr = nullptr;
        size_t size = 0;
        for (size_t i = 0; extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
            if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER)
                ptr = extra[i + 1];
            else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE)
                size = *static_cast<size_t*>(extra[i + 1]);
            else
                return CUDA_ERROR_INVALID_VALUE;
        }
        if (size && !ptr) return CUDA_ERROR_INVALID_VALUE;
        buf.assign(static_cast<const std::byte*>(ptr), static_cast<const std::byte*>(ptr) + size);
        form = param_form::extra_buffer;
        return CUDA_SUCCESS;
    }
    if (f.layout && !f.layout->params.empty()) return CUDA_ERROR_INVALID_VALUE;
    buf.clear();
    form = param_form::kernel_params;
    return CUDA_SUCCESS;
}

}  // namespace vcuda::client

namespace {

// Shared memory above the static 48 KiB needs the function's opt-in attribute; the server decides, so such
// launches wait for its answer instead of being queued.
constexpr unsigned static_shared_limit = 48u << 10;

CUresult launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                unsigned shared, CUstream stream, void** kernel_params, void** extra,
                std::span<const std::byte> attrs, size_t n_attrs) {
    VCUDA_REQUIRE_INIT();
    handle_info info;
    uint64_t fid = reinterpret_cast<uint64_t>(f);
    if (!state::get().lookup_kind(fid, info.kind, &info.layout) ||
        (info.kind != handle_kind::function && info.kind != handle_kind::kernel))
        return CUDA_ERROR_INVALID_HANDLE;
    if (!valid_handle(reinterpret_cast<uint64_t>(stream), handle_kind::stream))
        return CUDA_ERROR_INVALID_HANDLE;
    int device = current_device();
    if (device < 0) return CUDA_ERROR_INVALID_CONTEXT;
    if (CUresult rc = check_shape(device, gx, gy, gz, bx, by, bz); rc != CUDA_SUCCESS) return rc;
    std::vector<std::byte> params;
    param_form form;
    if (CUresult rc = pack_params(info, kernel_params, extra, params, form); rc != CUDA_SUCCESS) return rc;
    // Pinned memory that only this process has (over TCP, or registered without DEVICEMAP) is not the GPU's
    // to reach: a kernel given a pointer into it (zero-copy, as with unified addressing) would fault and take
    // the context down.
    if (host_allocation h; state::get().points_to_private_host(params, &h))
        return static_cast<CUresult>(unsupported(
            h.registered && !(h.flags & CU_MEMHOSTREGISTER_DEVICEMAP)
                ? "cuLaunchKernel with an argument that points into memory registered with cuMemHostRegister "
                  "without CU_MEMHOSTREGISTER_DEVICEMAP (cudaHostRegisterMapped): vcuda lets kernels reach "
                  "registered memory only when it is registered with that flag, over a Unix socket"
                : "cuLaunchKernel with an argument that points into pinned host memory (mapped host memory "
                  "needs a server on this host, over a Unix socket: a GPU on another host cannot address "
                  "this process's pages)"));
    // The kernel may read or write any managed memory: the CPU's copies go back to the device first.
    if (CUresult rc = managed_before_launch(); rc != CUDA_SUCCESS) return rc;

    lane* l = state::get().remote().this_thread_lane();
    if (!l) return static_cast<CUresult>(connection_lost_result);
    uint64_t args[] = {
        state::get().route(fid),     gx,     gy, gz, bx, by, bz, shared, reinterpret_cast<uint64_t>(stream),
        static_cast<uint64_t>(form), n_attrs};
    std::span<const std::byte> blobs[] = {params, attrs};
    call_request rq;
    rq.operation = op::launch;
    rq.device = state::get().device(device).server_index;
    rq.args = args;
    rq.blobs = std::span(blobs, n_attrs ? 2 : 1);  // no empty attribute block on the wire
    // A cooperative grid must fit on the device at once, which only the driver knows (it answers
    // CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE at call time): such launches wait for the server's answer.
    for (size_t i = 0; i < n_attrs; ++i) {
        CUlaunchAttribute a;
        std::memcpy(&a, attrs.data() + i * sizeof a, sizeof a);
        if (a.id == CU_LAUNCH_ATTRIBUTE_COOPERATIVE && a.value.cooperative) {
            call_reply rp;
            return static_cast<CUresult>(l->call(rq, rp));
        }
    }
    if (shared > static_shared_limit) {
        // Once such a launch of this function passed, the same amount passes until an attribute changes (the
        // reply cache is dropped then), so repeats are queued.
        plain_call passed(op::launch, "cuLaunchKernel");
        passed.about(fid);
        passed.arg(args[0]);
        passed.arg(shared);
        if (!passed.known_to_succeed()) {
            call_reply rp;
            auto rc = static_cast<CUresult>(l->call(rq, rp));
            if (rc == CUDA_SUCCESS) passed.note_success();
            return rc;
        }
    }
    return static_cast<CUresult>(l->post(rq));
}

}  // namespace

VCUDA_API cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                         unsigned int by, unsigned int bz, unsigned int shared, CUstream stream,
                         void** kernelParams, void** extra) noexcept {
    VCUDA_TRACE_HOOK(cuLaunchKernel, f, gx, gy, gz, bx, by, bz, shared, stream, kernelParams, extra);
    return launch(f, gx, gy, gz, bx, by, bz, shared, stream, kernelParams, extra, {}, 0);
}

VCUDA_API cuLaunchKernelEx(const CUlaunchConfig* config, CUfunction f, void** kernelParams,
                           void** extra) noexcept {
    VCUDA_TRACE_HOOK(cuLaunchKernelEx, config, f, kernelParams, extra);
    if (!config || (config->numAttrs && !config->attrs)) return CUDA_ERROR_INVALID_VALUE;
    std::span<const std::byte> attrs(reinterpret_cast<const std::byte*>(config->attrs),
                                     config->numAttrs * sizeof(CUlaunchAttribute));
    return launch(f, config->gridDimX, config->gridDimY, config->gridDimZ, config->blockDimX,
                  config->blockDimY, config->blockDimZ, config->sharedMemBytes, config->hStream, kernelParams,
                  extra, attrs, config->numAttrs);
}

// A cooperative launch is cuLaunchKernelEx's with the cooperative attribute: the server's launch op passes it
// to the driver as it is, and the driver checks that the grid fits on the device at once.
VCUDA_API cuLaunchCooperativeKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                    unsigned int bx, unsigned int by, unsigned int bz, unsigned int shared,
                                    CUstream stream, void** kernelParams) noexcept {
    VCUDA_TRACE_HOOK(cuLaunchCooperativeKernel, f, gx, gy, gz, bx, by, bz, shared, stream, kernelParams);
    CUlaunchAttribute cooperative{};
    cooperative.id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
    cooperative.value.cooperative = 1;
    std::span<const std::byte> attrs(reinterpret_cast<const std::byte*>(&cooperative), sizeof cooperative);
    return launch(f, gx, gy, gz, bx, by, bz, shared, stream, kernelParams, nullptr, attrs, 1);
}

namespace {
// cuOccupancyMaxActiveClusters (what 0) and cuOccupancyMaxPotentialClusterSize (what 1): answered by the
// server once per function and configuration, then from the reply cache (PyTorch asks about a hundred times a
// step).
CUresult occupancy_clusters(int* answer, CUfunction f, const CUlaunchConfig* config, uint64_t what) {
    VCUDA_REQUIRE_INIT();
    if (!answer || !config || (config->numAttrs && !config->attrs)) return CUDA_ERROR_INVALID_VALUE;
    if (current_device() < 0) return CUDA_ERROR_INVALID_CONTEXT;
    plain_call c(op::occupancy_clusters,
                 what ? "cuOccupancyMaxPotentialClusterSize" : "cuOccupancyMaxActiveClusters");
    c.handle(f, handle_kind::function);
    for (unsigned v : {config->gridDimX, config->gridDimY, config->gridDimZ, config->blockDimX,
                       config->blockDimY, config->blockDimZ, config->sharedMemBytes})
        c.arg(v);
    c.handle(config->hStream, handle_kind::stream);
    c.arg(config->numAttrs);
    c.arg(what);
    c.blob({reinterpret_cast<const std::byte*>(config->attrs), config->numAttrs * sizeof(CUlaunchAttribute)});
    if (CUresult rc = c.send_cached(); rc != CUDA_SUCCESS) return rc;
    *answer = c.out<int>(0);
    return CUDA_SUCCESS;
}
}  // namespace

VCUDA_API cuOccupancyMaxActiveClusters(int* num_clusters, CUfunction f,
                                       const CUlaunchConfig* config) noexcept {
    VCUDA_TRACE_HOOK(cuOccupancyMaxActiveClusters, num_clusters, f, config);
    return occupancy_clusters(num_clusters, f, config, 0);
}

VCUDA_API cuOccupancyMaxPotentialClusterSize(int* cluster_size, CUfunction f,
                                             const CUlaunchConfig* config) noexcept {
    VCUDA_TRACE_HOOK(cuOccupancyMaxPotentialClusterSize, cluster_size, f, config);
    return occupancy_clusters(cluster_size, f, config, 1);
}
