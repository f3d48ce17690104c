#include "mgmt/wire/lease.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iterator>

#include "common/log.hpp"
#include "mgmt/wire/codec.hpp"
#include "mgmt/wire/rpc.hpp"
#include "mgmt/wire/units.hpp"

namespace vcuda::mgmt {

namespace {

std::string env(const char* name) {
    const char* v = std::getenv(name);
    return v ? std::string(v) : std::string();
}

bool truthy(const std::string& v) { return v == "1" || v == "true" || v == "yes" || v == "on"; }

std::string describe_for_client(const rpc_error& e, const endpoint& manager, const char* what) {
    if (e.kind == rpc_errc::remote)
        return std::string(what) + " refused by the manager at " + manager.to_string() + ": " + e.message;
    return describe(e, manager);
}

std::string resolve(std::optional<std::string>& credential) {
    if (!credential) credential = credential_from_env();
    return *credential;
}

// The manager refused the caller (no credential, revoked, not the lease's owner): retrying cannot help.
bool refused_caller(const rpc_error& e) {
    return e.kind == rpc_errc::remote && (e.code == "unauthenticated" || e.code == "forbidden");
}

}  // namespace

result<std::string, std::string> read_credential_file(const std::string& path) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0)
        return unexpected{"cannot read the credential file " + path +
                          ": it does not exist (an operator makes credentials with `vcuda tokens create "
                          "--tenant NAME -o FILE`)"};
    if (st.st_mode & 077)
        return unexpected{"the credential file " + path + " can be read by other users; run `chmod 600 " +
                          path + "`"};
    std::ifstream f(path, std::ios::binary);
    if (!f) return unexpected{"cannot open the credential file " + path + " (permission denied?)"};
    std::string s;
    char c;
    while (s.size() <= 4096 && f.get(c)) s.push_back(c);
    auto ws = [](char ch) { return ch == ' ' || ch == '\n' || ch == '\r' || ch == '\t'; };
    while (!s.empty() && ws(s.back())) s.pop_back();
    size_t b = 0;
    while (b < s.size() && ws(s[b])) ++b;
    s.erase(0, b);
    if (s.empty()) return unexpected{"the credential file " + path + " is empty"};
    return s;
}

std::string credential_from_env(std::string* error) {
    if (auto v = env("VCUDA_CREDENTIAL"); !v.empty()) return v;
    if (auto path = env("VCUDA_CREDENTIAL_FILE"); !path.empty()) {
        auto c = read_credential_file(path);
        if (c) return *c;
        if (error) *error = "VCUDA_CREDENTIAL_FILE: " + c.error();
        VCUDA_LOG_ERROR("VCUDA_CREDENTIAL_FILE: {}", c.error());
    }
    return {};
}

lease_request lease_request_from_env(std::string* error) {
    lease_request r;
    std::string problems;
    char host[256] = {};
    if (::gethostname(host, sizeof host - 1) == 0) r.client_host = host;
    r.pid = ::getpid();
    if (auto g = env("VCUDA_GPUS"); !g.empty()) {
        char* end = nullptr;
        long n = std::strtol(g.c_str(), &end, 10);
        if (end && *end == 0 && n >= 1 && n <= 64)
            r.gpus = static_cast<uint32_t>(n);
        else
            problems += "VCUDA_GPUS='" + g + "' is not a number of GPUs (1-64); ";
    }
    if (auto m = env("VCUDA_MEMORY"); !m.empty()) {
        if (auto b = parse_size(m))
            r.memory_per_gpu = *b;
        else
            problems += "VCUDA_MEMORY='" + m + "' is not a size like 8G; ";
    }
    r.hints.exclusive = truthy(env("VCUDA_EXCLUSIVE"));
    r.hints.same_host = truthy(env("VCUDA_SAME_HOST"));
    r.hints.model = env("VCUDA_GPU_MODEL");
    if (error) *error = problems;
    return r;
}

result<lease_grant, std::string> acquire_lease(const endpoint& manager, const lease_request& request,
                                               std::chrono::milliseconds timeout,
                                               std::optional<std::string> credential) {
    try {
        auto reply = mgmt_call(manager, "lease.acquire", encode(request), timeout, resolve(credential));
        if (!reply) return unexpected{describe_for_client(reply.error(), manager, "lease")};
        auto grant = decode<lease_grant>(*reply);
        if (!grant)
            return unexpected{"the manager at " + manager.to_string() +
                              " sent a lease vcuda cannot read: " + grant.error()};
        if (grant->devices.size() != request.gpus)
            return unexpected{"the manager at " + manager.to_string() + " granted " +
                              std::to_string(grant->devices.size()) + " GPUs instead of " +
                              std::to_string(request.gpus)};
        return grant;
    } catch (const std::exception& e) {
        return unexpected{std::string("lease request failed: ") + e.what()};
    }
}

