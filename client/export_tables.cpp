// cuGetExportTable: the private tables every copy of cudart asks the driver for
// (../shared/reference/driver-interface.md §2), and vcuda's own table for its libnvidia-ml.so.1
// (client/private_table.hpp). Tables live at fixed addresses for the life of the process.
#include <pthread.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "client/integrity.hpp"
#include "client/private_table.hpp"
#include "client/procaddress.hpp"
#include "client/state.hpp"
#include "client/trace.hpp"
#include "common/log.hpp"

namespace vcuda::client {
namespace {

using slot = void*;

struct table_id {
    uint8_t bytes[16];
    bool operator==(const CUuuid& u) const { return std::memcmp(bytes, u.bytes, 16) == 0; }
};

constexpr table_id id_unknown_first = {
    {0xf8, 0xcf, 0xf9, 0x51, 0x21, 0x46, 0x8b, 0x4e, 0xb9, 0xe2, 0xfb, 0x46, 0x9e, 0x7c, 0x0d, 0xd9}};
constexpr table_id id_cudart = {
    {0x6b, 0xd5, 0xfb, 0x6c, 0x5b, 0xf4, 0xe7, 0x4a, 0x89, 0x87, 0xd9, 0x39, 0x12, 0xfd, 0x9d, 0xf9}};
constexpr table_id id_callbacks = {
    {0xa0, 0x94, 0x79, 0x8c, 0x2e, 0x74, 0x2e, 0x74, 0x93, 0xf2, 0x08, 0x00, 0x20, 0x0c, 0x0a, 0x66}};
constexpr table_id id_tools_tls = {
    {0x42, 0xd8, 0x5a, 0x81, 0x23, 0xf6, 0xcb, 0x47, 0x82, 0x98, 0xf6, 0xe7, 0x8a, 0x3a, 0xec, 0xdc}};
constexpr table_id id_cls = {
    {0xc6, 0x93, 0x33, 0x6e, 0x11, 0x21, 0xdf, 0x11, 0xa8, 0xc3, 0x68, 0xf3, 0x55, 0xd8, 0x95, 0x93}};
constexpr table_id id_ctx_checks = {
    {0x26, 0x3e, 0x88, 0x60, 0x7c, 0xd2, 0x61, 0x43, 0x92, 0xf6, 0xbb, 0xd5, 0x00, 0x6d, 0xfa, 0x7e}};
constexpr table_id id_integrity = {
    {0xd4, 0x08, 0x20, 0x55, 0xbd, 0xe6, 0x70, 0x4b, 0x8d, 0x34, 0xba, 0x12, 0x3c, 0x66, 0xe1, 0xf2}};
constexpr table_id id_tools_context = {
    {0x21, 0x31, 0x8c, 0x60, 0x97, 0x14, 0x32, 0x48, 0x8c, 0xa6, 0x41, 0xff, 0x73, 0x24, 0xc8, 0xf2}};
constexpr table_id id_cublaslt = {
    {0x17, 0x34, 0xdc, 0x26, 0x80, 0x0d, 0x47, 0x45, 0x87, 0x26, 0xc0, 0xf1, 0xe7, 0xdd, 0x8b, 0xca}};
constexpr table_id id_cufft = {
    {0x6e, 0x16, 0x3f, 0xbe, 0xb9, 0x58, 0x44, 0x4d, 0x83, 0x5c, 0xe1, 0x82, 0xaf, 0xf1, 0x99, 0x1e}};

// A slot whose meaning is not known: says so in the log, once per slot, and refuses.
template <int Table, int Slot>
CUresult unknown_slot() {
    static bool said = false;
    if (!said) {
        said = true;
        VCUDA_LOG_WARN(
            "export table {:04x}… slot {} called: not implemented, answering CUDA_ERROR_NOT_SUPPORTED", Table,
            Slot);
    }
    return CUDA_ERROR_NOT_SUPPORTED;
}

template <int Table, size_t... I>
constexpr std::array<slot, sizeof...(I)> unknown_slots(std::index_sequence<I...>) {
    return {reinterpret_cast<slot>(&unknown_slot<Table, static_cast<int>(I)>)...};
}

// A table of N words: word 0 holds the size in bytes, the other words are entry points.
template <int Table, size_t N>
struct sized_table {
    std::array<slot, N> words = unknown_slots<Table>(std::make_index_sequence<N>());
    sized_table() { words[0] = reinterpret_cast<slot>(N * sizeof(slot)); }
};

// ---- 6bd5fb6c: cudart interface. [2] gives the primary context of a device.
CUresult cudart_get_primary_context(CUcontext* out, CUdevice dev) {
    auto& st = state::get();
    if (!st.initialized()) return st.init_status();
    if (!out || dev < 0 || dev >= st.device_count()) return CUDA_ERROR_INVALID_VALUE;
    *out = reinterpret_cast<CUcontext>(st.primary_context(dev));
    return CUDA_SUCCESS;
}

// ---- a094798c: runtime callback hooks. [2] and [6] hand out zeroed static buffers. cudart reads [2]'s as
// one u32 per CUPTI runtime callback id (word 322 before cudaGraphGetNodes, say; CUDA 13.0 has 523 ids) and,
// where a word is set, calls [4] and [1] around the API call (what those do is not known: client/TRACE.md).
// The buffer must cover every id: at 1024 bytes, words past 256 were other variables of this library, and a
// set byte there made cudart call [4] and [1].
alignas(64) unsigned char hook_buffer_a[4096];
alignas(64) unsigned char hook_buffer_b[1024];
CUresult hooks_buffer_a(void** buf, size_t* size) {
    if (buf) *buf = hook_buffer_a;
    if (size) *size = sizeof hook_buffer_a;
    return CUDA_SUCCESS;
}
CUresult hooks_buffer_b(void** buf, size_t* size) {
    if (buf) *buf = hook_buffer_b;
    if (size) *size = 14 * sizeof(uint32_t);
    return CUDA_SUCCESS;
}

// ---- c693336e: context-local storage (no size word).
using cls_dtor = void (*)(CUcontext, void*, void*);

context_info* cls_context(CUcontext ctx) {
    uint64_t id = ctx ? reinterpret_cast<uint64_t>(ctx) : current_context();
    return state::get().find_context(id);
}

CUresult cls_put(CUcontext ctx, void* key, void* value, cls_dtor dtor) {
    auto& st = state::get();
    std::unique_lock lock(st.mu);
    auto* c = cls_context(ctx);
    if (!c) return CUDA_ERROR_INVALID_CONTEXT;
    c->cls[{0, reinterpret_cast<uint64_t>(key)}] = {value, dtor};
    return CUDA_SUCCESS;
}

CUresult cls_delete(CUcontext ctx, void* key) {
    auto& st = state::get();
    std::unique_lock lock(st.mu);
    auto* c = cls_context(ctx);
    if (!c) return CUDA_ERROR_INVALID_CONTEXT;
    return c->cls.erase({0, reinterpret_cast<uint64_t>(key)}) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

CUresult cls_get(void** value, CUcontext ctx, void* key) {
    auto& st = state::get();
    std::shared_lock lock(st.mu);
    auto* c = cls_context(ctx);
    if (!c) return CUDA_ERROR_INVALID_CONTEXT;
    auto it = c->cls.find({0, reinterpret_cast<uint64_t>(key)});
    if (it == c->cls.end()) return CUDA_ERROR_INVALID_HANDLE;
    if (value) *value = it->second.first;
    return CUDA_SUCCESS;
}

// ---- 263e8860: context checks. [2](ctx, u32*, void*) clears the flag; [3]() answers 0.
CUresult ctx_check_flag(CUcontext, uint32_t* flag, void*) {
    if (flag) *flag = 0;
    return CUDA_SUCCESS;
}
CUresult ctx_check_zero() { return CUDA_SUCCESS; }

// ---- 42d85a81: tools thread-local storage. [2](record*) puts the calling thread's current context in the
// record's first word (cuBLAS/cuBLASLt then ask 21318c60[4] for its number, written into the second word).
CUresult tools_current_context(CUcontext* record) {
    if (!record) return CUDA_ERROR_INVALID_VALUE;
    *record = reinterpret_cast<CUcontext>(current_context());
    return CUDA_SUCCESS;
}

// ---- 21318c60: tools context. [4](ctx, u64*) gives the context's number, the value cuCtxGetId reports;
// [39](?, ?, u64*) answers 0 and [51](?, key, void**) hands out an object, refusing key ~0 with 400
// (CUDA_ERROR_INVALID_HANDLE) as the real driver does.
CUresult tools_context_number(CUcontext ctx, unsigned long long* number) {
    if (!number) return CUDA_ERROR_INVALID_VALUE;
    auto& st = state::get();
    std::shared_lock lock(st.mu);
    auto* c = ctx ? st.find_context(reinterpret_cast<uint64_t>(ctx)) : nullptr;
    *number = c ? c->uid : 0;
    return CUDA_SUCCESS;
}
CUresult tools_context_39(void*, void* key, unsigned long long* out) {
    if (!key || !out) return CUDA_ERROR_INVALID_VALUE;
    *out = 0;
    return CUDA_SUCCESS;
}
alignas(64) unsigned char tools_object[512];
CUresult tools_context_51(void*, uint64_t key, void** out) {
    if (!out) return CUDA_ERROR_INVALID_VALUE;
    if (key == ~uint64_t{0}) return CUDA_ERROR_INVALID_HANDLE;
    *out = tools_object;
    return CUDA_SUCCESS;
}

// ---- d4082055: the integrity check.
CUresult integrity_check(unsigned version, unsigned long long secs, unsigned long long result[2]);

sized_table<0x6bd5, 13>& cudart_table() {
    static sized_table<0x6bd5, 13> t = [] {
        sized_table<0x6bd5, 13> x;
        x.words[2] = reinterpret_cast<slot>(&cudart_get_primary_context);
        return x;
    }();
    return t;
}
sized_table<0xa094, 7>& callbacks_table() {
    static sized_table<0xa094, 7> t = [] {
        sized_table<0xa094, 7> x;
        x.words[2] = reinterpret_cast<slot>(&hooks_buffer_a);
        x.words[6] = reinterpret_cast<slot>(&hooks_buffer_b);
        return x;
    }();
    return t;
}
sized_table<0x42d8, 3>& tools_tls_table() {
    static sized_table<0x42d8, 3> t = [] {
        sized_table<0x42d8, 3> x;
        x.words[2] = reinterpret_cast<slot>(&tools_current_context);
        return x;
    }();
    return t;
}
sized_table<0x2131, 93>& tools_context_table() {
    static sized_table<0x2131, 93> t = [] {
        sized_table<0x2131, 93> x;
        x.words[4] = reinterpret_cast<slot>(&tools_context_number);
        x.words[39] = reinterpret_cast<slot>(&tools_context_39);
        x.words[51] = reinterpret_cast<slot>(&tools_context_51);
        return x;
    }();
    return t;
}
// ---- 1734dc26: asked for by cuBLASLt, which crashes when the table is refused. What its slots [4] and [13]
// do is not known yet; they answer CUDA_ERROR_NOT_SUPPORTED, and cuBLASLt then goes on without them (checked
// on an H100: cublasSgemm and cublasGemmEx give the native results).
sized_table<0x1734, 17>& cublaslt_table() {
    static sized_table<0x1734, 17> t;
    return t;
}

// ---- 6e163fbe: asked for by cuFFT. [7](ctx, module, deliver, user, module, info) hands each function of a
// module cuFFT has just loaded to deliver(user, function) and answers how many it handed over. Learnt from a
// trace of the real driver (cuFFT 12.0, driver 580): cuFFT's deliver stores the function through `user`,
// cuFFT then launches it; its plan modules hold one function. The other slots were not seen in use.
uintptr_t cufft_module_functions(CUcontext, CUmodule mod, void (*deliver)(void*, CUfunction), void* user,
                                 CUmodule, const void*) {
    unsigned n = 0;
    std::vector<CUfunction> fs;
    CUresult rc = deliver ? cuModuleGetFunctionCount(&n, mod) : CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS && n) {
        fs.resize(n);
        rc = cuModuleEnumerateFunctions(fs.data(), n, mod);
    }
    if (rc != CUDA_SUCCESS) {
        VCUDA_LOG_WARN("export table 6e163fbe… slot 7: the module's functions could not be listed (error {})",
                       static_cast<int>(rc));
        return 0;
    }
    for (CUfunction f : fs) deliver(user, f);
    return n;
}
sized_table<0x6e16, 99>& cufft_table() {
    static sized_table<0x6e16, 99> t = [] {
        sized_table<0x6e16, 99> x;
        x.words[7] = reinterpret_cast<slot>(&cufft_module_functions);
        return x;
    }();
    return t;
}

std::array<slot, 3>& cls_table() {
    static std::array<slot, 3> t = {reinterpret_cast<slot>(&cls_put), reinterpret_cast<slot>(&cls_delete),
                                    reinterpret_cast<slot>(&cls_get)};
    return t;
}
sized_table<0x263e, 15>& ctx_checks_table() {
    static sized_table<0x263e, 15> t = [] {
        sized_table<0x263e, 15> x;
        x.words[2] = reinterpret_cast<slot>(&ctx_check_flag);
        x.words[3] = reinterpret_cast<slot>(&ctx_check_zero);
        return x;
    }();
    return t;
}
sized_table<0xd408, 3>& integrity_table() {
    static sized_table<0xd408, 3> t = [] {
        sized_table<0xd408, 3> x;
        x.words[1] = reinterpret_cast<slot>(&integrity_check);
        return x;
    }();
    return t;
}

template <class T>
void put_le(std::vector<uint8_t>& m, T v) {
    for (size_t i = 0; i < sizeof(T); ++i)
        m.push_back(static_cast<uint8_t>(static_cast<uint64_t>(v) >> (8 * i)));
}

CUresult integrity_check(unsigned version, unsigned long long secs, unsigned long long result[2]) {
    if (!result) return CUDA_ERROR_INVALID_VALUE;
    switch (version % 10) {
        case 0:
            result[0] = 0x3341181C03CB675CULL;
            result[1] = 0x8ED383AA1F4CD1E8ULL;
            return CUDA_SUCCESS;
        case 1:
            result[0] = 0x1841181C03CB675CULL;
            result[1] = 0x8ED383AA1F4CD1E8ULL;
            return CUDA_SUCCESS;
        default:
            break;
    }
    static constexpr uint8_t key[16] = {0x14, 0x6A, 0xDD, 0xAE, 0x53, 0xA9, 0xA7, 0x52,
                                        0xAA, 0x08, 0x41, 0x36, 0x0B, 0xF5, 0x5A, 0x9F};
    std::vector<uint8_t> m;
    put_le<uint32_t>(m, driver_version);
    put_le<uint32_t>(m, version);
    put_le<uint32_t>(m, static_cast<uint32_t>(getpid()));
    put_le<uint32_t>(m, static_cast<uint32_t>(pthread_self()));
    put_le<uint64_t>(m, reinterpret_cast<uint64_t>(cudart_table().words.data()));
    put_le<uint64_t>(m, reinterpret_cast<uint64_t>(integrity_table().words.data()));
    put_le<uint64_t>(m, reinterpret_cast<uint64_t>(integrity_table().words[1]));
    put_le<uint64_t>(m, secs);
    auto& st = state::get();
    if (st.initialized()) {
        for (int d = 0; d < st.device_count(); ++d) {
            auto& dev = st.device(d);
            m.insert(m.end(), dev.uuid.begin(), dev.uuid.end());
            put_le<int32_t>(m, st.attribute(d, CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID));
            put_le<int32_t>(m, st.attribute(d, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID));
            put_le<int32_t>(m, st.attribute(d, CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID));
        }
    }
    auto digest = hmac_md2(std::span<const uint8_t, 16>(key, 16), m);
    std::memcpy(result, digest.data(), 16);
    return CUDA_SUCCESS;
}

}  // namespace
}  // namespace vcuda::client

