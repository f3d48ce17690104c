#include "server/staging.hpp"

#include <sys/mman.h>

namespace vcuda::server {

staging_pool::~staging_pool() {
    for (auto& b : buffers_) {
        if (b.pending && b.done) drv_->cuEventSynchronize(b.done);
        if (b.done) drv_->cuEventDestroy_v2(b.done);
        if (b.data) {
            if (!b.stale) drv_->cuMemHostUnregister(b.data);  // a stale registration went with its context
            ::munmap(b.data, buffer_size);
        }
    }
}

staging_pool::buffer* staging_pool::take() {
    buffers_.reserve(max_buffers);
    for (auto& b : buffers_) {
        if (b.busy) continue;
        if (!b.pending || drv_->cuEventQuery(b.done) == CUDA_SUCCESS) {
            b.pending = false;
            b.busy = true;
            if (b.stale) {  // a failed registration leaves pageable memory: copies from it still work
                drv_->cuMemHostUnregister(b.data);
                b.stale = drv_->cuMemHostRegister_v2(b.data, buffer_size, CU_MEMHOSTREGISTER_PORTABLE) !=
                          CUDA_SUCCESS;
            }
            return &b;
        }
    }
    // The lane's own pages, registered (not cuMemHostAlloc): they outlive the context current now, which a
    // suspended session destroys (server/session_image.cpp) while its lanes keep their pools. Mapped, not
    // malloc'd, so that they go back to the system when the lane ends.
    if (buffers_.size() < max_buffers && drv_->cuMemHostRegister_v2) {
        buffer b;
        void* p = ::mmap(nullptr, buffer_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        b.data = p == MAP_FAILED ? nullptr : p;
        if (b.data &&
            drv_->cuMemHostRegister_v2(b.data, buffer_size, CU_MEMHOSTREGISTER_PORTABLE) == CUDA_SUCCESS) {
            b.busy = true;
            buffers_.push_back(b);
            return &buffers_.back();
        }
        if (b.data) ::munmap(b.data, buffer_size);
    }
    for (auto& b : buffers_) {
        if (b.busy) continue;
        drv_->cuEventSynchronize(b.done);
        b.pending = false;
        b.busy = true;
        return &b;
    }
    return nullptr;
}

CUresult record_in_current_context(const driver_table& drv, CUevent& event, CUcontext& ctx, CUstream stream) {
    CUcontext current = nullptr;
    drv.cuCtxGetCurrent(&current);
    if (event && ctx != current) {
        drv.cuEventDestroy_v2(event);
        event = nullptr;
    }
    if (!event) {
        if (CUresult rc = drv.cuEventCreate(&event, CU_EVENT_DISABLE_TIMING); rc != CUDA_SUCCESS) {
            event = nullptr;
            return rc;
        }
        ctx = current;
    }
    return drv.cuEventRecord(event, stream);
}

void staging_pool::contexts_changed() {
    for (auto& b : buffers_) {
        b.stale = true;
        b.pending = false;  // the old contexts were drained before they went
        b.done = nullptr;   // went with its context
        b.ctx = nullptr;
    }
}

void staging_pool::give_back(buffer* b, CUstream stream) {
    b->busy = false;
    b->pending = record_in_current_context(*drv_, b->done, b->ctx, stream) == CUDA_SUCCESS;
    if (!b->pending) drv_->cuStreamSynchronize(stream);  // no event to wait on later: wait now
}

}  // namespace vcuda::server
