// Switches of the environment that are on unless set to "0" (VCUDA_SHARED_HOST, VCUDA_DEFER_COPIES,
// VCUDA_SHM): README, "Configuration (client side)".
#pragma once

#include <cstdlib>
#include <cstring>

namespace vcuda::client {

inline bool env_switch_on(const char* name) {
    const char* v = std::getenv(name);
    return !v || std::strcmp(v, "0") != 0;
}

}  // namespace vcuda::client
