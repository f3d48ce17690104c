// vcuda-server's core: accepts connections, runs HELLO, and gives each lane (connection) its own thread that
// verifies, dispatches and answers calls in order. Sessions end when their last lane ends.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/transport.hpp"
#include "server/driver.hpp"
#include "server/session.hpp"

namespace vcuda::server {

class server {
public:
    server(driver& drv, server_options opts) : drv_(drv), opts_(opts) {}
    ~server();

    // Starts serving `l` on a thread of its own.
    void serve(listener l);
    // Stops accepting; live sessions are ended as their connections close.
    void stop();
    session_registry& sessions() { return sessions_; }

private:
    void accept_loop(listener* l);
    void run_connection(stream s);
    void run_lane(std::shared_ptr<session> sess, frame_stream& fs, uint32_t lane_number);

    driver& drv_;
    server_options opts_;
    session_registry sessions_;
    std::vector<std::unique_ptr<listener>> listeners_;
    std::vector<std::thread> acceptors_;
    std::atomic<bool> stopping_{false};
};

}  // namespace vcuda::server
