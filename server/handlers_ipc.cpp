// IPC between sessions of one server (protocol/spec/driver.spec, ops 410-412; server/ipc.hpp): legacy IPC
// memory and event handles and shareable handles of physical allocations.
//
// - Memory (cuIpcGetMemHandle): the physical memory of the mapping that holds the allocation is exported as a
//   descriptor (mappings are made exportable where the driver allows, server/device_memory.cpp); the opener
//   imports it and maps it at addresses of its own, and answers the allocation's place in it. The memory
//   lives while either holds it, as with the driver; an export is withdrawn when its allocation is freed.
//   Opened memory is charged to its exporter's quota only.
// - Events (cuIpcGetEventHandle): with --isolation process the driver's own IPC handle travels (the workers
//   are processes of their own). With --isolation thread every session is in this process, where the driver
//   does not open its own IPC handles: refused (see export_event).
// - Physical allocations (cuMemExportToShareableHandle): the allocation's descriptor, imported by the opener
//   as a physical allocation of its own (a mem_handle), not charged to its quota.
// - Memory pools (cuMemPoolExportToShareableHandle): the pool's descriptor, imported by the opener as a pool
//   of its own; its allocations travel as the driver's export data (cuMemPoolExportPointer), imported as
//   stream-ordered allocations of the opener that are charged to the exporter only.
// A session does not open its own legacy IPC handles (CUDA_ERROR_INVALID_CONTEXT, as a process cannot).
// runs on: the lane's thread. locks: the session's `mu` around its tables, never across a request to the
// parent (--isolation process).
#include "server/handlers_ipc.hpp"

#include <cstring>

#include "common/log.hpp"
#include "server/call_context.hpp"
#include "server/control_messages.hpp"
#include "server_ops.hpp"