result<lease_grant, std::string> renew_lease(const endpoint& manager, const std::string& lease_id,
                                             std::chrono::milliseconds timeout,
                                             std::optional<std::string> credential) {
    try {
        auto reply = mgmt_call(manager, "lease.renew", nlohmann::json{{"lease_id", lease_id}}.dump(), timeout,
                               resolve(credential));
        if (!reply) return unexpected{describe_for_client(reply.error(), manager, "lease renewal")};
        auto grant = decode<lease_grant>(*reply);
        if (!grant) return unexpected{grant.error()};
        return grant;
    } catch (const std::exception& e) {
        return unexpected{std::string("lease renewal failed: ") + e.what()};
    }
}

result<void, std::string> release_lease(const endpoint& manager, const std::string& lease_id,
                                        std::chrono::milliseconds timeout,
                                        std::optional<std::string> credential) {
    try {
        auto reply = mgmt_call(manager, "lease.release", nlohmann::json{{"lease_id", lease_id}}.dump(),
                               timeout, resolve(credential));
        if (!reply) return unexpected{describe_for_client(reply.error(), manager, "lease release")};
        return {};
    } catch (const std::exception& e) {
        return unexpected{std::string("lease release failed: ") + e.what()};
    }
}

// ------------------------------------------------------------------------------------------------
// lease_keeper

lease_keeper::lease_keeper(endpoint manager, lease_grant grant,
                           std::function<void(const std::string&)> on_lost,
                           std::function<void(const lease_grant&)> on_renewed,
                           std::optional<std::string> credential)
    : manager_(std::move(manager)),
      credential_(resolve(credential)),
      on_lost_(std::move(on_lost)),
      on_renewed_(std::move(on_renewed)),
      grant_(std::move(grant)) {
    try {
        thread_ = std::thread([this] { run(); });
    } catch (const std::exception& e) {
        VCUDA_LOG_ERROR("lease {}: cannot start the renewal thread: {}", grant_.lease_id, e.what());
    }
}

lease_keeper::~lease_keeper() {
    bool release;
    std::string id;
    {
        std::lock_guard lock(mutex_);
        stop_ = true;
        release = !lost_ && !abandoned_;
        id = grant_.lease_id;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    if (release && !id.empty()) {
        if (auto r = release_lease(manager_, id, std::chrono::seconds(2), credential_); !r)
            VCUDA_LOG_DEBUG("lease {}: release failed ({}); it expires on its own", id, r.error());
    }
}

lease_grant lease_keeper::current() const {
    std::lock_guard lock(mutex_);
    return grant_;
}

bool lease_keeper::lost() const {
    std::lock_guard lock(mutex_);
    return lost_;
}

void lease_keeper::abandon() {
    {
        std::lock_guard lock(mutex_);
        abandoned_ = true;
        stop_ = true;
    }
    cv_.notify_all();
}

void lease_keeper::run() {
    using namespace std::chrono;
    std::unique_lock lock(mutex_);
    milliseconds ttl(grant_.ttl_ms > 0 ? grant_.ttl_ms : 30'000);
    milliseconds every = std::max(ttl / 3, milliseconds(50));
    milliseconds wait = every;
    bool warned = false;
    while (!stop_) {
        cv_.wait_for(lock, wait, [this] { return stop_; });
        if (stop_) break;
        std::string id = grant_.lease_id;
        lock.unlock();
        auto reply = mgmt_call(manager_, "lease.renew", nlohmann::json{{"lease_id", id}}.dump(),
                               std::chrono::seconds(5), credential_);
        result<lease_grant, std::string> grant =
            reply ? decode<lease_grant>(*reply) : unexpected{std::string()};
        lock.lock();
        if (stop_) break;
        if (reply && grant) {
            grant_ = std::move(*grant);
            if (grant_.ttl_ms > 0) every = std::max(milliseconds(grant_.ttl_ms) / 3, milliseconds(50));
            wait = every;
            if (warned) VCUDA_LOG_INFO("lease {}: renewed again", id);
            warned = false;
            if (on_renewed_) {
                auto copy = grant_;
                lock.unlock();
                on_renewed_(copy);
                lock.lock();
            }
            continue;
        }
        if (!reply && ((reply.error().kind == rpc_errc::remote && reply.error().code == "unknown_lease") ||
                       refused_caller(reply.error()))) {
            lost_ = true;
            std::string why = reply.error().code == "unknown_lease"
                                  ? "the manager at " + manager_.to_string() + " no longer knows lease " +
                                        id + ": " + reply.error().message
                                  : "the manager at " + manager_.to_string() + " refused to renew lease " +
                                        id + ": " + reply.error().message;
            VCUDA_LOG_ERROR("{}", why);
            if (on_lost_) {
                lock.unlock();
                on_lost_(why);
                lock.lock();
            }
            break;
        }
        // Manager unreachable or restarting: retry soon; the manager extends leases when it comes back.
        if (!warned)
            VCUDA_LOG_WARN("lease {}: cannot renew ({}); retrying", id,
                           reply ? grant.error() : describe(reply.error(), manager_));
        warned = true;
        wait = std::min(every, milliseconds(1000));
    }
}

}  // namespace vcuda::mgmt
