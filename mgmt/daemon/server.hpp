// Serves the manager protocol (mgmt/PROTOCOL.md) on one or more listening endpoints: a thread per listener
// accepts, a thread per connection (after its TLS handshake, on a TLS listener) reads MgmtRequest frames and
// answers each with a MgmtReply (same sequence), and a timer thread drives service::tick() (heartbeat
// timeouts, lease expiry). runs on: its own threads; start()/stop() from one controlling thread. locks:
// conns_mutex_ guards the connection list; the service has its own lock.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/result.hpp"
#include "common/tls.hpp"
#include "common/transport.hpp"
#include "mgmt/daemon/service.hpp"

namespace vcuda::mgmt {

class mgmt_server {
  public:
    explicit mgmt_server(service& svc, std::chrono::milliseconds tick_every = std::chrono::milliseconds(250));
    ~mgmt_server();

    // Binds every endpoint; fails (binding nothing) if any cannot be bound. With `tls` (a server context),
    // TCP endpoints speak TLS only; Unix sockets stay plain.
    result<void, std::string> listen(const std::vector<endpoint>& endpoints,
                                     const std::shared_ptr<const tls_context>& tls = {});
    // The bound addresses (ports chosen by the system for ":0" filled in).
    std::vector<endpoint> local_endpoints() const;

    void start();
    // Closes the listeners and every connection, joins all threads. Idempotent.
    void stop();

  private:
    struct connection {
        std::unique_ptr<frame_stream> stream;
        std::shared_ptr<const tls_context> tls;  // its listener's: the handshake comes first
        std::thread thread;
        std::atomic<bool> done{false};
    };
    void accept_loop(listener& l);
    void serve(connection& c);
    void reap();

    service& svc_;
    std::chrono::milliseconds tick_every_;
    std::vector<std::unique_ptr<listener>> listeners_;
    std::vector<std::thread> threads_;
    std::mutex conns_mutex_;
    std::list<connection> conns_;
    std::mutex stop_mutex_;
    std::condition_variable stop_cv_;
    std::atomic<bool> stopping_{false};
    bool started_ = false;
};

}  // namespace vcuda::mgmt
