// Green contexts of the software driver: SM resources are counts (sm_count SMs a device, split in groups of
// multiples of 8, the smallest partition, as on sm_90), a descriptor is the SMs it names, and a green context
// is a context of its own limited to them, which cuCtxFromGreenCtx hands out. Work runs on the CPU as
// everywhere else here: the limit is only reported back (cuCtxGetDevResource, cuGreenCtxGetDevResource).
// The device a resource came from travels in the first bytes of its opaque padding.
#include <cstring>

#include "soft_state.hpp"

namespace vcuda::soft {
namespace {

constexpr unsigned min_partition = 8;

struct resource_desc_obj : object {
    static constexpr kind tag = kind::resource_desc;
    resource_desc_obj() : object(tag) {}
    int device = 0;
    unsigned sms = 0;
};

struct green_obj : object {
    static constexpr kind tag = kind::green_ctx;
    green_obj() : object(tag) {}
    uint64_t ctx = 0;
};

int device_of(const CUdevResource& r) {
    int d = 0;
    std::memcpy(&d, r._internal_padding, sizeof d);
    return d;
}

void sm_resource(CUdevResource* r, int device, unsigned sms) {
    std::memset(r, 0, sizeof *r);
    r->type = CU_DEV_RESOURCE_TYPE_SM;
    std::memcpy(r->_internal_padding, &device, sizeof device);
    r->sm.smCount = sms;
    r->sm.minSmPartitionSize = min_partition;
    r->sm.smCoscheduledAlignment = min_partition;
}

CUresult context_resource(const context_obj& c, CUdevResource* r, CUdevResourceType type) {
    if (r == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (type != CU_DEV_RESOURCE_TYPE_SM) return CUDA_ERROR_INVALID_RESOURCE_TYPE;
    sm_resource(r, c.device, c.sm_limit != 0 ? c.sm_limit : static_cast<unsigned>(sm_count));
    return CUDA_SUCCESS;
}

}  // namespace
}  // namespace vcuda::soft

using namespace vcuda::soft;

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuDeviceGetDevResource(CUdevice device, CUdevResource* resource,
                                                          CUdevResourceType type) {
    return entry([&](state& s) -> CUresult {
        if (!s.valid_device(device)) return CUDA_ERROR_INVALID_DEVICE;
        if (resource == nullptr) return CUDA_ERROR_INVALID_VALUE;
        if (type != CU_DEV_RESOURCE_TYPE_SM) return CUDA_ERROR_INVALID_RESOURCE_TYPE;
        sm_resource(resource, device, static_cast<unsigned>(sm_count));
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuDevSmResourceSplitByCount(CUdevResource* result, unsigned int* nbGroups,
                                                               const CUdevResource* input,
                                                               CUdevResource* remaining,
                                                               unsigned int useFlags, unsigned int minCount) {
    return entry([&](state&) -> CUresult {
        if (nbGroups == nullptr || input == nullptr || input->type != CU_DEV_RESOURCE_TYPE_SM ||
            useFlags != 0)
            return CUDA_ERROR_INVALID_VALUE;
        // Each group gets minCount SMs rounded up to the partition size, at least one partition.
        const unsigned per = minCount <= min_partition
                                 ? min_partition
                                 : (minCount + min_partition - 1) / min_partition * min_partition;
        unsigned groups = input->sm.smCount / per;
        if (result != nullptr) groups = std::min(groups, *nbGroups);
        if (groups == 0) return CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION;
        const int device = device_of(*input);
        if (result != nullptr)
            for (unsigned i = 0; i < groups; ++i) sm_resource(&result[i], device, per);
        if (remaining != nullptr) sm_resource(remaining, device, input->sm.smCount - groups * per);
        *nbGroups = groups;
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuDevResourceGenerateDesc(CUdevResourceDesc* phDesc,
                                                             CUdevResource* resources,
                                                             unsigned int nbResources) {
    return entry([&](state& s) -> CUresult {
        if (phDesc == nullptr || resources == nullptr || nbResources == 0) return CUDA_ERROR_INVALID_VALUE;
        unsigned sms = 0;
        for (unsigned i = 0; i < nbResources; ++i) {
            if (resources[i].type != CU_DEV_RESOURCE_TYPE_SM ||
                device_of(resources[i]) != device_of(resources[0]))
                return CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION;
            sms += resources[i].sm.smCount;
        }
        if (sms == 0 || sms > static_cast<unsigned>(sm_count))
            return CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION;
        resource_desc_obj* d = s.create<resource_desc_obj>();
        d->device = device_of(resources[0]);
        d->sms = sms;
        *phDesc = to_handle<CUdevResourceDesc>(d->handle);
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuGreenCtxCreate(CUgreenCtx* phCtx, CUdevResourceDesc desc, CUdevice dev,
                                                    unsigned int flags) {
    return entry([&](state& s) -> CUresult {
        if (phCtx == nullptr || flags != CU_GREEN_CTX_DEFAULT_STREAM) return CUDA_ERROR_INVALID_VALUE;
        if (!s.valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
        resource_desc_obj* d = s.find<resource_desc_obj>(desc);
        if (d == nullptr) return CUDA_ERROR_INVALID_HANDLE;
        if (d->device != dev) return CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION;
        context_obj* c = s.create<context_obj>();
        c->device = dev;
        c->id = s.next_ctx_id++;
        c->sm_limit = d->sms;
        c->limits = default_limits();
        green_obj* g = s.create<green_obj>();
        g->ctx = c->handle;
        *phCtx = to_handle<CUgreenCtx>(g->handle);
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuCtxFromGreenCtx(CUcontext* pContext, CUgreenCtx hCtx) {
    return entry([&](state& s) -> CUresult {
        if (pContext == nullptr) return CUDA_ERROR_INVALID_VALUE;
        green_obj* g = s.find<green_obj>(hCtx);
        if (g == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
        *pContext = to_handle<CUcontext>(g->ctx);
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuGreenCtxDestroy(CUgreenCtx hCtx) {
    return entry([&](state& s) -> CUresult {
        green_obj* g = s.find<green_obj>(hCtx);
        if (g == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
        if (context_obj* c = s.find<context_obj>(g->ctx)) {
            release_context_resources(s, *c);
            s.erase(c->handle);
        }
        s.erase(g->handle);
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuGreenCtxGetDevResource(CUgreenCtx hCtx, CUdevResource* resource,
                                                            CUdevResourceType type) {
    return entry([&](state& s) -> CUresult {
        green_obj* g = s.find<green_obj>(hCtx);
        context_obj* c = g != nullptr ? s.find<context_obj>(g->ctx) : nullptr;
        if (c == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
        return context_resource(*c, resource, type);
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuCtxGetDevResource(CUcontext hCtx, CUdevResource* resource,
                                                       CUdevResourceType type) {
    return entry([&](state& s) -> CUresult {
        context_obj* c = hCtx != nullptr ? usable_context(s, from_handle(hCtx)) : nullptr;
        if (hCtx == nullptr && require_context(s, c) != CUDA_SUCCESS) return CUDA_ERROR_INVALID_CONTEXT;
        if (c == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
        return context_resource(*c, resource, type);
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuGreenCtxStreamCreate(CUstream* phStream, CUgreenCtx greenCtx,
                                                          unsigned int flags, int priority) {
    return entry([&](state& s) -> CUresult {
        // The driver requires a non-blocking stream here.
        if (phStream == nullptr || flags != CU_STREAM_NON_BLOCKING) return CUDA_ERROR_INVALID_VALUE;
        green_obj* g = s.find<green_obj>(greenCtx);
        if (g == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
        priority = std::clamp(priority, greatest_stream_priority, least_stream_priority);
        stream_obj* st = s.create<stream_obj>();
        st->ctx = g->ctx;
        st->flags = flags;
        st->priority = priority;
        st->id = s.next_stream_id++;
        *phStream = to_handle<CUstream>(st->handle);
        return CUDA_SUCCESS;
    });
}
