// The software test driver: memory. Host memory is device memory: cuMemAlloc is an anonymous mapping, the
// virtual memory management API maps memfd-backed "physical" allocations (cuMemCreate) into PROT_NONE
// reservations (cuMemAddressReserve, which honours address hints), pinned host memory is its own device
// pointer. Every device allocation counts against the device's VCUDA_SOFT_MEMORY quota; going past it
// answers CUDA_ERROR_OUT_OF_MEMORY. Every range is recorded so that copies and memsets are checked against
// it.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "soft_state.hpp"

namespace vcuda::soft {

namespace {

size_t page_size() {
    static const size_t p = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    return p;
}

// Handles of a cuMemCreate allocation: unknown, or released to zero, reads as invalid.
mem_handle_obj* live_mem_handle(state& s, CUmemGenericAllocationHandle h) {
    mem_handle_obj* m = s.find<mem_handle_obj>(static_cast<uint64_t>(h));
    return m != nullptr && m->refs > 0 ? m : nullptr;
}

// The reservation holding [p, p+n), if one does.
std::map<uintptr_t, size_t>::iterator find_reservation(state& s, uintptr_t p, size_t n) {
    auto it = s.reservations.upper_bound(p);
    if (it == s.reservations.begin()) return s.reservations.end();
    --it;
    uintptr_t end = 0;
    if (add_overflows(p, n, &end) || end > it->first + it->second) return s.reservations.end();
    return it;
}

CUresult device_alloc(state& s, context_obj& c, size_t bytes, range_kind k, unsigned flags,
                      CUdeviceptr* out) {
    if (out == nullptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
    if (bytes > (size_t{1} << 48)) return CUDA_ERROR_OUT_OF_MEMORY;
    size_t os_size = round_up(bytes, page_size());
    if (CUresult r = charge(s, c.device, os_size); r != CUDA_SUCCESS) return r;
    void* p = os_alloc(os_size);
    if (p == nullptr) {
        uncharge(s, c.device, os_size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    mem_range r;
    r.base = reinterpret_cast<uintptr_t>(p);
    r.size = bytes;
    r.k = k;
    r.device = c.device;
    r.ctx = c.handle;
    r.flags = flags;
    r.charged = os_size;
    r.os_size = os_size;
    insert_range(s, r);
    *out = static_cast<CUdeviceptr>(r.base);
    return CUDA_SUCCESS;
}

}  // namespace

CUresult graph_alloc(state& s, context_obj& c, size_t bytes, CUdeviceptr* out) {
    if (CUresult r = device_alloc(s, c, bytes, range_kind::device, 0, out); r != CUDA_SUCCESS) return r;
    s.ranges[static_cast<uintptr_t>(*out)].graph = true;
    auto& d = s.devices[static_cast<size_t>(c.device)];
    d.graph_high = std::max(d.graph_high, graph_memory(s, c.device));
    return CUDA_SUCCESS;
}

size_t graph_memory(const state& s, int device) {
    size_t n = 0;
    for (const auto& [base, r] : s.ranges)
        if (r.graph && r.device == device) n += r.os_size;
    return n;
}

namespace {

CUresult host_alloc(state& s, void** pp, size_t bytes, unsigned flags) {
    if (pp == nullptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
    if ((flags & ~(CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED)) !=
        0)
        return CUDA_ERROR_INVALID_VALUE;
    context_obj* c = nullptr;
    if (CUresult r = require_context(s, c); r != CUDA_SUCCESS) return r;
    if (CUresult r = check_unsafe_call(s); r != CUDA_SUCCESS) return r;  // as measured on the H200
    if (bytes > (size_t{1} << 48)) return CUDA_ERROR_OUT_OF_MEMORY;
    size_t os_size = round_up(bytes, page_size());
    void* p = os_alloc(os_size);
    if (p == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
    mem_range r;
    r.base = reinterpret_cast<uintptr_t>(p);
    r.size = bytes;
    r.k = range_kind::host_alloc;
    r.device = c->device;
    r.ctx = c->handle;
    r.flags = flags;
    r.os_size = os_size;
    insert_range(s, r);
    *pp = p;
    return CUDA_SUCCESS;
}

bool valid_alloc_prop(state& s, const CUmemAllocationProp* prop, CUresult& err, bool host_ok = false) {
    if (prop == nullptr || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED) {
        err = CUDA_ERROR_INVALID_VALUE;
        return false;
    }
    switch (prop->location.type) {
        case CU_MEM_LOCATION_TYPE_DEVICE:
            if (!s.valid_device(prop->location.id)) {
                err = CUDA_ERROR_INVALID_DEVICE;
                return false;
            }
            return true;
        case CU_MEM_LOCATION_TYPE_HOST:
        case CU_MEM_LOCATION_TYPE_HOST_NUMA:
        case CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT:
            if (host_ok)
                return true;  // granularity queries (NCCL's probe); host memory itself is not modelled
            err = CUDA_ERROR_NOT_SUPPORTED;
            return false;
        default:
            err = CUDA_ERROR_INVALID_VALUE;
            return false;
    }
}

// Whether every page of [p, p+n) is mapped in this process (mincore fails with ENOMEM otherwise).
bool host_range_mapped(uintptr_t p, size_t n) {
    uintptr_t start = p & ~(page_size() - 1);
    uintptr_t end = 0;
    if (add_overflows(p, n, &end)) return false;
    size_t len = round_up(end - start, page_size());
    std::vector<unsigned char> vec(len / page_size());
    return mincore(reinterpret_cast<void*>(start), len, vec.data()) == 0;
}

int current_device_or(state& s, int fallback) {
    context_obj* c = current_context(s);
    return c != nullptr ? c->device : fallback;
}

size_t pointer_attribute_size(CUpointer_attribute a) {
    switch (a) {
        case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS:
        case CU_POINTER_ATTRIBUTE_IS_MANAGED:
        case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
        case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
        case CU_POINTER_ATTRIBUTE_MAPPED:
        case CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE:
        case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS:
        case CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE:
            return 4;
        case CU_POINTER_ATTRIBUTE_P2P_TOKENS:
            return 0;
        default:
            return 8;
    }
}

template <class T>
void put(void* data, T v) {
    std::memcpy(data, &v, sizeof v);
}

CUresult pointer_attribute(state& s, void* data, CUpointer_attribute attribute, CUdeviceptr ptr) {
    if (data == nullptr) return CUDA_ERROR_INVALID_VALUE;
    mem_range* r = find_range(s, static_cast<uintptr_t>(ptr));
    if (r == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const bool host = r->k == range_kind::host_alloc || r->k == range_kind::host_registered;
    switch (attribute) {
        case CU_POINTER_ATTRIBUTE_CONTEXT:
            put(data, to_handle<CUcontext>(r->ctx));
            break;
        case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
            put(data, static_cast<unsigned>(host ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE));
            break;
        case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
            put(data, ptr);
            break;
        case CU_POINTER_ATTRIBUTE_HOST_POINTER:
            if (!host && r->k != range_kind::managed) return CUDA_ERROR_INVALID_VALUE;
            put(data, reinterpret_cast<void*>(static_cast<uintptr_t>(ptr)));
            break;
        case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS:
            put(data, static_cast<unsigned>(r->sync_memops));
            break;
        case CU_POINTER_ATTRIBUTE_BUFFER_ID:
        case CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID:
            put(data, static_cast<unsigned long long>(r->buffer_id));
            break;
        case CU_POINTER_ATTRIBUTE_IS_MANAGED:
            put(data, static_cast<unsigned>(r->k == range_kind::managed));
            break;
        case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
            put(data, r->device);
            break;
        case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
            put(data, static_cast<unsigned>(r->k == range_kind::device));
            break;
        case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
        case CU_POINTER_ATTRIBUTE_RANGE_SIZE: {
            uintptr_t base = r->base;
            size_t size = r->size;
            if (r->k == range_kind::vmm) {
                auto it = find_reservation(s, r->base, r->size);
                if (it != s.reservations.end()) {
                    base = it->first;
                    size = it->second;
                }
            }
            if (attribute == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR)
                put(data, static_cast<CUdeviceptr>(base));
            else
                put(data, size);
            break;
        }
        case CU_POINTER_ATTRIBUTE_MAPPED:
            put(data, 1u);
            break;
        case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES: {
            unsigned long long types = 0;
            if (r->k == range_kind::vmm)
                if (auto* m = s.find<mem_handle_obj>(r->mem_handle)) types = m->prop.requestedHandleTypes;
            put(data, types);
            break;
        }
        case CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE:
            put(data, static_cast<unsigned>(r->k == range_kind::device));
            break;
        case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS: {
            unsigned flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
            if (r->k == range_kind::vmm)
                flags = r->access[static_cast<size_t>(current_device_or(s, r->device))];
            put(data, flags);
            break;
        }
        case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
            put(data, static_cast<CUmemoryPool>(nullptr));
            break;
        case CU_POINTER_ATTRIBUTE_MAPPING_SIZE:
            put(data, r->size);
            break;
        case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR:
            put(data, reinterpret_cast<void*>(r->base));
            break;
        case CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE:
            put(data, 0u);
            break;
        case CU_POINTER_ATTRIBUTE_P2P_TOKENS:
            return CUDA_ERROR_NOT_SUPPORTED;
        default:
            return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

}  // namespace

void* os_alloc(size_t bytes) {
    void* p =
        mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return p == MAP_FAILED ? nullptr : p;
}

void os_free(void* p, size_t bytes) {
    if (p != nullptr && bytes != 0) munmap(p, bytes);
}

mem_range* find_range(state& s, uintptr_t p) {
    auto it = s.ranges.upper_bound(p);
    if (it == s.ranges.begin()) return nullptr;
    --it;
    return p - it->first < it->second.size ? &it->second : nullptr;
}

bool in_reservation(const state& s, uintptr_t p) {
    auto it = s.reservations.upper_bound(p);
    if (it == s.reservations.begin()) return false;
    --it;
    return p - it->first < it->second;
}

CUresult check_device_range(state& s, uintptr_t p, size_t n, bool write) {
    uintptr_t end = 0;
    if (add_overflows(p, n, &end)) return CUDA_ERROR_INVALID_VALUE;
    const unsigned needed = write ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE : CU_MEM_ACCESS_FLAGS_PROT_READ;
    uintptr_t cur = p;
    bool first = true;
    while (first || cur < end) {
        mem_range* r = find_range(s, cur);
        if (r == nullptr)
            return in_reservation(s, cur) ? CUDA_ERROR_ILLEGAL_ADDRESS : CUDA_ERROR_INVALID_VALUE;
        if (!first && r->k != range_kind::vmm) return CUDA_ERROR_INVALID_VALUE;
        if (r->k == range_kind::vmm) {
            // Mapped but never given access (cuMemSetAccess): a GPU would fault.
            int dev = current_device_or(s, r->device);
            if ((r->access[static_cast<size_t>(dev)] & needed) != needed) return CUDA_ERROR_ILLEGAL_ADDRESS;
        } else if (end - r->base > r->size) {
            return CUDA_ERROR_INVALID_VALUE;  // runs past the end of its allocation
        }
        cur = r->base + r->size;
        first = false;
    }
    return CUDA_SUCCESS;
}

void insert_range(state& s, mem_range r) {
    // A fresh mapping can only overlap ranges whose memory is gone: host memory registered and then freed by
    // its owner without cuMemHostUnregister. Forget those.
    auto it = s.ranges.lower_bound(r.base);
    if (it != s.ranges.begin()) {
        auto prev = std::prev(it);
        if (prev->first + prev->second.size > r.base) it = prev;
    }
    while (it != s.ranges.end() && it->first < r.base + r.size) it = s.ranges.erase(it);
    r.buffer_id = s.next_buffer_id++;
    s.ranges.emplace(r.base, r);
}

void maybe_free_mem_handle(state& s, mem_handle_obj& m) {
    if (m.refs != 0 || m.maps != 0) return;
    if (m.fd >= 0) close(m.fd);
    uncharge(s, m.prop.location.id, m.size);
    s.erase(m.handle);
}

void free_range(state& s, uintptr_t base) {
    auto it = s.ranges.find(base);
    if (it == s.ranges.end()) return;
    mem_range r = it->second;
    s.ranges.erase(it);
    switch (r.k) {
        case range_kind::device:
        case range_kind::managed:
        case range_kind::host_alloc:
            os_free(reinterpret_cast<void*>(r.base), r.os_size);
            uncharge(s, r.device, r.charged);
            break;
        case range_kind::vmm: {
            // Back to a reserved, inaccessible range (a failure leaves the pages as they were: nothing to
            // undo).
            (void)mmap(reinterpret_cast<void*>(r.base), r.size, PROT_NONE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
            if (auto* m = s.find<mem_handle_obj>(r.mem_handle)) {
                --m->maps;
                maybe_free_mem_handle(s, *m);
            }
            break;
        }
        case range_kind::global:
            std::free(reinterpret_cast<void*>(r.base));
            break;
        case range_kind::host_registered:
            break;
    }
}

CUresult charge(state& s, int device, size_t bytes) {
    device_info& d = s.devices[static_cast<size_t>(device)];
    if (bytes > d.total_memory - d.used) return CUDA_ERROR_OUT_OF_MEMORY;
    d.used += bytes;
    return CUDA_SUCCESS;
}

void uncharge(state& s, int device, size_t bytes) {
    if (device < 0 || static_cast<size_t>(device) >= s.devices.size()) return;
    device_info& d = s.devices[static_cast<size_t>(device)];
    d.used -= bytes < d.used ? bytes : d.used;
}

void* global_alloc(state& s, global_set& set, const global_entry& g, int device) {
    auto it = set.vars.find(g.name);
    if (it != set.vars.end()) return it->second.first;
    size_t size = g.size == 0 ? 1 : g.size;
    void* p = nullptr;
    // VCUDA_SOFT_MOVE_GLOBALS=1: a global loaded again goes elsewhere, as a real driver may place it in
    // another process (a resumed or moved session's).
    static const bool move_globals = [] {
        const char* v = std::getenv("VCUDA_SOFT_MOVE_GLOBALS");
        return v != nullptr && std::strcmp(v, "1") == 0;
    }();
    if (auto kept = s.freed_globals.find({std::string(g.name), device, g.size});
        !move_globals && kept != s.freed_globals.end()) {
        p = kept->second;
        s.freed_globals.erase(kept);
    } else {
        p = std::aligned_alloc(256, round_up(size, 256));
    }
    if (p == nullptr) throw std::bad_alloc();
    std::memset(p, 0, round_up(size, 256));
    mem_range r;
    r.base = reinterpret_cast<uintptr_t>(p);
    r.size = g.size;
    r.k = range_kind::global;
    r.device = device;
    insert_range(s, r);
    set.vars.emplace(std::string(g.name), std::make_pair(p, g.size));
    return p;
}

void free_globals(state& s, global_set& set) {
    for (auto& [name, var] : set.vars) {
        auto r = s.ranges.find(reinterpret_cast<uintptr_t>(var.first));
        if (r == s.ranges.end()) {
            std::free(var.first);
            continue;
        }
        s.freed_globals.emplace(std::make_tuple(name, r->second.device, var.second), var.first);
        s.ranges.erase(r);
    }
    set.vars.clear();
}

}  // namespace vcuda::soft

using namespace vcuda::soft;

// --- Linear device memory.

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
    return entry([&](state& s) -> CUresult {
        if (dptr == nullptr) return CUDA_ERROR_INVALID_VALUE;
        context_obj* c = nullptr;
        if (CUresult r = require_context(s, c); r != CUDA_SUCCESS) return r;
        if (CUresult r = check_unsafe_call(s); r != CUDA_SUCCESS) return r;
        return device_alloc(s, *c, bytesize, range_kind::device, 0, dptr);
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuMemAllocManaged(CUdeviceptr* dptr, size_t bytesize, unsigned int flags) {
    return entry([&](state& s) -> CUresult {
        if (dptr == nullptr || (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST))
            return CUDA_ERROR_INVALID_VALUE;
        context_obj* c = nullptr;
        if (CUresult r = require_context(s, c); r != CUDA_SUCCESS) return r;
        return device_alloc(s, *c, bytesize, range_kind::managed, flags, dptr);
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pPitch, size_t WidthInBytes,
                                                      size_t Height, unsigned int ElementSizeBytes) {
    return entry([&](state& s) -> CUresult {
        if (dptr == nullptr || pPitch == nullptr || WidthInBytes == 0 || Height == 0)
            return CUDA_ERROR_INVALID_VALUE;
        if (ElementSizeBytes != 4 && ElementSizeBytes != 8 && ElementSizeBytes != 16)
            return CUDA_ERROR_INVALID_VALUE;
        context_obj* c = nullptr;
        if (CUresult r = require_context(s, c); r != CUDA_SUCCESS) return r;
        if (WidthInBytes > (size_t{1} << 40)) return CUDA_ERROR_INVALID_VALUE;
        size_t pitch = round_up(WidthInBytes, 512);
        size_t bytes = 0;
        if (__builtin_mul_overflow(pitch, Height, &bytes)) return CUDA_ERROR_INVALID_VALUE;
        CUresult r = device_alloc(s, *c, bytes, range_kind::device, 0, dptr);
        if (r == CUDA_SUCCESS) *pPitch = pitch;
        return r;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuMemFree_v2(CUdeviceptr dptr) {
    return entry([&](state& s) -> CUresult {
        if (dptr == 0) return CUDA_SUCCESS;
        context_obj* c = nullptr;
        if (CUresult r = require_context(s, c); r != CUDA_SUCCESS) return r;
        if (CUresult r = check_unsafe_call(s); r != CUDA_SUCCESS) return r;
        auto it = s.ranges.find(static_cast<uintptr_t>(dptr));
        if (it == s.ranges.end() ||
            (it->second.k != range_kind::device && it->second.k != range_kind::managed))
            return CUDA_ERROR_INVALID_VALUE;
        if (it->second.graph) return CUDA_SUCCESS;  // the address stays its graph's
        release_pooled(s, it->second);
        free_range(s, it->first);
        return CUDA_SUCCESS;
    });
}

// --- Stream-ordered allocation and memory pools.

namespace {

pool_obj* default_pool(state& s, int device) {
    auto& d = s.devices[static_cast<size_t>(device)];
    if (auto* p = s.find<pool_obj>(d.default_pool)) return p;
    pool_obj* p = s.create<pool_obj>();
    p->device = device;
    p->is_default = true;
    p->access[static_cast<size_t>(device)] = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    d.default_pool = p->handle;
    return p;
}

pool_obj* current_pool(state& s, int device) {
    if (auto* p = s.find<pool_obj>(s.devices[static_cast<size_t>(device)].current_pool)) return p;
    return default_pool(s, device);
}

CUresult pool_alloc(state& s, CUdeviceptr* dptr, size_t bytes, pool_obj* pool, CUstream stream) {
    if (dptr == nullptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
    context_obj* c = nullptr;
    if (CUresult r = check_stream(s, stream, &c); r != CUDA_SUCCESS) return r;
    if (pool == nullptr) pool = current_pool(s, c->device);
    if (pool->device != c->device) return CUDA_ERROR_INVALID_VALUE;
    if (capture_of(s, stream) != nullptr) {  // a memory alloc node of the capture's graph
        if (CUresult r = graph_alloc(s, *c, bytes, dptr); r != CUDA_SUCCESS) return r;
        work none = []() { return CUDA_SUCCESS; };
        if (CUresult r = capture_or_run(s, stream, none, CU_GRAPH_NODE_TYPE_MEM_ALLOC); r != CUDA_SUCCESS)
            return r;
        if (node_obj* n = last_captured(s, stream)) {
            CUmemPoolProps props{};
            props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
            props.location = {CU_MEM_LOCATION_TYPE_DEVICE, c->device};
            keep_alloc_params(*n, props, nullptr, 0, bytes, *dptr);
        }
        return CUDA_SUCCESS;
    }
    if (CUresult r = device_alloc(s, *c, bytes, range_kind::device, 0, dptr); r != CUDA_SUCCESS) return r;
    s.ranges[static_cast<uintptr_t>(*dptr)].pool = pool->handle;
    pool->used += bytes;
    pool->used_high = std::max(pool->used_high, pool->used);
    return CUDA_SUCCESS;
}

}  // namespace

// A stream-ordered allocation given back (cuMemFreeAsync, or cuMemFree): its pool's figures drop.
void vcuda::soft::release_pooled(state& s, const mem_range& r) {
    if (auto* p = s.find<pool_obj>(r.pool)) p->used -= std::min<uint64_t>(p->used, r.size);
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuMemAllocAsync(CUdeviceptr* dptr, size_t bytesize, CUstream hStream) {
    return entry([&](state& s) -> CUresult { return pool_alloc(s, dptr, bytesize, nullptr, hStream); });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuMemAllocFromPoolAsync(CUdeviceptr* dptr, size_t bytesize,
                                                           CUmemoryPool pool, CUstream hStream) {
    return entry([&](state& s) -> CUresult {
        auto* p = s.find<pool_obj>(pool);
        if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
        return pool_alloc(s, dptr, bytesize, p, hStream);
    });
}

// On a capturing stream: a memory free node, which frees a stream-ordered allocation when the graph runs (a
// graph allocation's address stays its graph's).
VCUDA_SOFT_EXPORT CUresult CUDAAPI cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) {
    return entry([&](state& s) -> CUresult {
        if (CUresult r = check_stream(s, hStream); r != CUDA_SUCCESS) return r;
        if (dptr == 0) return CUDA_SUCCESS;  // as the real driver: freeing NULL does nothing
        auto it = s.ranges.find(static_cast<uintptr_t>(dptr));
        if (it == s.ranges.end() || it->second.k != range_kind::device) return CUDA_ERROR_INVALID_VALUE;
        if (it->second.imports > 0) {  // an importer's free: its import ends, the exporter's memory stays
            --it->second.imports;
            return CUDA_SUCCESS;
        }
        if (capture_of(s, hStream) != nullptr) {
            work at_launch = [base = it->first]() {
                return entry([&](state& st) -> CUresult {
                    auto r = st.ranges.find(base);
                    if (r == st.ranges.end() || r->second.graph) return CUDA_SUCCESS;
                    release_pooled(st, r->second);
                    free_range(st, base);
                    return CUDA_SUCCESS;
                });
            };
            if (CUresult r = capture_or_run(s, hStream, at_launch, CU_GRAPH_NODE_TYPE_MEM_FREE);
                r != CUDA_SUCCESS)
                return r;
            if (node_obj* n = last_captured(s, hStream)) n->freed = dptr;
            return CUDA_SUCCESS;
        }
        if (it->second.graph) return CUDA_SUCCESS;  // the address stays its graph's
        release_pooled(s, it->second);
        free_range(s, it->first);
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuMemPoolCreate(CUmemoryPool* pool, const CUmemPoolProps* props) {
    return entry([&](state& s) -> CUresult {
        if (pool == nullptr || props == nullptr || props->allocType != CU_MEM_ALLOCATION_TYPE_PINNED)
            return CUDA_ERROR_INVALID_VALUE;
        if (props->location.type != CU_MEM_LOCATION_TYPE_DEVICE || !s.valid_device(props->location.id))
            return CUDA_ERROR_INVALID_VALUE;
        pool_obj* p = s.create<pool_obj>();
        p->device = props->location.id;
        p->shareable = (props->handleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != 0;
        p->access[static_cast<size_t>(p->device)] = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        *pool = to_handle<CUmemoryPool>(p->handle);
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuMemPoolDestroy(CUmemoryPool pool) {
    return entry([&](state& s) -> CUresult {
        auto* p = s.find<pool_obj>(pool);
        if (p == nullptr || p->is_default) return CUDA_ERROR_INVALID_VALUE;
        for (auto& d : s.devices)
            if (d.current_pool == p->handle) d.current_pool = 0;
        for (auto& [base, r] : s.ranges)
            if (r.pool == p->handle) r.pool = 0;
        s.erase(p->handle);
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuDeviceGetDefaultMemPool(CUmemoryPool* pool, CUdevice dev) {
    return entry([&](state& s) -> CUresult {
        if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
        if (!s.valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
        *pool = to_handle<CUmemoryPool>(default_pool(s, dev)->handle);
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuDeviceGetMemPool(CUmemoryPool* pool, CUdevice dev) {
    return entry([&](state& s) -> CUresult {
        if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
        if (!s.valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
        *pool = to_handle<CUmemoryPool>(current_pool(s, dev)->handle);
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool) {
    return entry([&](state& s) -> CUresult {
        if (!s.valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
        auto* p = s.find<pool_obj>(pool);
        if (p == nullptr || p->device != dev) return CUDA_ERROR_INVALID_VALUE;
        s.devices[static_cast<size_t>(dev)].current_pool = p->handle;
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuMemPoolTrimTo(CUmemoryPool pool, size_t) {
    return entry([&](state& s) -> CUresult {
        return s.find<pool_obj>(pool) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr,
                                                         void* value) {
    return entry([&](state& s) -> CUresult {
        auto* p = s.find<pool_obj>(pool);
        if (p == nullptr || value == nullptr) return CUDA_ERROR_INVALID_VALUE;
        switch (attr) {
            case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
            case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
            case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
                p->reuse[attr - 1] = *static_cast<int*>(value) != 0;
                return CUDA_SUCCESS;
            case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
                p->release_threshold = *static_cast<cuuint64_t*>(value);
                return CUDA_SUCCESS;
            case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
            case CU_MEMPOOL_ATTR_USED_MEM_HIGH:  // only resetting to 0 is allowed
                if (*static_cast<cuuint64_t*>(value) != 0) return CUDA_ERROR_INVALID_VALUE;
                p->used_high = p->used;
                return CUDA_SUCCESS;
            default:
                return CUDA_ERROR_INVALID_VALUE;
        }
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr,
                                                         void* value) {
    return entry([&](state& s) -> CUresult {
        auto* p = s.find<pool_obj>(pool);
        if (p == nullptr || value == nullptr) return CUDA_ERROR_INVALID_VALUE;
        auto put = [&](cuuint64_t v) { *static_cast<cuuint64_t*>(value) = v; };
        switch (attr) {
            case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
            case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
            case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
                *static_cast<int*>(value) = p->reuse[attr - 1];
                break;
            case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
                put(p->release_threshold);
                break;
            case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
            case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
                put(p->used);
                break;
            case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
            case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
                put(p->used_high);
                break;
            default:
                return CUDA_ERROR_INVALID_VALUE;
        }
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuMemPoolSetAccess(CUmemoryPool pool, const CUmemAccessDesc* map,
                                                      size_t count) {
    return entry([&](state& s) -> CUresult {
        auto* p = s.find<pool_obj>(pool);
        if (p == nullptr || map == nullptr || count == 0) return CUDA_ERROR_INVALID_VALUE;
        for (size_t i = 0; i < count; ++i)
            if (map[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE || !s.valid_device(map[i].location.id))
                return CUDA_ERROR_INVALID_VALUE;
        for (size_t i = 0; i < count; ++i) p->access[static_cast<size_t>(map[i].location.id)] = map[i].flags;
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuMemPoolGetAccess(CUmemAccess_flags* flags, CUmemoryPool pool,
                                                      CUmemLocation* location) {
    return entry([&](state& s) -> CUresult {
        auto* p = s.find<pool_obj>(pool);
        if (p == nullptr || flags == nullptr || location == nullptr ||
            location->type != CU_MEM_LOCATION_TYPE_DEVICE || !s.valid_device(location->id))
            return CUDA_ERROR_INVALID_VALUE;
        *flags = p->access[static_cast<size_t>(location->id)];
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuMemGetInfo_v2(size_t* free, size_t* total) {
    return entry([&](state& s) -> CUresult {
        if (free == nullptr || total == nullptr) return CUDA_ERROR_INVALID_VALUE;
        context_obj* c = nullptr;
        if (CUresult r = require_context(s, c); r != CUDA_SUCCESS) return r;
        const device_info& d = s.devices[static_cast<size_t>(c->device)];
        *total = d.total_memory;
        *free = d.total_memory - d.used;
        return CUDA_SUCCESS;
    });
}

// Answers for every recorded range: allocations, VMM mappings, pinned and registered host memory, globals.
VCUDA_SOFT_EXPORT CUresult CUDAAPI cuMemGetAddressRange_v2(CUdeviceptr* pbase, size_t* psize,
                                                           CUdeviceptr dptr) {
    return entry([&](state& s) -> CUresult {
        mem_range* r = find_range(s, static_cast<uintptr_t>(dptr));
        if (r == nullptr) return CUDA_ERROR_NOT_FOUND;
        if (pbase != nullptr) *pbase = static_cast<CUdeviceptr>(r->base);
        if (psize != nullptr) *psize = r->size;
        return CUDA_SUCCESS;
    });
}

// --- Virtual memory management.

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuMemGetAllocationGranularity(size_t* granularity,
                                                                 const CUmemAllocationProp* prop,
                                                                 CUmemAllocationGranularity_flags option) {
    return entry([&](state& s) -> CUresult {
        if (granularity == nullptr) return CUDA_ERROR_INVALID_VALUE;
        if (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM && option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)
            return CUDA_ERROR_INVALID_VALUE;
        CUresult err = CUDA_SUCCESS;
        if (!valid_alloc_prop(s, prop, err, /*host_ok=*/true)) return err;
        *granularity = vmm_granularity;
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                                               const CUmemAllocationProp* prop, unsigned long long flags) {
    return entry([&](state& s) -> CUresult {
        if (handle == nullptr || flags != 0 || size == 0 || size % vmm_granularity != 0)
            return CUDA_ERROR_INVALID_VALUE;
        if (CUresult r = check_unsafe_call(s); r != CUDA_SUCCESS) return r;
        CUresult err = CUDA_SUCCESS;
        if (!valid_alloc_prop(s, prop, err)) return err;
        const unsigned known = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR | CU_MEM_HANDLE_TYPE_WIN32 |
                               CU_MEM_HANDLE_TYPE_WIN32_KMT | CU_MEM_HANDLE_TYPE_FABRIC;
        unsigned types = static_cast<unsigned>(prop->requestedHandleTypes);
        if ((types & ~known) != 0) return CUDA_ERROR_INVALID_VALUE;
        if ((types & CU_MEM_HANDLE_TYPE_FABRIC) != 0)
            return CUDA_ERROR_NOT_PERMITTED;  // as measured on an H100
        if ((types & (CU_MEM_HANDLE_TYPE_WIN32 | CU_MEM_HANDLE_TYPE_WIN32_KMT)) != 0)
            return CUDA_ERROR_NOT_SUPPORTED;
        int device = prop->location.id;
        if (CUresult r = charge(s, device, size); r != CUDA_SUCCESS) return r;
        // The name carries the device, for a process that imports the memory
        // (cuMemImportFromShareableHandle).
        const std::string name = "vcuda-soft-vmm-" + std::to_string(device);
        int fd = memfd_create(name.c_str(), MFD_CLOEXEC);
        if (fd < 0 || ftruncate(fd, static_cast<off_t>(size)) != 0) {
            if (fd >= 0) close(fd);
            uncharge(s, device, size);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        mem_handle_obj* m = s.create<mem_handle_obj>();
        m->fd = fd;
        m->size = size;
        m->prop = *prop;
        *handle = static_cast<CUmemGenericAllocationHandle>(m->handle);
        return CUDA_SUCCESS;
    });
}

// The memory goes when it is both released and unmapped.
VCUDA_SOFT_EXPORT CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle handle) {
    return entry([&](state& s) -> CUresult {
        mem_handle_obj* m = live_mem_handle(s, handle);
        if (m == nullptr) return CUDA_ERROR_INVALID_VALUE;
        --m->refs;
        maybe_free_mem_handle(s, *m);
        return CUDA_SUCCESS;
    });
}

// A POSIX file descriptor of the allocation's memfd (when the allocation asked for that handle type): another
// process imports it as the same memory, as with the real driver on one GPU.
VCUDA_SOFT_EXPORT CUresult CUDAAPI cuMemExportToShareableHandle(void* shareable,
                                                                CUmemGenericAllocationHandle handle,
                                                                CUmemAllocationHandleType type,
                                                                unsigned long long flags) {
    return entry([&](state& s) -> CUresult {
        if (shareable == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
        mem_handle_obj* m = live_mem_handle(s, handle);
        if (m == nullptr) return CUDA_ERROR_INVALID_VALUE;
        if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR ||
            (m->prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) == 0)
            return CUDA_ERROR_INVALID_VALUE;
        int fd = fcntl(m->fd, F_DUPFD_CLOEXEC, 0);
        if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
        *static_cast<int*>(shareable) = fd;
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuMemImportFromShareableHandle(CUmemGenericAllocationHandle* handle,
                                                                  void* os_handle,
                                                                  CUmemAllocationHandleType type) {
    return entry([&](state& s) -> CUresult {
        if (handle == nullptr || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
            return CUDA_ERROR_INVALID_VALUE;
        const int from = static_cast<int>(reinterpret_cast<uintptr_t>(os_handle));
        // Only this driver's own allocations: a memfd named by cuMemCreate, of a whole number of granules.
        char link[128] = {};
        const std::string path = "/proc/self/fd/" + std::to_string(from);
        ssize_t n = readlink(path.c_str(), link, sizeof link - 1);
        int device = -1;
        if (n <= 0 || std::sscanf(link, "/memfd:vcuda-soft-vmm-%d", &device) != 1 || !s.valid_device(device))
            return CUDA_ERROR_INVALID_VALUE;
        struct stat st {};
        if (fstat(from, &st) != 0 || st.st_size <= 0 ||
            static_cast<size_t>(st.st_size) % vmm_granularity != 0)
            return CUDA_ERROR_INVALID_VALUE;
        const auto size = static_cast<size_t>(st.st_size);
        if (CUresult r = charge(s, device, size); r != CUDA_SUCCESS) return r;
        int fd = fcntl(from, F_DUPFD_CLOEXEC, 0);
        if (fd < 0) {
            uncharge(s, device, size);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        mem_handle_obj* m = s.create<mem_handle_obj>();
        m->fd = fd;
        m->size = size;
        m->prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        m->prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        m->prop.location.id = device;
        m->prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        *handle = static_cast<CUmemGenericAllocationHandle>(m->handle);
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuMemRetainAllocationHandle(CUmemGenericAllocationHandle* handle,
                                                               void* addr) {
    return entry([&](state& s) -> CUresult {
        if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
        mem_range* r = find_range(s, reinterpret_cast<uintptr_t>(addr));
        if (r == nullptr || r->k != range_kind::vmm) return CUDA_ERROR_INVALID_VALUE;
        mem_handle_obj* m = s.find<mem_handle_obj>(r->mem_handle);
        if (m == nullptr) return CUDA_ERROR_INVALID_VALUE;
        ++m->refs;
        *handle = static_cast<CUmemGenericAllocationHandle>(m->handle);
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI
cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp* prop, CUmemGenericAllocationHandle handle) {
    return entry([&](state& s) -> CUresult {
        if (prop == nullptr) return CUDA_ERROR_INVALID_VALUE;
        mem_handle_obj* m = live_mem_handle(s, handle);
        if (m == nullptr) return CUDA_ERROR_INVALID_VALUE;
        *prop = m->prop;
        return CUDA_SUCCESS;
    });
}

// A PROT_NONE reservation. A nonzero, aligned `addr` is tried exactly (MAP_FIXED_NOREPLACE); if something is
// already there the range goes wherever the kernel puts it, as the real driver treats addr as a hint.
VCUDA_SOFT_EXPORT CUresult CUDAAPI cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment,
                                                       CUdeviceptr addr, unsigned long long flags) {
    return entry([&](state& s) -> CUresult {
        if (ptr == nullptr || size == 0 || size % vmm_granularity != 0 || flags != 0)
            return CUDA_ERROR_INVALID_VALUE;
        if (alignment == 0) alignment = vmm_granularity;
        if (!is_pow2(alignment)) return CUDA_ERROR_INVALID_VALUE;
        if (alignment < vmm_granularity) alignment = vmm_granularity;
        const int prot_flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
        uintptr_t base = 0;
        if (addr != 0 && addr % alignment == 0) {
            void* want = reinterpret_cast<void*>(static_cast<uintptr_t>(addr));
            void* p = mmap(want, size, PROT_NONE, prot_flags | MAP_FIXED_NOREPLACE, -1, 0);
            if (p == want) {
                base = reinterpret_cast<uintptr_t>(p);
            } else if (p != MAP_FAILED) {
                munmap(p, size);  // a kernel without MAP_FIXED_NOREPLACE placed it elsewhere
            }
        }
        // Like the real driver (measured on the H200: 0x10004000000 for a 16 TiB range), reservations without
        // a hint go to a device address area below the host's mapping area, so that they never take the
        // addresses where a process maps host memory (a moved session's shared pinned pages, for one).
        for (uintptr_t at = round_up(s.next_device_va, alignment);
             base == 0 && addr == 0 && at < device_va_end;) {
            void* want = reinterpret_cast<void*>(at);
            void* p = mmap(want, size, PROT_NONE, prot_flags | MAP_FIXED_NOREPLACE, -1, 0);
            if (p == want) {
                base = at;
                s.next_device_va = at + size;
            } else {
                if (p != MAP_FAILED) munmap(p, size);
                break;  // something is there: the kernel's choice, below
            }
        }
        if (base == 0) {
            size_t total = 0;
            if (__builtin_add_overflow(size, alignment, &total)) return CUDA_ERROR_OUT_OF_MEMORY;
            void* p = mmap(nullptr, total, PROT_NONE, prot_flags, -1, 0);
            if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
            uintptr_t raw = reinterpret_cast<uintptr_t>(p);
            base = round_up(raw, alignment);
            if (base > raw) munmap(p, base - raw);
            if (raw + total > base + size)
                munmap(reinterpret_cast<void*>(base + size), raw + total - (base + size));
        }
        s.reservations.emplace(base, size);
        *ptr = static_cast<CUdeviceptr>(base);
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuMemAddressFree(CUdeviceptr ptr, size_t size) {
    return entry([&](state& s) -> CUresult {
        auto it = s.reservations.find(static_cast<uintptr_t>(ptr));
        if (it == s.reservations.end() || it->second != size) return CUDA_ERROR_INVALID_VALUE;
        std::vector<uintptr_t> inside;
        for (auto r = s.ranges.lower_bound(it->first); r != s.ranges.end() && r->first < it->first + size;
             ++r)
            if (r->second.k == range_kind::vmm) inside.push_back(r->first);
        for (uintptr_t b : inside) free_range(s, b);
        munmap(reinterpret_cast<void*>(it->first), size);
        s.reservations.erase(it);
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                                            CUmemGenericAllocationHandle handle, unsigned long long flags) {
    return entry([&](state& s) -> CUresult {
        if (flags != 0 || size == 0) return CUDA_ERROR_INVALID_VALUE;
        mem_handle_obj* m = live_mem_handle(s, handle);
        if (m == nullptr) return CUDA_ERROR_INVALID_VALUE;
        uintptr_t base = static_cast<uintptr_t>(ptr);
        if (base % vmm_granularity != 0 || size % vmm_granularity != 0 || offset % vmm_granularity != 0)
            return CUDA_ERROR_INVALID_VALUE;
        if (offset > m->size || size > m->size - offset) return CUDA_ERROR_INVALID_VALUE;
        if (offset != 0) return CUDA_ERROR_NOT_SUPPORTED;  // as the H200's driver answers: it must be 0
        if (find_reservation(s, base, size) == s.reservations.end()) return CUDA_ERROR_INVALID_VALUE;
        // Nothing may be mapped there already.
        auto it = s.ranges.lower_bound(base);
        if (it != s.ranges.end() && it->first < base + size) return CUDA_ERROR_INVALID_VALUE;
        if (it != s.ranges.begin() && std::prev(it)->first + std::prev(it)->second.size > base)
            return CUDA_ERROR_INVALID_VALUE;
        void* p = mmap(reinterpret_cast<void*>(base), size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED,
                       m->fd, static_cast<off_t>(offset));
        if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
        mem_range r;
        r.base = base;
        r.size = size;
        r.k = range_kind::vmm;
        r.device = m->prop.location.id;
        r.mem_handle = m->handle;
        r.handle_offset = offset;
        r.access.fill(CU_MEM_ACCESS_FLAGS_PROT_NONE);
        insert_range(s, r);
        ++m->maps;
        return CUDA_SUCCESS;
    });
}

// [ptr, ptr+size) must consist of whole mappings.
VCUDA_SOFT_EXPORT CUresult CUDAAPI cuMemUnmap(CUdeviceptr ptr, size_t size) {
    return entry([&](state& s) -> CUresult {
        uintptr_t base = static_cast<uintptr_t>(ptr), end = 0;
        if (size == 0 || add_overflows(base, size, &end)) return CUDA_ERROR_INVALID_VALUE;
        std::vector<uintptr_t> whole;
        uintptr_t cur = base;
        while (cur < end) {
            auto it = s.ranges.find(cur);
            if (it == s.ranges.end() || it->second.k != range_kind::vmm || it->second.size > end - cur)
                return CUDA_ERROR_INVALID_VALUE;
            whole.push_back(cur);
            cur += it->second.size;
        }
        for (uintptr_t b : whole) free_range(s, b);
        return CUDA_SUCCESS;
    });
}

// The mapping is readable and writable from the start; access is recorded so that copies into memory a GPU
// could not reach fail as they would there.
VCUDA_SOFT_EXPORT CUresult CUDAAPI cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc,
                                                  size_t count) {
    return entry([&](state& s) -> CUresult {
        uintptr_t base = static_cast<uintptr_t>(ptr), end = 0;
        if (desc == nullptr || count == 0 || size == 0 || add_overflows(base, size, &end))
            return CUDA_ERROR_INVALID_VALUE;
        for (size_t i = 0; i < count; ++i) {
            if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
            if (!s.valid_device(desc[i].location.id)) return CUDA_ERROR_INVALID_DEVICE;
            CUmemAccess_flags f = desc[i].flags;
            if (f != CU_MEM_ACCESS_FLAGS_PROT_NONE && f != CU_MEM_ACCESS_FLAGS_PROT_READ &&
                f != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
                return CUDA_ERROR_INVALID_VALUE;
        }
        std::vector<mem_range*> covered;
        uintptr_t cur = base;
        while (cur < end) {
            mem_range* r = find_range(s, cur);
            if (r == nullptr || r->k != range_kind::vmm) return CUDA_ERROR_INVALID_VALUE;
            covered.push_back(r);
            cur = r->base + r->size;
        }
        for (mem_range* r : covered)
            for (size_t i = 0; i < count; ++i)
                r->access[static_cast<size_t>(desc[i].location.id)] = desc[i].flags;
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuMemGetAccess(unsigned long long* flags, const CUmemLocation* location,
                                                  CUdeviceptr ptr) {
    return entry([&](state& s) -> CUresult {
        if (flags == nullptr || location == nullptr || location->type != CU_MEM_LOCATION_TYPE_DEVICE)
            return CUDA_ERROR_INVALID_VALUE;
        if (!s.valid_device(location->id)) return CUDA_ERROR_INVALID_DEVICE;
        mem_range* r = find_range(s, static_cast<uintptr_t>(ptr));
        if (r == nullptr || r->k != range_kind::vmm) return CUDA_ERROR_INVALID_VALUE;
        *flags = r->access[static_cast<size_t>(location->id)];
        return CUDA_SUCCESS;
    });
}

// --- Page-locked host memory: its device pointer is the host pointer.

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuMemAllocHost_v2(void** pp, size_t bytesize) {
    return entry([&](state& s) { return host_alloc(s, pp, bytesize, 0); });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuMemHostAlloc(void** pp, size_t bytesize, unsigned int Flags) {
    return entry([&](state& s) { return host_alloc(s, pp, bytesize, Flags); });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuMemFreeHost(void* p) {
    return entry([&](state& s) -> CUresult {
        auto it = s.ranges.find(reinterpret_cast<uintptr_t>(p));
        if (p == nullptr || it == s.ranges.end() || it->second.k != range_kind::host_alloc)
            return CUDA_ERROR_INVALID_VALUE;
        free_range(s, it->first);
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuMemHostRegister_v2(void* p, size_t bytesize, unsigned int Flags) {
    return entry([&](state& s) -> CUresult {
        if (p == nullptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
        if ((Flags & ~(CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP |
                       CU_MEMHOSTREGISTER_IOMEMORY | CU_MEMHOSTREGISTER_READ_ONLY)) != 0)
            return CUDA_ERROR_INVALID_VALUE;
        context_obj* c = nullptr;
        if (CUresult r = require_context(s, c); r != CUDA_SUCCESS) return r;
        if (CUresult r = check_unsafe_call(s); r != CUDA_SUCCESS) return r;  // as measured on the H200
        uintptr_t base = reinterpret_cast<uintptr_t>(p), end = 0;
        if (add_overflows(base, bytesize, &end)) return CUDA_ERROR_INVALID_VALUE;
        auto it = s.ranges.lower_bound(base);
        if ((it != s.ranges.end() && it->first < end) ||
            (it != s.ranges.begin() && std::prev(it)->first + std::prev(it)->second.size > base))
            return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
        if (!host_range_mapped(base, bytesize)) return CUDA_ERROR_INVALID_VALUE;
        mem_range r;
        r.base = base;
        r.size = bytesize;
        r.k = range_kind::host_registered;
        r.device = c->device;
        r.ctx = c->handle;
        r.flags = Flags;
        insert_range(s, r);
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuMemHostUnregister(void* p) {
    return entry([&](state& s) -> CUresult {
        auto it = s.ranges.find(reinterpret_cast<uintptr_t>(p));
        if (p == nullptr || it == s.ranges.end() || it->second.k != range_kind::host_registered)
            return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
        s.ranges.erase(it);
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuMemHostGetDevicePointer_v2(CUdeviceptr* pdptr, void* p,
                                                                unsigned int Flags) {
    return entry([&](state& s) -> CUresult {
        if (pdptr == nullptr || Flags != 0) return CUDA_ERROR_INVALID_VALUE;
        context_obj* c = nullptr;
        if (CUresult r = require_context(s, c); r != CUDA_SUCCESS) return r;
        mem_range* r = find_range(s, reinterpret_cast<uintptr_t>(p));
        if (r == nullptr || (r->k != range_kind::host_alloc && r->k != range_kind::host_registered))
            return CUDA_ERROR_INVALID_VALUE;
        *pdptr = static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(p));
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuMemHostGetFlags(unsigned int* pFlags, void* p) {
    return entry([&](state& s) -> CUresult {
        if (pFlags == nullptr) return CUDA_ERROR_INVALID_VALUE;
        mem_range* r = find_range(s, reinterpret_cast<uintptr_t>(p));
        if (r == nullptr || r->k != range_kind::host_alloc) return CUDA_ERROR_INVALID_VALUE;
        *pFlags = r->flags;
        return CUDA_SUCCESS;
    });
}

// --- Pointer attributes.

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuPointerGetAttribute(void* data, CUpointer_attribute attribute,
                                                         CUdeviceptr ptr) {
    return entry([&](state& s) { return pointer_attribute(s, data, attribute, ptr); });
}

// Unlike the single form, an unknown pointer is not an error: every attribute reads as zero (NULL context,
// memory type 0, device ordinal -2).
VCUDA_SOFT_EXPORT CUresult CUDAAPI cuPointerGetAttributes(unsigned int numAttributes,
                                                          CUpointer_attribute* attributes, void** data,
                                                          CUdeviceptr ptr) {
    return entry([&](state& s) -> CUresult {
        if (numAttributes == 0 || attributes == nullptr || data == nullptr) return CUDA_ERROR_INVALID_VALUE;
        const bool known = find_range(s, static_cast<uintptr_t>(ptr)) != nullptr;
        for (unsigned i = 0; i < numAttributes; ++i) {
            if (data[i] == nullptr) return CUDA_ERROR_INVALID_VALUE;
            size_t size = pointer_attribute_size(attributes[i]);
            if (size == 0) return CUDA_ERROR_INVALID_VALUE;
            if (attributes[i] < CU_POINTER_ATTRIBUTE_CONTEXT ||
                attributes[i] > CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE)
                return CUDA_ERROR_INVALID_VALUE;
            if (known && pointer_attribute(s, data[i], attributes[i], ptr) == CUDA_SUCCESS) continue;
            std::memset(data[i], 0, size);
            if (attributes[i] == CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL) put(data[i], -2);
        }
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuPointerSetAttribute(const void* value, CUpointer_attribute attribute,
                                                         CUdeviceptr ptr) {
    return entry([&](state& s) -> CUresult {
        if (value == nullptr || attribute != CU_POINTER_ATTRIBUTE_SYNC_MEMOPS)
            return CUDA_ERROR_INVALID_VALUE;
        mem_range* r = find_range(s, static_cast<uintptr_t>(ptr));
        if (r == nullptr) return CUDA_ERROR_INVALID_VALUE;
        unsigned v = 0;
        std::memcpy(&v, value, sizeof v);
        r->sync_memops = v != 0;
        return CUDA_SUCCESS;
    });
}

// Pools shared between processes, emulated in one: a pool's descriptor is a memfd that holds its handle; an
// import is a pool object of its own that names it; an allocation's export data holds its address, which the
// importer uses as it is (one address space). The importer's free ends its import, not the memory.
VCUDA_SOFT_EXPORT CUresult CUDAAPI cuMemPoolExportToShareableHandle(void* handle_out, CUmemoryPool pool,
                                                                    CUmemAllocationHandleType handleType,
                                                                    unsigned long long flags) {
    return entry([&](state& s) -> CUresult {
        auto* p = s.find<pool_obj>(pool);
        if (handle_out == nullptr || p == nullptr || flags != 0 ||
            handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || !p->shareable || p->imported_from != 0)
            return CUDA_ERROR_INVALID_VALUE;
        int fd = memfd_create("vcuda-soft-pool", 0);
        if (fd < 0) return CUDA_ERROR_OPERATING_SYSTEM;
        const uint64_t h = p->handle;
        if (pwrite(fd, &h, sizeof h, 0) != static_cast<ssize_t>(sizeof h)) {
            close(fd);
            return CUDA_ERROR_OPERATING_SYSTEM;
        }
        *static_cast<int*>(handle_out) = fd;
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuMemPoolImportFromShareableHandle(CUmemoryPool* pool_out, void* handle,
                                                                      CUmemAllocationHandleType handleType,
                                                                      unsigned long long flags) {
    return entry([&](state& s) -> CUresult {
        if (pool_out == nullptr || flags != 0 || handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
            return CUDA_ERROR_INVALID_VALUE;
        uint64_t h = 0;
        const int fd = static_cast<int>(reinterpret_cast<intptr_t>(handle));
        if (pread(fd, &h, sizeof h, 0) != static_cast<ssize_t>(sizeof h)) return CUDA_ERROR_INVALID_VALUE;
        auto* from = s.find<pool_obj>(h);
        if (from == nullptr || !from->shareable) return CUDA_ERROR_INVALID_VALUE;
        const int device = from->device;
        pool_obj* p = s.create<pool_obj>();
        p->device = device;
        p->imported_from = h;
        *pool_out = to_handle<CUmemoryPool>(p->handle);
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuMemPoolExportPointer(CUmemPoolPtrExportData* shareData_out,
                                                          CUdeviceptr ptr) {
    return entry([&](state& s) -> CUresult {
        auto it = s.ranges.find(static_cast<uintptr_t>(ptr));
        if (shareData_out == nullptr || it == s.ranges.end() || it->second.pool == 0)
            return CUDA_ERROR_INVALID_VALUE;
        auto* p = s.find<pool_obj>(it->second.pool);
        if (p == nullptr || !p->shareable) return CUDA_ERROR_INVALID_VALUE;
        *shareData_out = {};
        const uint64_t at = ptr;
        std::memcpy(shareData_out->reserved, &at, sizeof at);
        return CUDA_SUCCESS;
    });
}

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuMemPoolImportPointer(CUdeviceptr* ptr_out, CUmemoryPool pool,
                                                          CUmemPoolPtrExportData* shareData) {
    return entry([&](state& s) -> CUresult {
        auto* p = s.find<pool_obj>(pool);
        if (ptr_out == nullptr || shareData == nullptr || p == nullptr || p->imported_from == 0)
            return CUDA_ERROR_INVALID_VALUE;
        uint64_t at = 0;
        std::memcpy(&at, shareData->reserved, sizeof at);
        auto it = s.ranges.find(static_cast<uintptr_t>(at));
        if (it == s.ranges.end() || it->second.pool != p->imported_from) return CUDA_ERROR_INVALID_VALUE;
        ++it->second.imports;
        *ptr_out = at;
        return CUDA_SUCCESS;
    });
}
