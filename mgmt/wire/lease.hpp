// Client side of the manager: ask for a lease (which GPUs, where, with which tokens) and keep it alive.
// Linked into the client libcuda.so: depends only on vcuda_common and nlohmann-json headers; nothing here
// throws.
//
//   auto req = mgmt::lease_request_from_env();                 // VCUDA_GPUS, VCUDA_MEMORY, ... + host name,
//   pid auto grant = mgmt::acquire_lease(manager, req, 10s);       // result<lease_grant, std::string>;
//   presents
//                                                              // the tenant credential of VCUDA_CREDENTIAL
//   mgmt::lease_keeper keeper(manager, *grant);                // renews every ttl/3; releases when destroyed
//   ... connect to grant->devices[i].server_endpoints, present devices[i].token ...
//
// runs on: acquire_lease on the caller's thread; lease_keeper on its own thread (callbacks run there).
// locks: lease_keeper::mutex_ guards the current grant and the stop flag.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "common/result.hpp"
#include "common/transport.hpp"
#include "mgmt/wire/types.hpp"

namespace vcuda::mgmt {

// A lease request from the environment that `vcuda run` sets: VCUDA_GPUS (default 1), VCUDA_MEMORY (bytes or
// "8G"; default 0 = whole GPU), VCUDA_EXCLUSIVE=1, VCUDA_SAME_HOST=1, VCUDA_GPU_MODEL=H100; client_host is
// this host's name, pid this process. Malformed values are reported in `error` and left at their defaults.
lease_request lease_request_from_env(std::string* error = nullptr);

// The tenant credential a client presents to the manager (`vcuda tokens create` makes them): the value of
// VCUDA_CREDENTIAL, else the contents of the file VCUDA_CREDENTIAL_FILE names (`vcuda run --credential FILE`
// sets it; surrounding whitespace trimmed; a file others can read is refused). Empty when neither is set;
// `error` says what is wrong with a file that cannot be used.
std::string credential_from_env(std::string* error = nullptr);
// Reads a credential file as above.
result<std::string, std::string> read_credential_file(const std::string& path);

// In the calls below `credential` nullopt means credential_from_env().

// Asks the manager for GPUs. The error is one sentence for the user: why, and what to do next
// (e.g. "cannot reach the manager at ...: is vcuda-mgmt running?", "no GPU has 8 GiB free: ...").
result<lease_grant, std::string> acquire_lease(const endpoint& manager, const lease_request& request,
                                               std::chrono::milliseconds timeout,
                                               std::optional<std::string> credential = {});

// Renews a lease (fresh expiry and tokens). Errors: the manager's message; unknown_lease when it has ended.
result<lease_grant, std::string> renew_lease(const endpoint& manager, const std::string& lease_id,
                                             std::chrono::milliseconds timeout,
                                             std::optional<std::string> credential = {});
// Releases a lease; best effort.
result<void, std::string> release_lease(const endpoint& manager, const std::string& lease_id,
                                        std::chrono::milliseconds timeout,
                                        std::optional<std::string> credential = {});

// Keeps a lease alive from a background thread: renews it every ttl/3 (retrying every second while the
// manager cannot be reached — a restarted manager keeps its leases), and releases it when destroyed. If the
// manager says the lease is gone (expired or released by an operator), or no longer accepts the credential
// (revoked, expired), on_lost runs once and renewal stops.
class lease_keeper {
  public:
    lease_keeper(endpoint manager, lease_grant grant,
                 std::function<void(const std::string& why)> on_lost = {},
                 std::function<void(const lease_grant&)> on_renewed = {},
                 std::optional<std::string> credential = {});
    ~lease_keeper();  // stops the thread, then releases the lease (waits at most ~2 s for the manager)
    lease_keeper(const lease_keeper&) = delete;
    lease_keeper& operator=(const lease_keeper&) = delete;

    // The latest grant (its tokens are the freshest: use them to reconnect to a server).
    lease_grant current() const;
    bool lost() const;
    // Stops renewing without releasing (e.g. in a forked child that must not release its parent's lease).
    void abandon();

  private:
    void run();

    endpoint manager_;
    std::string credential_;
    std::function<void(const std::string&)> on_lost_;
    std::function<void(const lease_grant&)> on_renewed_;
    mutable std::mutex mutex_;
    std::condition_variable cv_;
    lease_grant grant_;
    bool stop_ = false;
    bool lost_ = false;
    bool abandoned_ = false;
    std::thread thread_;
};

}  // namespace vcuda::mgmt
