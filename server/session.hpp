// A session: what one client (a VM, a container, a process) holds on this server — its own CUDA context per
// GPU, its handle table, its device memory and quota, its cached images. Lanes (one per client thread, each
// its own connection and thread) run calls under it. The session ends when its last lane ends, and then
// releases everything it held.
// locks: `mu` guards handles, memory, globals and images; contexts are created once under it.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/transport.hpp"
#include "server/device_memory.hpp"
#include "server/driver.hpp"
#include "server/handle_table.hpp"

namespace vcuda::server {

struct server_options {
    uint64_t memory_quota = 0;  // bytes per GPU per session; 0 = the GPU's own memory
    std::string secret;         // shared with the manager: when set, every session needs a valid lease token
};

// What a session may use: which of the server's GPUs (by index) and how much memory on each.
struct session_grant {
    std::vector<size_t> gpus;  // empty = all
    uint64_t memory_quota = 0;  // 0 = the server's default
    std::string lease_id;
};

class session {
public:
    session(uint64_t id, uint64_t secret, driver& drv, const server_options& opts, const session_grant& grant, std::string peer);
    ~session();

    uint64_t id() const { return id_; }
    uint64_t secret() const { return secret_; }
    const std::string& peer() const { return peer_; }
    driver& drv() { return *drv_; }
    const driver_table& api() const { return drv_->api(); }
    size_t device_count() const { return devices_.size(); }
    uint64_t quota(size_t device) const;
    // True when this session may use the server's GPU `device`.
    bool allowed(size_t device) const { return device < devices_.size() && devices_[device].allowed; }
    const std::string& lease_id() const { return lease_id_; }

    // The session's context on `device`, created on first use. Null with `rc` set if creation failed.
    CUcontext context(size_t device, CUresult& rc);
    device_memory& memory(size_t device) { return *devices_[device].memory; }

    // True when [p, p+n) is this session's memory on any of its GPUs (allocations or module globals).
    bool owns_range(CUdeviceptr p, size_t n);

    // Ends the session's use of `device` (context reset) or of everything (session end).
    void release_device(size_t device);
    void release_all();

    std::mutex mu;
    handle_table handles;
    std::map<CUdeviceptr, std::pair<size_t, uint64_t>> globals;  // module globals: start -> (size, owner)
    std::unordered_map<uint64_t, std::vector<std::vector<uint64_t>>> images;  // content hash -> parts (8-byte aligned)
    size_t image_bytes = 0;

    std::atomic<int> lanes{0};
    // Lanes register their connections so the session can be ended from outside (its lease was released or
    // expired): end() shuts them down and the lanes' threads then release everything as on a disconnect.
    void attach(frame_stream* fs);
    void detach(frame_stream* fs);
    void end(const std::string& why);
    std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();

private:
    struct device_slot {
        CUdevice device = 0;
        CUcontext ctx = nullptr;
        std::unique_ptr<device_memory> memory;
        bool allowed = true;
    };

    uint64_t id_, secret_;
    driver* drv_;
    server_options opts_;
    std::string peer_;
    std::string lease_id_;
    std::vector<device_slot> devices_;
    std::mutex lanes_mu_;
    std::vector<frame_stream*> streams_;
};

// All live sessions of this server, for lanes that join one and for operators' queries.
class session_registry {
public:
    std::shared_ptr<session> create(driver& drv, const server_options& opts, const session_grant& grant, const std::string& peer);
    // Sessions, for heartbeats: (lease id, GPU memory held per server GPU).
    template <class F>
    void for_each(F&& f) {
        std::lock_guard lock(mu_);
        for (auto& [id, s] : sessions_) f(*s);
    }
    std::shared_ptr<session> find(uint64_t id, uint64_t secret);
    void remove(uint64_t id);
    size_t size();

private:
    std::mutex mu_;
    std::unordered_map<uint64_t, std::shared_ptr<session>> sessions_;
};

}  // namespace vcuda::server
