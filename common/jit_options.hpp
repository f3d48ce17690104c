// JIT options on the wire (cuModuleLoadDataEx, cuLibraryLoadData, cuLinkCreate/AddData): one blob of
// (option, value) pairs, two little-endian 64-bit words each. Log buffers are host memory of the caller, so
// they travel as nothing: the server compiles into buffers of its own, as large as the caller's size options
// say, and sends the logs back. Options whose values point at more host memory are refused.
#pragma once

// Client and server see every versioned name of cuda.h (their own headers set this up the same way).
#ifndef __CUDA_API_VERSION_INTERNAL
#define __CUDA_API_VERSION_INTERNAL 1
#endif
#include <cuda.h>

#include <cstddef>
#include <cstdint>

namespace vcuda::jit {

inline constexpr size_t max_options = 64;
inline constexpr size_t max_log = size_t{1} << 20;  // the most log bytes the server keeps per buffer

enum class role {
    value,       // an integer (or a float the driver writes back) carried in the value word
    log_buffer,  // CU_JIT_INFO_LOG_BUFFER / CU_JIT_ERROR_LOG_BUFFER: the server's own buffer stands in
    refused,     // points at arrays of names or addresses in the caller's memory, or unknown
};

constexpr role role_of(uint64_t option) {
    switch (option) {
        case CU_JIT_INFO_LOG_BUFFER:
        case CU_JIT_ERROR_LOG_BUFFER:
            return role::log_buffer;
        case CU_JIT_GLOBAL_SYMBOL_NAMES:
        case CU_JIT_GLOBAL_SYMBOL_ADDRESSES:
        case CU_JIT_GLOBAL_SYMBOL_COUNT:
        case CU_JIT_REFERENCED_KERNEL_NAMES:
        case CU_JIT_REFERENCED_KERNEL_COUNT:
        case CU_JIT_REFERENCED_VARIABLE_NAMES:
        case CU_JIT_REFERENCED_VARIABLE_COUNT:
            return role::refused;
        default:
            return option < CU_JIT_NUM_OPTIONS ? role::value : role::refused;
    }
}

// The size option that goes with a log buffer option.
constexpr uint64_t size_option_of(uint64_t log_buffer) {
    return log_buffer == CU_JIT_INFO_LOG_BUFFER ? CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES
                                                : CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES;
}

// Options whose value word the driver writes (log sizes filled, wall time, threads per block).
constexpr bool written_back(uint64_t option) {
    return option == CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES || option == CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES ||
           option == CU_JIT_WALL_TIME || option == CU_JIT_THREADS_PER_BLOCK;
}

}  // namespace vcuda::jit