using namespace vcuda::client;

extern "C" __attribute__((visibility("default"))) CUresult cuGetExportTable(const void** table,
                                                                            const CUuuid* id) noexcept {
    VCUDA_TRACE_HOOK(cuGetExportTable, table, id);
    if (!table || !id) return CUDA_ERROR_INVALID_VALUE;
    if (id_cudart == *id)
        *table = cudart_table().words.data();
    else if (id_callbacks == *id)
        *table = callbacks_table().words.data();
    else if (id_tools_tls == *id)
        *table = tools_tls_table().words.data();
    else if (id_cls == *id)
        *table = cls_table().data();
    else if (id_ctx_checks == *id)
        *table = ctx_checks_table().words.data();
    else if (id_integrity == *id)
        *table = integrity_table().words.data();
    else if (id_tools_context == *id)
        *table = tools_context_table().words.data();
    else if (id_cublaslt == *id)
        *table = cublaslt_table().words.data();
    else if (id_cufft == *id)
        *table = cufft_table().words.data();
    else if (std::memcmp(id->bytes, vcuda::vcuda_private_table_id, 16) == 0)
        *table = &the_private_table();
    else {
        char hex[33];
        for (size_t i = 0; i < 16; ++i)
            std::snprintf(hex + 2 * i, 3, "%02x", static_cast<unsigned char>(id->bytes[i]));
        if (!(id_unknown_first == *id)) VCUDA_LOG_DEBUG("cuGetExportTable: unknown table {} refused", hex);
        return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}
