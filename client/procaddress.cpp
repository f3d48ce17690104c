#include "client/procaddress.hpp"

#include <algorithm>
#include <cstring>

namespace vcuda::client {

int get_proc_address(const char* symbol, void** pfn, int cuda_version, uint64_t flags, int* status) {
    constexpr int success = 0, invalid_value = 1;
    constexpr int found = 0, symbol_not_found = 1, version_not_sufficient = 2;
    if (!symbol || !pfn) return invalid_value;
    if (cuda_version > driver_version) return invalid_value;  // *pfn left alone, as the driver does
    auto set_status = [&](int s) {
        if (status) *status = s;
    };
    const proc_entry* end = proc_table + proc_table_size;
    const proc_entry* e = std::lower_bound(proc_table, end, symbol, [](const proc_entry& a, const char* s) {
        return std::strcmp(a.name, s) < 0;
    });
    if (e == end || std::strcmp(e->name, symbol) != 0) {
        *pfn = nullptr;
        set_status(symbol_not_found);
        return success;
    }
    const bool ptds = (flags & 2) && e->ptds;  // CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
    const proc_version* v = ptds ? e->ptds : e->versions;
    size_t n = ptds ? e->ptds_count : e->count;
    void* best = nullptr;
    for (size_t i = 0; i < n; ++i)
        if (v[i].version <= cuda_version) best = v[i].fn;
    *pfn = best;
    set_status(best ? found : version_not_sufficient);
    return success;
}

}  // namespace vcuda::client
