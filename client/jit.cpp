#include "client/jit.hpp"

#include <algorithm>
#include <cstring>

#include "common/jit_options.hpp"
#include "common/log.hpp"

namespace vcuda::client {

CUresult jit_call::take(unsigned n, CUjit_option* o, void** v, const char* caller) {
    words.clear();
    count = 0;
    if (n == 0) return CUDA_SUCCESS;
    if (!o || !v || n > jit::max_options) return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < n; ++i) {
        if (jit::role_of(o[i]) == jit::role::refused) {
            VCUDA_LOG_WARN(
                "{}: JIT option {} is not supported by vcuda (it names arrays in the caller's memory, or is "
                "unknown): CUDA_ERROR_NOT_SUPPORTED",
                caller, static_cast<int>(o[i]));
            return CUDA_ERROR_NOT_SUPPORTED;
        }
        words.push_back(static_cast<uint64_t>(o[i]));
        words.push_back(jit::role_of(o[i]) == jit::role::log_buffer ? 0 : reinterpret_cast<uintptr_t>(v[i]));
    }
    count = n;
    options = o;
    values = v;
    return CUDA_SUCCESS;
}

bool jit_call::answer(const call_reply& rp, size_t first) const {
    if (count == 0) return true;
    if (rp.outs.size() < first + count || rp.blobs.size() < 2) return false;
    // Log buffers first: their sizes are the caller's size options as given, before they are written back.
    for (unsigned i = 0; i < count; ++i) {
        if (jit::role_of(options[i]) != jit::role::log_buffer || !values[i]) continue;
        uint64_t cap = 0;
        for (unsigned j = 0; j < count; ++j)
            if (options[j] == static_cast<CUjit_option>(jit::size_option_of(options[i])))
                cap = words[2 * j + 1];
        if (cap == 0) continue;
        const auto& log = rp.blobs[options[i] == CU_JIT_INFO_LOG_BUFFER ? 0 : 1];
        size_t n = std::min<size_t>(log.size(), cap - 1);
        std::memcpy(values[i], log.data(), n);
        static_cast<char*>(values[i])[n] = '\0';
    }
    for (unsigned i = 0; i < count; ++i)
        if (jit::written_back(options[i]))
            values[i] = reinterpret_cast<void*>(static_cast<uintptr_t>(rp.outs[first + i]));
    return true;
}

}  // namespace vcuda::client