namespace vcuda::server {

namespace {

enum ipc_what : uint64_t { what_memory = 0, what_event = 1, what_allocation = 2, what_pool = 3 };

ipc_kind kind_of(uint64_t what) {
    return what == what_memory       ? ipc_kind::memory
           : what == what_event      ? ipc_kind::event
           : what == what_allocation ? ipc_kind::allocation
                                     : ipc_kind::pool;
}

std::vector<std::byte> meta_of(std::initializer_list<uint64_t> fields) {
    message_writer w;
    for (uint64_t f : fields) w.u64(f);
    return std::move(w.bytes);
}

// An export's metadata that is a driver structure as it is (an event handle, a pool pointer's export data).
template <class T>
std::vector<std::byte> meta_of_value(const T& v) {
    const auto* b = reinterpret_cast<const std::byte*>(&v);
    return {b, b + sizeof v};
}

CUresult no_ipc(call_context& cx) {
    return cx.fail(CUDA_ERROR_NOT_SUPPORTED, "this server serves no IPC between sessions");
}

// Deposits `e` under a new token for the session and answers the handle.
CUresult deposit(call_context& cx, ipc_export e, ipc_token& token) {
    ipc_broker& b = *cx.sess.ipc();
    token = new_ipc_token();
    const ipc_kind kind = e.kind;
    std::string why;
    if (!b.deposit(token, cx.sess.id(), cx.sess.tenant(), std::move(e), why))
        return cx.fail(CUDA_ERROR_OPERATING_SYSTEM, "the export could not be registered: " + why);
    auto bytes = encode_ipc_handle({kind, b.instance(), token});
    cx.out_blob(bytes);
    return CUDA_SUCCESS;
}

// Deposits `e` and remembers its token in one of the session's export tables, at `key` (under its mutex).
template <class Map>
CUresult deposit_at(call_context& cx, ipc_export e, Map& exports, const typename Map::key_type& key) {
    ipc_token token;
    if (CUresult r = deposit(cx, std::move(e), token); r != CUDA_SUCCESS) return r;
    std::lock_guard lock(cx.sess.mu);
    exports[key] = token;
    return CUDA_SUCCESS;
}

void answer_handle(call_context& cx, ipc_kind kind, const ipc_token& token) {
    cx.out_blob(encode_ipc_handle({kind, cx.sess.ipc()->instance(), token}));
}

// The export an IPC handle of `kind` names, for this session to open: made by this server, for its tenant.
CUresult fetch_export(call_context& cx, std::span<const std::byte> handle, ipc_kind kind, ipc_handle& h,
                      ipc_export& e) {
    if (!decode_ipc_handle(handle, h) || h.kind != kind)
        return cx.fail(CUDA_ERROR_INVALID_VALUE, "not a vcuda IPC handle of this kind");
    ipc_broker& b = *cx.sess.ipc();
    if (h.instance != b.instance())
        return cx.fail(
            CUDA_ERROR_NOT_SUPPORTED,
            "the IPC handle was made by another vcuda-server: handles open only in sessions of the "
            "server that made them");
    std::string why;
    if (!b.fetch(h.token, cx.sess.id(), cx.sess.tenant(), e, why))
        return cx.fail(CUDA_ERROR_INVALID_VALUE,
                       why.empty()
                           ? "unknown IPC handle: never made, withdrawn (its object is gone), or another "
                             "tenant's"
                           : "the IPC handle could not be looked up: " + why);
    if (e.kind != h.kind)
        return cx.fail(CUDA_ERROR_INVALID_VALUE, "the IPC handle names another kind of object");
    return CUDA_SUCCESS;
}

// ---------------------------------------------------------------- exports

CUresult export_memory(call_context& cx, CUdeviceptr p) {
    device_memory::exported ex;
    size_t device = 0;
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    {
        std::lock_guard lock(cx.sess.mu);
        for (size_t d = 0; d < cx.sess.device_count(); ++d) {
            if (!cx.sess.allowed(d) || !cx.sess.memory(d).contains(p, 1)) continue;
            device = d;
            auto& allocs = cx.sess.memory(d).allocations();
            auto it = std::prev(allocs.upper_bound(p));
            if (auto t = cx.sess.ipc_state.memory_exports.find(it->first);
                t != cx.sess.ipc_state.memory_exports.end()) {
                answer_handle(cx, ipc_kind::memory, t->second);  // the same handle again, as the driver gives
                return CUDA_SUCCESS;
            }
            rc = cx.sess.memory(d).export_allocation(p, ex);
            break;
        }
    }
    if (rc == CUDA_ERROR_INVALID_VALUE)
        return cx.fail(rc,
                       "not memory of cuMemAlloc of this session (stream-ordered and VMM memory have IPC "
                       "of their own)");
    if (rc == CUDA_ERROR_NOT_SUPPORTED)
        return cx.fail(rc, "this server's driver did not make the memory exportable as a descriptor");
    if (rc != CUDA_SUCCESS) return rc;
    ipc_export e;
    e.kind = ipc_kind::memory;
    e.fd = unique_fd(ex.fd);
    e.meta = meta_of({ex.mapping_size, ex.base - ex.mapping, ex.bytes, device});
    return deposit_at(cx, std::move(e), cx.sess.ipc_state.memory_exports, ex.base);
}

CUresult export_event(call_context& cx, uint64_t id) {
    CUevent ev;
    if (CUresult rc = cx.handle(1, handle_kind::event, ev); rc != CUDA_SUCCESS) return rc;
    {
        std::lock_guard lock(cx.sess.mu);
        if (auto t = cx.sess.ipc_state.event_exports.find(id); t != cx.sess.ipc_state.event_exports.end()) {
            answer_handle(cx, ipc_kind::event, t->second);
            return CUDA_SUCCESS;
        }
    }
    if (!cx.drv().cuIpcGetEventHandle) return cx.unsupported("cuIpcGetEventHandle");
    // Sessions as threads of this process would share the event through members of other sessions' contexts;
    // on the H200 a wait on such a member crashed the server (simpleIPC, cuStreamWaitEvent) while its session
    // ended. Refused until their lifetime is sound: --isolation process serves the driver's own handles.
    if (cx.sess.ipc()->in_process())
        return cx.fail(CUDA_ERROR_NOT_SUPPORTED,
                       "IPC event handles need vcuda-server --isolation process (sessions as threads do not "
                       "share events yet)");
    // The driver checks the event (made with CU_EVENT_INTERPROCESS and CU_EVENT_DISABLE_TIMING) either way.
    CUipcEventHandle real{};
    if (CUresult rc = cx.drv().cuIpcGetEventHandle(&real, ev); rc != CUDA_SUCCESS) return rc;
    ipc_export e;
    e.kind = ipc_kind::event;
    e.meta = meta_of_value(real);
    return deposit_at(cx, std::move(e), cx.sess.ipc_state.event_exports, id);
}

CUresult export_allocation(call_context& cx, uint64_t id) {
    void* raw = nullptr;
    if (CUresult rc = cx.lookup(id, handle_kind::mem_handle, raw); rc != CUDA_SUCCESS) return rc;
    std::optional<vmm_tables::allocation> a;
    {
        std::lock_guard lock(cx.sess.mu);
        a = cx.sess.vmm.allocation_of(id);
    }
    if (!a) return cx.fail(CUDA_ERROR_INVALID_VALUE, "not a physical allocation of this session");
    // The server may have made it exportable for moves (create_physical); the application may export only
    // what it asked to.
    if (!(a->prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) && !a->foreign)
        return cx.fail(CUDA_ERROR_INVALID_VALUE,
                       "the allocation was not made with a POSIX file descriptor handle type");
    if (!cx.drv().cuMemExportToShareableHandle) return cx.unsupported("cuMemExportToShareableHandle");
    int fd = -1;
    if (CUresult rc =
            cx.drv().cuMemExportToShareableHandle(&fd, reinterpret_cast<CUmemGenericAllocationHandle>(raw),
                                                  CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
        rc != CUDA_SUCCESS)
        return rc;
    ipc_export e;
    e.kind = ipc_kind::allocation;
    e.fd = unique_fd(fd);
    e.meta = meta_of({a->size, a->device});
    ipc_token token;
    if (CUresult r = deposit(cx, std::move(e), token); r != CUDA_SUCCESS) return r;
    std::lock_guard lock(cx.sess.mu);
    cx.sess.ipc_state.allocation_exports[id].push_back(token);
    return CUDA_SUCCESS;
}

CUresult export_pool(call_context& cx, uint64_t id) {
    void* raw = nullptr;
    handle_entry entry;
    if (CUresult rc = cx.lookup(id, handle_kind::mem_pool, raw, &entry); rc != CUDA_SUCCESS) return rc;
    if (!cx.drv().cuMemPoolExportToShareableHandle) return cx.unsupported("cuMemPoolExportToShareableHandle");
    int fd = -1;  // the driver checks that the pool was made for this handle type
    if (CUresult rc = cx.drv().cuMemPoolExportToShareableHandle(&fd, static_cast<CUmemoryPool>(raw),
                                                                CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
        rc != CUDA_SUCCESS)
        return rc;
    ipc_export e;
    e.kind = ipc_kind::pool;
    e.fd = unique_fd(fd);
    e.meta = meta_of({static_cast<uint64_t>(entry.device)});
    ipc_token token;
    return deposit(cx, std::move(e), token);
}

// ---------------------------------------------------------------- opens

// The physical memory behind an export's descriptor, imported into this process.
CUresult import_descriptor(call_context& cx, const ipc_export& e, CUmemGenericAllocationHandle& mh) {
    auto& d = cx.drv();
    if (!d.cuMemImportFromShareableHandle) return cx.unsupported("cuMemImportFromShareableHandle");
    return d.cuMemImportFromShareableHandle(&mh, reinterpret_cast<void*>(static_cast<uintptr_t>(e.fd.get())),
                                            CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
}

CUresult open_memory(call_context& cx, const ipc_handle& h, ipc_export& e) {
    message_reader r{e.meta};
    uint64_t mapping_size = r.u64(), offset = r.u64(), bytes = r.u64(), device = r.u64();
    if (!r.ok || e.fd.get() < 0 || offset >= mapping_size || bytes > mapping_size - offset)
        return cx.fail(CUDA_ERROR_INVALID_VALUE, "a malformed memory export");
    if (!cx.sess.allowed(device))
        return cx.fail(CUDA_ERROR_INVALID_DEVICE, "the memory is on a GPU this session may not use");
    {
        std::lock_guard lock(cx.sess.mu);
        for (auto& [va, o] : cx.sess.ipc_state.opened_memory)
            if (o.token == h.token) {  // opened already: the same address, one more reference
                ++o.refs;
                cx.out(static_cast<uint64_t>(va + o.offset));
                cx.out(static_cast<uint64_t>(o.bytes));
                return CUDA_SUCCESS;
            }
    }
    CUmemGenericAllocationHandle mh = 0;
    if (CUresult rc = import_descriptor(cx, e, mh); rc != CUDA_SUCCESS) return rc;
    std::lock_guard lock(cx.sess.mu);
    CUdeviceptr va = 0;
    if (CUresult rc = cx.sess.memory(device).map_foreign(mh, mapping_size, va); rc != CUDA_SUCCESS) return rc;
    ipc_tables::opened o;
    o.size = mapping_size;
    o.handle = mh;
    o.offset = offset;
    o.bytes = bytes;
    o.device = device;
    o.token = h.token;
    cx.sess.ipc_state.opened_memory[va] = o;
    cx.out(static_cast<uint64_t>(va + offset));
    cx.out(static_cast<uint64_t>(bytes));
    return CUDA_SUCCESS;
}

CUresult open_event(call_context& cx, ipc_export& e) {
    auto& d = cx.drv();
    CUipcEventHandle real{};
    if (e.meta.size() != sizeof real) return cx.fail(CUDA_ERROR_INVALID_VALUE, "a malformed event export");
    std::memcpy(&real, e.meta.data(), sizeof real);
    if (!d.cuIpcOpenEventHandle) return cx.unsupported("cuIpcOpenEventHandle");
    CUevent ev = nullptr;
    if (CUresult rc = d.cuIpcOpenEventHandle(&ev, real); rc != CUDA_SUCCESS) return rc;
    cx.out_handle(handle_kind::event, ev);
    return CUDA_SUCCESS;
}

CUresult open_allocation(call_context& cx, ipc_export& e) {
    message_reader r{e.meta};
    uint64_t size = r.u64(), device = r.u64();
    if (!r.ok || e.fd.get() < 0) return cx.fail(CUDA_ERROR_INVALID_VALUE, "a malformed allocation export");
    if (!cx.sess.allowed(device))
        return cx.fail(CUDA_ERROR_INVALID_DEVICE, "the memory is on a GPU this session may not use");
    CUmemGenericAllocationHandle mh = 0;
    if (CUresult rc = import_descriptor(cx, e, mh); rc != CUDA_SUCCESS) return rc;
    handle_entry he;
    he.kind = handle_kind::mem_handle;
    he.raw = reinterpret_cast<void*>(mh);
    he.device = static_cast<int>(device);
    std::lock_guard lock(cx.sess.mu);
    uint64_t id = cx.sess.handles.insert(std::move(he));
    cx.sess.vmm.add_allocation(id, size, device, /*foreign=*/true);
    cx.out(id);
    cx.out(size);
    cx.out(static_cast<uint64_t>(device));
    return CUDA_SUCCESS;
}

CUresult open_pool(call_context& cx, ipc_export& e) {
    message_reader r{e.meta};
    uint64_t device = r.u64();
    if (!r.ok || e.fd.get() < 0) return cx.fail(CUDA_ERROR_INVALID_VALUE, "a malformed pool export");
    if (!cx.sess.allowed(device))
        return cx.fail(CUDA_ERROR_INVALID_DEVICE, "the pool is on a GPU this session may not use");
    auto& d = cx.drv();
    if (!d.cuMemPoolImportFromShareableHandle) return cx.unsupported("cuMemPoolImportFromShareableHandle");
    CUmemoryPool pool = nullptr;
    if (CUresult rc = d.cuMemPoolImportFromShareableHandle(
            &pool, reinterpret_cast<void*>(static_cast<uintptr_t>(e.fd.get())),
            CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
        rc != CUDA_SUCCESS)
        return rc;
    handle_entry he;
    he.kind = handle_kind::mem_pool;
    he.raw = pool;
    he.device = static_cast<int>(device);
    uint64_t id;
    {
        std::lock_guard lock(cx.sess.mu);
        id = cx.sess.handles.insert(std::move(he));  // destroyed with the session, as the application's own
    }
    cx.out(id);
    cx.out(device);
    return CUDA_SUCCESS;
}

}  // namespace

// The handle is the 64 bytes the application holds as its CUmemPoolPtrExportData: a vcuda IPC handle naming
// the driver's export data, which the server keeps. So an import takes only export data this server made for
// the tenant, never bytes a client wrote.
CUresult handle_pool_export_pointer(call_context& cx, const pool_export_pointer_args& a) {
    if (!cx.sess.ipc()) return no_ipc(cx);
    const CUdeviceptr p = a.address;
    {
        std::lock_guard lock(cx.sess.mu);
        auto a = cx.sess.pools.find(p);
        if (!a || a->imported)
            return cx.fail(CUDA_ERROR_INVALID_VALUE, "not a stream-ordered allocation this session made");
        if (auto t = cx.sess.ipc_state.pointer_exports.find(p);
            t != cx.sess.ipc_state.pointer_exports.end()) {
            answer_handle(cx, ipc_kind::pool_pointer, t->second);
            return CUDA_SUCCESS;
        }
    }
    if (!cx.drv().cuMemPoolExportPointer) return cx.unsupported("cuMemPoolExportPointer");
    CUmemPoolPtrExportData data{};
    if (CUresult rc = cx.drv().cuMemPoolExportPointer(&data, p); rc != CUDA_SUCCESS) return rc;
    ipc_export e;
    e.kind = ipc_kind::pool_pointer;
    e.meta = meta_of_value(data);
    return deposit_at(cx, std::move(e), cx.sess.ipc_state.pointer_exports, p);
}

CUresult handle_pool_import_pointer(call_context& cx, const pool_import_pointer_args& a) {
    if (!cx.sess.ipc()) return no_ipc(cx);
    void* raw = nullptr;
    handle_entry entry;
    if (CUresult rc = cx.lookup(a.pool_id, handle_kind::mem_pool, raw, &entry); rc != CUDA_SUCCESS) return rc;
    ipc_handle h;
    ipc_export e;
    if (CUresult rc = fetch_export(cx, a.export_data, ipc_kind::pool_pointer, h, e); rc != CUDA_SUCCESS)
        return rc;
    CUmemPoolPtrExportData data;
    if (e.meta.size() != sizeof data) return cx.fail(CUDA_ERROR_INVALID_VALUE, "a malformed pointer export");
    std::memcpy(&data, e.meta.data(), sizeof data);
    auto& d = cx.drv();
    if (!d.cuMemPoolImportPointer || !d.cuMemGetAddressRange_v2)
        return cx.unsupported("cuMemPoolImportPointer");
    CUdeviceptr p = 0;
    if (CUresult rc = d.cuMemPoolImportPointer(&p, static_cast<CUmemoryPool>(raw), &data); rc != CUDA_SUCCESS)
        return rc;
    CUdeviceptr base = 0;
    size_t bytes = 0;
    if (CUresult rc = d.cuMemGetAddressRange_v2(&base, &bytes, p); rc != CUDA_SUCCESS || base != p) {
        d.cuMemFreeAsync(p, nullptr);
        return cx.fail(rc != CUDA_SUCCESS ? rc : CUDA_ERROR_UNKNOWN,
                       "the imported allocation's extent is unknown");
    }
    {
        std::lock_guard lock(cx.sess.mu);
        cx.sess.pools.add(p, bytes, static_cast<size_t>(entry.device), static_cast<CUmemoryPool>(raw),
                          /*imported=*/true);
    }
    cx.out(static_cast<uint64_t>(p));
    cx.out(static_cast<uint64_t>(bytes));
    cx.out(static_cast<uint64_t>(entry.device));
    return CUDA_SUCCESS;
}

// `object` by `what`: an address, an event, a mem_handle or a pool.
CUresult handle_ipc_export(call_context& cx, const ipc_export_args& a) {
    if (a.what > what_pool) return cx.bad_arguments();
    if (!cx.sess.ipc()) return no_ipc(cx);
    switch (a.what) {
        case what_memory:
            return export_memory(cx, a.object);
        case what_event:
            return export_event(cx, a.object);
        case what_allocation:
            return export_allocation(cx, a.object);
        default:
            return export_pool(cx, a.object);
    }
}

// Out: memory {address, bytes}; event {event}; allocation {mem_handle, size, device}; pool {pool, device}.
CUresult handle_ipc_open(call_context& cx, const ipc_open_args& a) {
    if (a.what > what_pool) return cx.bad_arguments();
    if (!cx.sess.ipc()) return no_ipc(cx);
    ipc_handle h;
    ipc_export e;
    if (CUresult rc = fetch_export(cx, a.ipc_handle, kind_of(a.what), h, e); rc != CUDA_SUCCESS) return rc;
    if (e.owner == cx.sess.id() && h.kind != ipc_kind::allocation)
        return cx.fail(CUDA_ERROR_INVALID_CONTEXT, "a process cannot open its own IPC handle");
    switch (h.kind) {
        case ipc_kind::memory:
            return open_memory(cx, h, e);
        case ipc_kind::event:
            return open_event(cx, e);
        case ipc_kind::pool:
            return open_pool(cx, e);
        default:
            return open_allocation(cx, e);
    }
}

CUresult handle_ipc_close(call_context& cx, const ipc_close_args& a) {
    CUdeviceptr va;
    ipc_tables::opened o;
    {
        std::lock_guard lock(cx.sess.mu);
        auto& t = cx.sess.ipc_state;
        auto it = t.opened_at(a.address);
        if (it == t.opened_memory.end())
            return cx.fail(CUDA_ERROR_INVALID_VALUE,
                           "not memory this session opened with cuIpcOpenMemHandle");
        if (--it->second.refs > 0) return CUDA_SUCCESS;
        va = it->first;
        o = it->second;
        t.opened_memory.erase(it);
    }
    cx.drv().cuCtxSynchronize();  // work in flight may still use it
    std::lock_guard lock(cx.sess.mu);
    cx.sess.memory(o.device).unmap_foreign(va, o.size, o.handle);
    return CUDA_SUCCESS;
}

void withdraw_pointer_export(session& s, CUdeviceptr p) {
    auto& t = s.ipc_state.pointer_exports;
    auto it = t.find(p);
    if (it == t.end()) return;
    if (s.ipc()) s.ipc()->withdraw(it->second, s.id());
    t.erase(it);
}

void release_ipc(session& s, size_t device) {
    auto& t = s.ipc_state;
    ipc_broker* b = s.ipc();
    for (auto it = t.event_exports.begin(); it != t.event_exports.end();) {
        handle_entry* e = s.handles.find(it->first, handle_kind::event, handle_kind::none);
        if (e && static_cast<size_t>(e->device) != device) {
            ++it;
            continue;
        }
        if (b) b->withdraw(it->second, s.id());
        it = t.event_exports.erase(it);
    }
    for (auto it = t.opened_memory.begin(); it != t.opened_memory.end();) {
        if (it->second.device != device) {
            ++it;
            continue;
        }
        s.memory(device).unmap_foreign(it->first, it->second.size, it->second.handle);
        it = t.opened_memory.erase(it);
    }
    for (auto it = t.pointer_exports.begin(); it != t.pointer_exports.end();) {
        auto a = s.pools.find(it->first);
        if (a && a->device != device) {
            ++it;
            continue;
        }
        if (b) b->withdraw(it->second, s.id());
        it = t.pointer_exports.erase(it);
    }
    // Memory exports: those of this device's allocations (all of which go now).
    for (auto it = t.memory_exports.begin(); it != t.memory_exports.end();) {
        if (!s.memory(device).contains(it->first, 1)) {
            ++it;
            continue;
        }
        if (b) b->withdraw(it->second, s.id());
        it = t.memory_exports.erase(it);
    }
}

}  // namespace vcuda::server
