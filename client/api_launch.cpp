// Launches: validated here like the real driver validates at call time, parameters packed into one buffer
// using the layout the server reported, and queued. Execution errors surface at the next synchronizing call.
#include <algorithm>
#include <climits>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "client/copy_paths.hpp"
#include "client/entry_point.hpp"
#include "client/host_register.hpp"
#include "client/kernel_params.hpp"
#include "client/managed.hpp"
#include "client/plain_call.hpp"
#include "client/state.hpp"
#include "client/trace.hpp"
#include "client_ops.hpp"
#include "common/log.hpp"

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

// Pinned host memory that only this process has (over TCP, or registered without DEVICEMAP over a Unix
// socket) is not the GPU's to reach. A kernel given a pointer into it (zero-copy, as unified addressing
// allows) runs on a shadow instead: device memory of the session the size of that allocation, made at its
// first such launch and freed with it (drop_host_shadows). The allocation is copied to its shadow before the
// launch, the argument points into the shadow, and the shadow is copied back once the kernel is done, before
// the launch returns: the CPU sees the kernel's writes at once. What this cannot do: pointers the kernel
// finds in memory rather than in its arguments still fault, and a kernel that waits for a CPU write made
// while it runs waits in vain (README, limits).
struct shadowed {
    host_allocation host;
    CUdeviceptr shadow = 0;
};
std::mutex shadow_mu;
std::map<std::pair<uintptr_t, int>, CUdeviceptr>& shadow_table() {  // (allocation base, device) -> shadow
    static auto* t = new std::map<std::pair<uintptr_t, int>, CUdeviceptr>();  // never destroyed: atexit
    return *t;
}

CUresult shadow_of(const host_allocation& h, int device, CUdeviceptr& out) {
    std::lock_guard lock(shadow_mu);
    auto& t = shadow_table();
    if (auto it = t.find({h.base, device}); it != t.end()) {
        out = it->second;
        return CUDA_SUCCESS;
    }
    if (CUresult rc = cuMemAlloc_v2(&out, h.size); rc != CUDA_SUCCESS) return rc;
    t[{h.base, device}] = out;
    VCUDA_LOG_INFO(
        "a kernel was given a pointer into {} KiB of pinned host memory the GPU cannot reach: it "
        "runs on a device copy, copied there and back around each such launch",
        h.size >> 10);
    return CUDA_SUCCESS;
}

// Rewrites every word of `params` that points into such memory to point into its shadow, after queueing the
// memory's copy to the shadow on `stream`; `out` gets the shadows to copy back.
CUresult point_at_shadows(std::vector<std::byte>& params, int device, CUstream stream,
                          std::vector<shadowed>& out) {
    for (const auto& word : state::get().private_host_words(params)) {
        const size_t at = word.first;
        const host_allocation& h = word.second;
        auto it =
            std::find_if(out.begin(), out.end(), [&](const shadowed& s) { return s.host.base == h.base; });
        if (it == out.end()) {
            shadowed s{h, 0};
            if (CUresult rc = shadow_of(h, device, s.shadow); rc != CUDA_SUCCESS) return rc;
            if (CUresult rc =
                    copy_htod(s.shadow, reinterpret_cast<const void*>(h.base), h.size, stream, mode::post);
                rc != CUDA_SUCCESS)
                return rc;
            it = out.insert(out.end(), s);
        }
        uintptr_t p;
        std::memcpy(&p, params.data() + at, sizeof p);
        p = it->shadow + (p - h.base);
        std::memcpy(params.data() + at, &p, sizeof p);
    }
    return CUDA_SUCCESS;
}

// The launch op on the calling thread's lane: queued, unless the server must answer first (cooperative grids,
// shared memory above the static limit until such a launch passed).
CUresult send_launch(uint64_t fid, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                     unsigned bz, unsigned shared, CUstream stream, param_form form,
                     std::span<const std::byte> params, std::span<const std::byte> attrs, size_t n_attrs,
                     int device) {
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
    // CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE at call time): such launches wait for the server's answer. So
    // do launches recording an event shared with another process (as its cuEventRecord does), and the events
    // an attribute names must be the application's.
    for (size_t i = 0; i < n_attrs; ++i) {
        CUlaunchAttribute a;
        std::memcpy(&a, attrs.data() + i * sizeof a, sizeof a);
        const CUevent event = a.id == CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_EVENT ? a.value.programmaticEvent.event
                              : a.id == CU_LAUNCH_ATTRIBUTE_LAUNCH_COMPLETION_EVENT
                                  ? a.value.launchCompletionEvent.event
                                  : nullptr;
        const auto event_id = reinterpret_cast<uint64_t>(event);
        if (event && !valid_handle(event_id, handle_kind::event)) return CUDA_ERROR_INVALID_HANDLE;
        if ((a.id == CU_LAUNCH_ATTRIBUTE_COOPERATIVE && a.value.cooperative) ||
            (event && ipc_shared(event_id))) {
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
    std::vector<shadowed> shadows;
    if (CUresult rc = point_at_shadows(params, device, stream, shadows); rc != CUDA_SUCCESS) return rc;
    // The kernel may read or write any managed memory: the CPU's copies go back to the device first.
    if (CUresult rc = managed_before_launch(); rc != CUDA_SUCCESS) return rc;
    CUresult rc =
        send_launch(fid, gx, gy, gz, bx, by, bz, shared, stream, form, params, attrs, n_attrs, device);
    for (const auto& s : shadows) {  // the kernel's writes, back where the application looks for them
        if (s.host.registered && (s.host.flags & CU_MEMHOSTREGISTER_READ_ONLY))
            continue;  // the GPU only reads
        if (CUresult back = copy_dtoh(reinterpret_cast<void*>(s.host.base), s.shadow, s.host.size, stream);
            rc == CUDA_SUCCESS && back != CUDA_SUCCESS)
            rc = back;
    }
    return rc;
}

}  // namespace

namespace vcuda::client {
void drop_host_shadows(uintptr_t base) {
    std::vector<CUdeviceptr> gone;
    {
        std::lock_guard lock(shadow_mu);
        auto& t = shadow_table();
        for (auto it = t.lower_bound({base, INT_MIN}); it != t.end() && it->first.first == base;) {
            gone.push_back(it->second);
            it = t.erase(it);
        }
    }
    for (CUdeviceptr p : gone) cuMemFree_v2(p);
}
}  // namespace vcuda::client

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
CUresult occupancy_clusters(int* answer, CUfunction f, const CUlaunchConfig* config, unsigned what) {
    VCUDA_REQUIRE_INIT();
    if (!answer || !config || (config->numAttrs && !config->attrs)) return CUDA_ERROR_INVALID_VALUE;
    if (current_device() < 0) return CUDA_ERROR_INVALID_CONTEXT;
    occupancy_clusters_call c(
        what ? "cuOccupancyMaxPotentialClusterSize" : "cuOccupancyMaxActiveClusters", f, config->gridDimX,
        config->gridDimY, config->gridDimZ, config->blockDimX, config->blockDimY, config->blockDimZ,
        config->sharedMemBytes, config->hStream, config->numAttrs, what,
        {reinterpret_cast<const std::byte*>(config->attrs), config->numAttrs * sizeof(CUlaunchAttribute)});
    if (CUresult rc = c.send_cached(); rc != CUDA_SUCCESS) return rc;
    *answer = c.answer();
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
