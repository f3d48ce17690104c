#include "client/unsupported.hpp"

#include <mutex>
#include <string>
#include <unordered_set>

#include "common/log.hpp"

namespace vcuda::client {

int unsupported(const char* name) noexcept {
    static std::mutex mu;
    try {
        static auto* seen = new std::unordered_set<std::string>();  // inside the try: noexcept
        std::lock_guard lock(mu);
        if (seen->insert(name).second)
            VCUDA_LOG_WARN("{} is not supported by vcuda yet: it returns CUDA_ERROR_NOT_SUPPORTED", name);
    } catch (...) {
    }
    return 801;  // CUDA_ERROR_NOT_SUPPORTED
}

}  // namespace vcuda::client
