// Quota checks of generated calls that make the driver hold memory for the session (the spec's `charge=`
// annotation, tools/gen_driver_api.py): each charges the session's quota before the driver call and credits
// it back when the call fails.
// locks: the session's mutex, across the driver call (as allocations hold it).
#include <functional>
#include <string>

#include "server/call_context.hpp"

namespace vcuda::server {

// cuCtxSetLimit: the malloc heap (CU_LIMIT_MALLOC_HEAP_SIZE) is device memory the driver reserves for the
// context, charged at the size set; other limits hold no memory worth a quota and pass through.
CUresult charge_ctx_limit(call_context& cx, const std::function<CUresult()>& call, CUlimit limit,
                          size_t value) {
    if (limit != CU_LIMIT_MALLOC_HEAP_SIZE) return call();
    int d = cx.device_index();
    if (d < 0 || static_cast<size_t>(d) >= cx.sess.device_count())
        return cx.fail(CUDA_ERROR_INVALID_CONTEXT, "no current context");
    device_memory& mem = cx.sess.memory(static_cast<size_t>(d));
    std::lock_guard lock(cx.sess.mu);
    uint64_t old = mem.heap_charge();
    if (value > old && !mem.charge(value - old))
        return cx.fail(CUDA_ERROR_OUT_OF_MEMORY, "a malloc heap of " + std::to_string(value) +
                                                     " bytes exceeds the session's memory quota");
    CUresult rc = call();
    if (rc != CUDA_SUCCESS) {
        if (value > old) mem.credit(value - old);
        return rc;
    }
    if (value < old) mem.credit(old - value);
    mem.set_heap_charge(value);
    return CUDA_SUCCESS;
}

}  // namespace vcuda::server
