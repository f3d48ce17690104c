#include "client/unsupported.hpp"

#include <mutex>
#include <string>
#include <unordered_set>

#include "common/log.hpp"

namespace vcuda::client {

namespace {
// True the first time `what` is seen.
bool first_time(const char* what) noexcept {
    static std::mutex mu;
    try {
        static auto* seen = new std::unordered_set<std::string>();  // inside the try: noexcept
        std::lock_guard lock(mu);
        return seen->insert(what).second;
    } catch (...) {
        return false;
    }
}
}  // namespace

int unsupported(const char* name) noexcept {
    try {
        if (first_time(name))
            VCUDA_LOG_WARN("{} is not supported by vcuda yet: it returns CUDA_ERROR_NOT_SUPPORTED", name);
    } catch (...) {
    }
    return 801;  // CUDA_ERROR_NOT_SUPPORTED
}

int refused(const char* what, int result, const char* name) noexcept {
    try {
        if (first_time(what)) VCUDA_LOG_WARN("{}: vcuda answers {}", what, name);
    } catch (...) {
    }
    return result;
}

}  // namespace vcuda::client
