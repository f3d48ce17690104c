// The software test driver: cuGetProcAddress_v2. Answers as the real driver 580 does (the table is generated
// at build time from protocol/procaddress-driver580.tsv), resolving the symbol the table names among the ones
// this library exports (dlsym on its own handle). A name the table knows but this library does not implement
// answers SYMBOL_NOT_FOUND. The per-thread-default-stream variants (_ptsz/_ptds) are not exported: with flags
// CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM the default-stream symbol is returned instead, which is the
// same thing here since all work is synchronous.
#include <dlfcn.h>

#include <algorithm>
#include <cstring>
#include <mutex>

#include "soft_state.hpp"

namespace vcuda::soft {
namespace {

struct version_symbol {
    int version;
    const char* symbol;
};
struct proc_entry {
    const char* name;
    unsigned short first, count;            // default stream
    unsigned short ptds_first, ptds_count;  // per-thread default stream, where it differs
};

#include "soft_procaddress_table.inc"

void* self_handle() {
    static void* handle = [] {
        Dl_info info{};
        void* h = nullptr;
        if (dladdr(reinterpret_cast<void*>(&self_handle), &info) != 0 && info.dli_fname != nullptr)
            h = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
        return h;
    }();
    return handle;
}

const proc_entry* find_entry(const char* name) {
    auto it = std::lower_bound(std::begin(proc_entries), std::end(proc_entries), name,
                               [](const proc_entry& e, const char* n) { return std::strcmp(e.name, n) < 0; });
    return it != std::end(proc_entries) && std::strcmp(it->name, name) == 0 ? &*it : nullptr;
}

// The symbol in force at cudaVersion among count breakpoints, or nullptr below the first.
const char* pick(unsigned first, unsigned count, int cuda_version) {
    const char* symbol = nullptr;
    for (unsigned i = first; i < first + count; ++i)
        if (proc_versions[i].version <= cuda_version) symbol = proc_versions[i].symbol;
    return symbol;
}

}  // namespace
}  // namespace vcuda::soft

using namespace vcuda::soft;

VCUDA_SOFT_EXPORT CUresult CUDAAPI cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion,
                                                       cuuint64_t flags,
                                                       CUdriverProcAddressQueryResult* symbolStatus) {
    return guarded([&]() -> CUresult {
        if (symbol == nullptr || pfn == nullptr) return CUDA_ERROR_INVALID_VALUE;
        if ((flags & ~cuuint64_t{CU_GET_PROC_ADDRESS_LEGACY_STREAM |
                                 CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM}) != 0)
            return CUDA_ERROR_INVALID_VALUE;
        if (cudaVersion > driver_version) return CUDA_ERROR_INVALID_VALUE;  // leaves *pfn alone
        auto answer = [&](void* fn, CUdriverProcAddressQueryResult status) {
            *pfn = fn;
            if (symbolStatus != nullptr) *symbolStatus = status;
            return CUDA_SUCCESS;
        };
        const proc_entry* e = find_entry(symbol);
        if (e == nullptr) return answer(nullptr, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
        const char* name = pick(e->first, e->count, cudaVersion);
        if (name == nullptr) return answer(nullptr, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
        void* self = self_handle();
        void* fn = self != nullptr ? dlsym(self, name) : nullptr;
        if ((flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0 && e->ptds_count != 0 &&
            self != nullptr)
            if (const char* ptds = pick(e->ptds_first, e->ptds_count, cudaVersion))
                if (void* p = dlsym(self, ptds)) fn = p;
        return answer(fn, fn != nullptr ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    });
}
