// Legacy IPC handles between processes served by the same vcuda-server (server/handlers_ipc.cpp): memory of
// cuMemAlloc and events made with CU_EVENT_INTERPROCESS. The handle bytes are the server's
// (client/ipc_handles.hpp), opaque here. Opened memory joins the mirror's device allocations until
// cuIpcCloseMemHandle closes it as often as it was opened. Records of an exported or opened event run on the
// server before they return (spec: shared_sync), so that a process told next by other means finds the record
// there, as with the driver. A handle of another server, or of another tenant, fails with the server's reason
// in the log. Shareable handles of physical allocations are client/api_vmm.cpp's.
#include <cstring>
#include <map>
#include <mutex>

#include "client/entry_point.hpp"
#include "client/ipc_handles.hpp"
#include "client/plain_call.hpp"
#include "client/state.hpp"
#include "client/trace.hpp"
#include "client_ops.hpp"

using namespace vcuda;
using namespace vcuda::client;

namespace {

// Memory this process opened: address -> how many times.
std::mutex opened_mu;
std::map<CUdeviceptr, unsigned>& opened() {
    static auto* m = new std::map<CUdeviceptr, unsigned>();
    return *m;
}

std::span<const std::byte> bytes_of(const void* p, size_t n) { return {static_cast<const std::byte*>(p), n}; }

// Answers the handle the server sent into `out` (64 bytes).
CUresult take_handle(const ipc_export_call& c, void* out) {
    if (c.ipc_handle().size() != ipc_handle_bytes) return CUDA_ERROR_UNKNOWN;
    std::memcpy(out, c.ipc_handle().data(), ipc_handle_bytes);
    return CUDA_SUCCESS;
}

CUresult open_memory(CUdeviceptr* pdptr, const CUipcMemHandle& handle, unsigned flags, const char* name) {
    VCUDA_REQUIRE_INIT();
    if (!pdptr) return CUDA_ERROR_INVALID_VALUE;
    if (flags & ~static_cast<unsigned>(CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)) return CUDA_ERROR_INVALID_VALUE;
    int device = current_device();
    if (device < 0) return CUDA_ERROR_INVALID_CONTEXT;
    ipc_open_call c(name, what_memory, flags, bytes_of(handle.reserved, sizeof handle.reserved));
    if (CUresult rc = c.send_sync(); rc != CUDA_SUCCESS) return refused_by_server(name, rc, c);
    auto p = c.out<uint64_t>(0);
    auto bytes = c.out<uint64_t>(1);
    if (!p || !bytes) return CUDA_ERROR_UNKNOWN;
    std::lock_guard lock(opened_mu);
    if (opened()[p]++ == 0) state::get().add_allocation(p, bytes, device);
    *pdptr = p;
    return CUDA_SUCCESS;
}

}  // namespace

VCUDA_API cuIpcGetMemHandle(CUipcMemHandle* pHandle, CUdeviceptr dptr) noexcept {
    VCUDA_TRACE_HOOK(cuIpcGetMemHandle, pHandle, dptr);
    VCUDA_REQUIRE_INIT();
    if (!pHandle) return CUDA_ERROR_INVALID_VALUE;
    auto& st = state::get();
    device_allocation a;
    if (!st.find_allocation(dptr, 1, a) || a.managed || a.module_global) return CUDA_ERROR_INVALID_VALUE;
    context_scope scope(st.primary_context(a.device));  // the server of the memory's device
    ipc_export_call c("cuIpcGetMemHandle", what_memory, dptr);
    if (CUresult rc = c.send_sync(); rc != CUDA_SUCCESS) return refused_by_server("cuIpcGetMemHandle", rc, c);
    return take_handle(c, pHandle->reserved);
}

VCUDA_API cuIpcOpenMemHandle_v2(CUdeviceptr* pdptr, CUipcMemHandle handle, unsigned int Flags) noexcept {
    VCUDA_TRACE_HOOK(cuIpcOpenMemHandle_v2, pdptr, handle, Flags);
    return open_memory(pdptr, handle, Flags, "cuIpcOpenMemHandle");
}

VCUDA_API cuIpcOpenMemHandle(CUdeviceptr* pdptr, CUipcMemHandle handle, unsigned int Flags) noexcept {
    VCUDA_TRACE_HOOK(cuIpcOpenMemHandle, pdptr, handle, Flags);
    return open_memory(pdptr, handle, Flags, "cuIpcOpenMemHandle");
}

VCUDA_API cuIpcCloseMemHandle(CUdeviceptr dptr) noexcept {
    VCUDA_TRACE_HOOK(cuIpcCloseMemHandle, dptr);
    VCUDA_REQUIRE_INIT();
    auto& st = state::get();
    device_allocation a;
    {
        std::lock_guard lock(opened_mu);
        if (!opened().count(dptr) || !st.find_allocation(dptr, 1, a)) return CUDA_ERROR_INVALID_VALUE;
    }
    context_scope scope(st.primary_context(a.device));
    ipc_close_call c("cuIpcCloseMemHandle", dptr);
    if (CUresult rc = c.send_sync(); rc != CUDA_SUCCESS)
        return refused_by_server("cuIpcCloseMemHandle", rc, c);
    std::lock_guard lock(opened_mu);
    auto it = opened().find(dptr);
    if (it != opened().end() && --it->second == 0) {
        opened().erase(it);
        st.remove_allocation(dptr, a);
    }
    return CUDA_SUCCESS;
}

VCUDA_API cuIpcGetEventHandle(CUipcEventHandle* pHandle, CUevent event) noexcept {
    VCUDA_TRACE_HOOK(cuIpcGetEventHandle, pHandle, event);
    VCUDA_REQUIRE_INIT();
    if (!pHandle) return CUDA_ERROR_INVALID_VALUE;
    handle_info info;
    if (!state::get().lookup(reinterpret_cast<uint64_t>(event), info) || info.kind != handle_kind::event)
        return CUDA_ERROR_INVALID_HANDLE;
    context_scope scope(info.ctx);  // the event's session
    ipc_export_call c("cuIpcGetEventHandle", what_event, reinterpret_cast<uint64_t>(event));
    if (CUresult rc = c.send_sync(); rc != CUDA_SUCCESS)
        return refused_by_server("cuIpcGetEventHandle", rc, c);
    mark_ipc_shared(reinterpret_cast<uint64_t>(event));  // its records now run before they return
    return take_handle(c, pHandle->reserved);
}

VCUDA_API cuIpcOpenEventHandle(CUevent* phEvent, CUipcEventHandle handle) noexcept {
    VCUDA_TRACE_HOOK(cuIpcOpenEventHandle, phEvent, handle);
    VCUDA_REQUIRE_INIT();
    if (!phEvent) return CUDA_ERROR_INVALID_VALUE;
    if (current_device() < 0) return CUDA_ERROR_INVALID_CONTEXT;
    ipc_open_call c("cuIpcOpenEventHandle", what_event, 0, bytes_of(handle.reserved, sizeof handle.reserved));
    if (CUresult rc = c.send_sync(); rc != CUDA_SUCCESS)
        return refused_by_server("cuIpcOpenEventHandle", rc, c);
    *phEvent = c.out_handle<CUevent>(0, handle_kind::event);
    mark_ipc_shared(reinterpret_cast<uint64_t>(*phEvent));
    return CUDA_SUCCESS;
}
