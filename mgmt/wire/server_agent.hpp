// Server side of the manager: a vcuda-server started with --manager runs one server_agent. It registers the
// server's GPUs, then sends a heartbeat with their load every interval the manager asks for (timeout/3), and
// registers again when the manager no longer knows the server (a manager started on a fresh database).
// Each heartbeat reply lists the leases alive on this server's GPUs: sessions whose lease is not among them
// (released, expired) should be closed and their memory freed.
// Depends only on vcuda_common and nlohmann-json headers; nothing here throws.
// runs on: its own thread; `load` and `on_leases` are called there. locks: mutex_ guards the state below.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

#include "common/transport.hpp"
#include "mgmt/wire/types.hpp"

namespace vcuda::mgmt {

struct server_agent_config {
    endpoint manager;
    server_registration registration;  // host, endpoints clients connect to, GPUs
    // Called before every heartbeat: per-GPU load (by uuid) and, optionally, the sessions. server_id is
    // filled in.
    std::function<heartbeat()> load;
    // Called after every answered heartbeat with the leases alive on this server.
    std::function<void(const std::vector<active_lease>&)> on_leases;
    // 0: what the manager asks for (registration reply), else this.
    std::chrono::milliseconds interval{0};
    // Signs each request (method, body) with the shared secret: returns the MgmtRequest's auth field
    // (mgmt::sign_request of mgmt/token.hpp; kept out of this library, which links no crypto). The manager
    // refuses registrations and heartbeats that are not signed.
    std::function<std::string(std::string_view method, std::string_view body)> sign;
    // For a server that chose its address window itself (registration.address_window_auto): takes the window
    // the manager gave instead, true when it could (no session has used the old one yet).
    std::function<bool(int32_t window)> take_window;
};

class server_agent {
  public:
    explicit server_agent(server_agent_config cfg);
    ~server_agent();  // stops the thread (waits for a call in flight, at most a few seconds)
    server_agent(const server_agent&) = delete;
    server_agent& operator=(const server_agent&) = delete;

    // The id the manager gave this server; empty until the first registration succeeded.
    std::string server_id() const;
    // True once registered and the last heartbeat was answered.
    bool connected() const;
    // Blocks until registered or `timeout` passed; true if registered.
    bool wait_registered(std::chrono::milliseconds timeout) const;
    void stop();

  private:
    void run();

    server_agent_config cfg_;
    mutable std::mutex mutex_;
    mutable std::condition_variable cv_;
    std::string server_id_;
    bool connected_ = false;
    bool stop_ = false;
    std::thread thread_;
};

}  // namespace vcuda::mgmt
