// vcuda-server's core: accepts connections, runs HELLO, and gives each lane (connection) its own thread that
// verifies, dispatches and answers calls in order. Sessions end when their last lane ends.
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/transport.hpp"
#include "server/driver.hpp"
#include "server/session.hpp"
#include "vcuda_generated.h"

namespace vcuda::server {

// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as nvidia-smi and the manager write GPU UUIDs.
std::string gpu_uuid_string(const CUuuid& u);
// The GPU's utilization in percent over NVML's last sample period (server/handlers_nvml.cpp), for the manager's
// heartbeats; nothing when the host's NVML is missing or does not know the GPU.
std::optional<uint32_t> gpu_utilization(const CUuuid& u);

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
    // Decides what a new session may use: the GPUs it asks for, or — when the server is attached to a manager —
    // exactly the GPU and memory its lease token grants. False with `refusal` set when it may not open.
    bool authorize(const wire::Hello& h, session_grant& grant, std::string& refusal);

    driver& drv_;
    server_options opts_;
    session_registry sessions_;
    std::vector<std::unique_ptr<listener>> listeners_;
    std::vector<std::thread> acceptors_;
    std::atomic<bool> stopping_{false};
};

}  // namespace vcuda::server
