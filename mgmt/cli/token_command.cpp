#include "mgmt/cli/token_command.hpp"

#include <chrono>
#include <cstdio>

#include "mgmt/token.hpp"
#include "mgmt/wire/units.hpp"

namespace vcuda::cli {

int create_token(const std::string& secret_file, const std::string& ttl, const std::string& memory) {
    auto secret = mgmt::read_secret_file(secret_file);
    if (!secret) {
        std::fprintf(stderr, "vcuda token create: %s\n", secret.error().c_str());
        return 2;
    }
    // Durations as elsewhere ("90s", "12h"), and days, which tokens are usually counted in.
    std::optional<std::chrono::milliseconds> life;
    if (!ttl.empty() && ttl.back() == 'd') {
        if (auto days = mgmt::parse_duration(ttl.substr(0, ttl.size() - 1)))
            life = *days * 86400;  // seconds -> days
    } else {
        life = mgmt::parse_duration(ttl);
    }
    if (!life || life->count() <= 0) {
        std::fprintf(stderr, "vcuda token create: --ttl '%s' is not a duration; write e.g. 12h or 30d\n",
                     ttl.c_str());
        return 2;
    }
    uint64_t quota = 0;
    if (!memory.empty()) {
        auto bytes = mgmt::parse_size(memory);
        if (!bytes || *bytes == 0) {
            std::fprintf(stderr, "vcuda token create: --memory '%s' is not a size; write e.g. 8G or 512M\n",
                         memory.c_str());
            return 2;
        }
        quota = *bytes;
    }
    mgmt::token_claims c;
    c.gpu_uuid = std::string(mgmt::any_gpu);
    c.memory_quota = quota;
    c.expires_at = std::chrono::system_clock::now() + *life;
    std::printf("%s\n", mgmt::sign_token(*secret, c).c_str());
    return 0;
}

}  // namespace vcuda::cli
