// Shared helpers of the test programs: the PASS/FAIL protocol, error checks and a deterministic generator.
//
// Every program prints deterministic lines and ends with `PASS <name>` (exit 0) or `FAIL <name>: reason`
// (exit 1). Lines whose content legitimately differs between runs (timings, addresses, free memory) start
// with `info:`; the comparisons (native vs vcuda) drop them. PROGRAM_NAME comes from the build
// (-DPROGRAM_NAME=vector_add), so one source can be built as two programs (vector_add, vector_add_shared).
#pragma once

#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#ifndef PROGRAM_NAME
#error "build with -DPROGRAM_NAME=<name>"
#endif
#define VCUDA_STR2(x) #x
#define VCUDA_STR(x) VCUDA_STR2(x)
static const char* const program_name = VCUDA_STR(PROGRAM_NAME);

[[noreturn]] static inline void fail(const char* fmt, ...) {
    fflush(stdout);
    printf("FAIL %s: ", program_name);
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
    exit(1);
}

static inline int pass() {
    printf("PASS %s\n", program_name);
    fflush(stdout);
    return 0;
}

#ifdef __CUDA_RUNTIME_H__
// A runtime call that must succeed.
#define CHECK(call)                                                                                     \
    do {                                                                                                \
        cudaError_t e_ = (call);                                                                        \
        if (e_ != cudaSuccess)                                                                          \
            fail("%s returned %s (%s) at line %d", #call, cudaGetErrorName(e_), cudaGetErrorString(e_), \
                 __LINE__);                                                                             \
    } while (0)

// After a <<<>>> launch: the launch itself must have been accepted.
#define CHECK_LAUNCH() CHECK(cudaGetLastError())

// Through vcuda: how many synchronous round trips this process has made so far, read from vcuda's private
// export table (client/private_table.hpp, slot 3) whose id the scripts pass as VCUDA_PRIVATE_TABLE_ID.
// False natively (no id, or the real driver refusing it).
static inline bool vcuda_round_trips(unsigned long long* n) {
    const char* hex = getenv("VCUDA_PRIVATE_TABLE_ID");
    if (!hex || !*hex) return false;
    unsigned char id[16];
    for (int i = 0; i < 16; ++i) {
        unsigned v = 0;
        if (sscanf(hex + 2 * i, "%2x", &v) != 1) return false;
        id[i] = static_cast<unsigned char>(v);
    }
    void* get = nullptr;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuGetExportTable", &get, 12000, cudaEnableDefault, &q) !=
            cudaSuccess ||
        !get)
        return false;
    const void* table = nullptr;
    if (reinterpret_cast<int (*)(const void**, const void*)>(get)(&table, id) != 0 || !table) return false;
    auto words = static_cast<void* const*>(table);
    if (*static_cast<const size_t*>(table) < 4 * sizeof(void*)) return false;
    unsigned long long posted = 0;
    return reinterpret_cast<int (*)(unsigned long long*, unsigned long long*)>(words[3])(n, &posted) == 0;
}
#endif

#define EXPECT(cond, ...)               \
    do {                                \
        if (!(cond)) fail(__VA_ARGS__); \
    } while (0)

// splitmix64: the same sequence on every machine, so native and vcuda runs see the same inputs.
struct rng {
    uint64_t s;
    explicit rng(uint64_t seed) : s(seed) {}
    uint64_t next() {
        uint64_t z = (s += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    }
    uint32_t u32() { return static_cast<uint32_t>(next() >> 32); }
    // uniform in [0, 1) with 24 significant bits: exact as a float
    float unit() { return static_cast<float>(u32() >> 8) * (1.0f / 16777216.0f); }
};

// FNV-1a over bytes: a compact, deterministic digest to print.
static inline uint64_t fnv1a(const void* p, size_t n, uint64_t h = 0xcbf29ce484222325ull) {
    const unsigned char* b = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) {
        h ^= b[i];
        h *= 0x100000001b3ull;
    }
    return h;
}
