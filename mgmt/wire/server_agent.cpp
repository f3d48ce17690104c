#include "mgmt/wire/server_agent.hpp"

#include <optional>

#include "common/log.hpp"
#include "mgmt/wire/codec.hpp"
#include "mgmt/wire/rpc.hpp"

namespace vcuda::mgmt {

server_agent::server_agent(server_agent_config cfg) : cfg_(std::move(cfg)) {
    try {
        thread_ = std::thread([this] { run(); });
    } catch (const std::exception& e) {
        VCUDA_LOG_ERROR("manager agent: cannot start its thread: {}", e.what());
    }
}

server_agent::~server_agent() { stop(); }

void server_agent::stop() {
    {
        std::lock_guard lock(mutex_);
        stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

std::string server_agent::server_id() const {
    std::lock_guard lock(mutex_);
    return server_id_;
}

bool server_agent::connected() const {
    std::lock_guard lock(mutex_);
    return connected_;
}

bool server_agent::wait_registered(std::chrono::milliseconds timeout) const {
    std::unique_lock lock(mutex_);
    return cv_.wait_for(lock, timeout, [this] { return !server_id_.empty() || stop_; }) &&
           !server_id_.empty();
}

void server_agent::run() {
    using namespace std::chrono;
    constexpr auto call_timeout = seconds(5);
    const std::string where = cfg_.manager.to_string();
    milliseconds interval = cfg_.interval.count() > 0 ? cfg_.interval : milliseconds(3000);
    std::optional<mgmt_connection> conn;
    bool warned = false;
    std::unique_lock lock(mutex_);
    milliseconds wait(0);
    while (!stop_) {
        if (wait.count() > 0) cv_.wait_for(lock, wait, [this] { return stop_; });
        if (stop_) break;
        std::string id = server_id_;
        lock.unlock();

        std::string method = id.empty() ? "server.register" : "server.heartbeat", body;
        if (id.empty()) {
            body = encode(cfg_.registration);
        } else {
            heartbeat hb;
            try {
                if (cfg_.load) hb = cfg_.load();
            } catch (const std::exception& e) {
                VCUDA_LOG_ERROR("manager agent: the load callback failed: {}", e.what());
            }
            hb.server_id = id;
            hb.address_window = cfg_.registration.address_window;
            body = encode(hb);
        }

        result<std::string, rpc_error> reply =
            unexpected{rpc_error{rpc_errc::unreachable, "", "not connected"}};
        if (!conn || !conn->is_open()) {
            conn.reset();
            auto c = mgmt_connection::connect(cfg_.manager, call_timeout);
            if (c)
                conn.emplace(std::move(*c));
            else
                reply = unexpected{c.error()};
        }
        std::string auth;
        try {
            if (cfg_.sign) auth = cfg_.sign(method, body);
        } catch (const std::exception& e) {
            VCUDA_LOG_ERROR("manager agent: cannot sign the request: {}", e.what());
        }
        if (conn) reply = conn->call(method, body, call_timeout, auth);

        lock.lock();
        if (stop_) break;
        if (!reply) {
            const auto& e = reply.error();
            if (e.kind == rpc_errc::remote && e.code == "unknown_server") {
                VCUDA_LOG_WARN(
                    "the manager at {} does not know this server as it is ({}: {}); registering again", where,
                    id, e.message);
                server_id_.clear();
                connected_ = false;
                wait = milliseconds(0);
                continue;
            }
            if (e.kind != rpc_errc::remote) conn.reset();
            // A refusal of this server's settings (its address window) stands until it is restarted with
            // others: said as an error, asked again at the heartbeat interval (the other server may go).
            const bool refused = e.kind == rpc_errc::remote && e.code == "address_window_taken";
            if (!warned || connected_) {
                if (refused)
                    VCUDA_LOG_ERROR("the manager at {} refused this server: {}", where, e.message);
                else
                    VCUDA_LOG_WARN("manager {}: {}", method,
                                   e.kind == rpc_errc::remote ? e.message : describe(e, cfg_.manager));
            }
            warned = true;
            connected_ = false;
            wait = refused ? interval : std::min(interval, milliseconds(1000));
            continue;
        }
        if (warned) VCUDA_LOG_INFO("manager at {} answers again", where);
        warned = false;
        if (method == "server.register") {
            auto j = nlohmann::json::parse(*reply, nullptr, false);
            auto& reg = cfg_.registration;
            if (j.is_object() && j.contains("address_window") && j["address_window"].is_number_integer() &&
                j["address_window"].get<int32_t>() != reg.address_window && j.contains("server_id")) {
                // The window this server chose is another's: it takes the one the manager gave, or, when its
                // sessions already use its own, registers again without the choice (and is refused).
                const auto given = j["address_window"].get<int32_t>();
                const bool taken = reg.address_window_auto && cfg_.take_window && cfg_.take_window(given);
                if (!taken) {
                    VCUDA_LOG_ERROR(
                        "the manager at {} gave this server address window {} (window {} is another "
                        "server's), but its sessions already use window {}: restart it with --address-window "
                        "{}",
                        where, given, reg.address_window, reg.address_window, given);
                    reg.address_window_auto = false;
                    wait = milliseconds(0);
                    continue;
                }
                VCUDA_LOG_INFO(
                    "address window {} is another server's: the manager at {} gave this server window {}",
                    reg.address_window, where, given);
                reg.address_window = given;
            }
            if (j.is_object() && j.contains("server_id") && j["server_id"].is_string()) {
                server_id_ = j["server_id"].get<std::string>();
                if (cfg_.interval.count() == 0 && j.contains("heartbeat_interval_ms") &&
                    j["heartbeat_interval_ms"].is_number_integer())
                    interval = milliseconds(std::max<int64_t>(j["heartbeat_interval_ms"].get<int64_t>(), 50));
                VCUDA_LOG_INFO("registered with the manager at {} as {} ({} GPUs)", where, server_id_,
                               cfg_.registration.gpus.size());
                connected_ = true;
                cv_.notify_all();
                wait = milliseconds(0);  // first heartbeat right away: the manager learns the load at once
            } else {
                VCUDA_LOG_ERROR("the manager at {} answered server.register without a server_id", where);
                wait = interval;
            }
            continue;
        }
        connected_ = true;
        wait = interval;
        auto hr = decode<heartbeat_reply>(*reply);
        if (hr && cfg_.on_leases) {
            auto leases = std::move(hr->leases);
            lock.unlock();
            try {
                cfg_.on_leases(leases);
            } catch (const std::exception& e) {
                VCUDA_LOG_ERROR("manager agent: lease callback: {}", e.what());
            }
            lock.lock();
        }
    }
}

}  // namespace vcuda::mgmt
