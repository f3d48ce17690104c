// cuGetProcAddress answers, generated from the real driver's table (protocol/procaddress-driver580.tsv).
#pragma once

#include <cstddef>
#include <cstdint>

namespace vcuda::client {

struct proc_version {
    int version;  // from this CUDA version (1000*major + 10*minor) on ...
    void* fn;     // ... the driver returns this entry point
};

struct proc_entry {
    const char* name;
    const proc_version* versions;
    size_t count;
    const proc_version* ptds;  // answers for CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, when they differ
    size_t ptds_count;
};

extern const proc_entry proc_table[];  // sorted by name
extern const size_t proc_table_size;

// The driver version vcuda reports (cuDriverGetVersion) and answers cuGetProcAddress for.
inline constexpr int driver_version = 13000;

// cuGetProcAddress_v2 semantics; `status` may be null.
int get_proc_address(const char* symbol, void** pfn, int cuda_version, uint64_t flags, int* status);

}  // namespace vcuda::client
