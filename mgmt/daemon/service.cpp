#include "mgmt/daemon/service.hpp"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "common/log.hpp"
#include "mgmt/token.hpp"
#include "mgmt/wire/codec.hpp"

namespace vcuda::mgmt {

namespace {

using nlohmann::json;

service_reply fail(const std::string& code, std::string message) {
    service_reply r;
    r.ok = false;
    r.body = json{{"code", code}}.dump();
    r.error = std::move(message);
    return r;
}
service_reply fail(const mgmt_error& e) { return fail(e.code, e.message); }

service_reply ok(const json& body) {
    service_reply r;
    r.body = body.dump(-1, ' ', false, json::error_handler_t::replace);
    return r;
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// Reads a string field of a request body that may name its target in several ways.
std::string field(const json& j, std::initializer_list<const char*> keys) {
    for (auto* k : keys)
        if (auto it = j.find(k); it != j.end() && it->is_string() && !it->get<std::string>().empty())
            return it->get<std::string>();
    return {};
}

}  // namespace

service::service(service_config cfg, std::unique_ptr<sqlite_store> store, clock_fn clock,
                 std::function<std::string()> new_id)
    : cfg_(std::move(cfg)),
      store_(std::move(store)),
      clock_(std::move(clock)),
      state_(cfg_.state, std::move(new_id)) {
    if (!clock_)
        clock_ = [] {
            return std::chrono::time_point_cast<std::chrono::milliseconds>(std::chrono::system_clock::now());
        };
}

result<void, std::string> service::start() {
    std::lock_guard lock(mutex_);
    if (!store_) return {};
    auto snap = store_->load();
    if (!snap) return unexpected{snap.error()};
    size_t leases = snap->leases.size(), servers = snap->servers.size(), gpus = snap->gpus.size();
    state_.load(std::move(*snap), clock_());
    // load() extended leases to give their clients time to renew: write that down too.
    state_changes changes;
    for (auto& [id, l] : state_.leases()) changes.leases_put.push_back(id);
    if (!persist(changes)) return unexpected{std::string("cannot write the database ") + store_->path()};
    VCUDA_LOG_INFO("state from {}: {} servers, {} GPUs, {} leases", store_->path(), servers, gpus, leases);
    return {};
}

bool service::persist(const state_changes& changes) {
    if (!store_ || changes.empty()) return true;
    auto r = store_->apply(state_, changes);
    if (!r) VCUDA_LOG_ERROR("{}", r.error());
    return r.has_value();
}

void service::tick() {
    std::lock_guard lock(mutex_);
    state_changes changes;
    auto r = state_.tick(clock_(), changes);
    for (auto& id : r.servers_down) {
        auto& s = state_.servers().at(id);
        VCUDA_LOG_WARN("server {} ({}) missed heartbeats for {} ms: marked down; its GPUs take no new leases",
                       id, s.host, cfg_.state.heartbeat_timeout.count());
    }
    for (auto& l : r.leases_expired)
        VCUDA_LOG_INFO("lease {} of {} pid {} expired (not renewed)", l.id, l.client_host, l.pid);
    persist(changes);
}

std::string service::grant_json(const lease_record& l) {
    lease_grant g;
    g.lease_id = l.id;
    g.expires_at = to_unix_ms(l.expires_at);
    g.ttl_ms = cfg_.state.lease_ttl.count();
    for (auto& d : l.devices) {
        device_grant dg;
        dg.uuid = d.uuid;
        dg.memory_quota = d.memory_quota;
        if (auto gi = state_.gpus().find(d.uuid); gi != state_.gpus().end()) {
            dg.gpu_index = gi->second.info.index;
            dg.name = gi->second.info.name;
        }
        if (auto* s = state_.server_of_gpu(d.uuid)) {
            dg.server_endpoints = s->endpoints;
            dg.host = s->host;
        }
        dg.token =
            sign_token(cfg_.secret, {l.id, d.uuid, d.memory_quota,
                                     std::chrono::system_clock::time_point(l.expires_at.time_since_epoch())});
        g.devices.push_back(std::move(dg));
    }
    return encode(g);
}

service_reply service::handle(std::string_view method, std::string_view body) {
    std::lock_guard lock(mutex_);
    state_changes changes;
    service_reply r;
    try {
        r = dispatch(method, body, clock_(), changes);
    } catch (const std::exception& e) {
        VCUDA_LOG_ERROR("{}: {}", method, e.what());
        return fail(errc::internal, std::string("internal error: ") + e.what());
    }
    if (!persist(changes)) {
        if (method == "lease.acquire" && r.ok) {
            // The client never hears of a lease that is not on disk.
            state_changes undo;
            for (auto& id : changes.leases_put) (void)state_.release(id, undo);
        }
        return fail(errc::internal, "the manager cannot write its database" +
                                        (store_ ? " " + store_->path() : std::string()) +
                                        "; check the disk and the manager's log");
    }
    return r;
}

service_reply service::dispatch(std::string_view method, std::string_view body_text, time_ms now,
                                state_changes& changes) {
    json body = body_text.empty() ? json::object() : json::parse(body_text, nullptr, false);
    if (body.is_discarded() || !body.is_object())
        return fail(errc::bad_request, "the request body is not a JSON object");

    if (method == "server.register") {
        auto reg = decode<server_registration>(body_text);
        if (!reg) return fail(errc::bad_request, reg.error());
        auto id = state_.register_server(*reg, now, changes);
        if (!id) return fail(id.error());
        VCUDA_LOG_INFO("server {} registered: host {}, {} GPUs, endpoints {}", *id, reg->host,
                       reg->gpus.size(), dump(json(reg->endpoints)));
        return ok(
            {{"server_id", *id},
             {"heartbeat_interval_ms", std::max<int64_t>(cfg_.state.heartbeat_timeout.count() / 3, 100)}});
    }
    if (method == "server.heartbeat") {
        auto hb = decode<heartbeat>(body_text);
        if (!hb) return fail(errc::bad_request, hb.error());
        bool was_down = state_.servers().contains(hb->server_id) && state_.servers().at(hb->server_id).down;
        auto r = state_.heartbeat(*hb, now, changes);
        if (!r) return fail(r.error());
        if (was_down) VCUDA_LOG_INFO("server {} is back", hb->server_id);
        return ok(json(*r));
    }
    if (method == "lease.acquire") {
        auto req = decode<lease_request>(body_text);
        if (!req) return fail(errc::bad_request, req.error());
        auto l = state_.acquire(*req, now, changes);
        if (!l) {
            VCUDA_LOG_INFO("lease for {} pid {} refused: {}", req->client_host, req->pid, l.error().message);
            return fail(l.error());
        }
        std::string devices;
        for (auto& d : l->devices) devices += (devices.empty() ? "" : ", ") + d.uuid;
        VCUDA_LOG_INFO("lease {} for {} pid {}: {}", l->id, l->client_host, l->pid, devices);
        service_reply r;
        r.body = grant_json(*l);
        return r;
    }
    if (method == "lease.renew") {
        auto l = state_.renew(field(body, {"lease_id"}), now, changes);
        if (!l) return fail(l.error());
        service_reply r;
        r.body = grant_json(*l);
        return r;
    }
    if (method == "lease.release") {
        auto l = state_.release(field(body, {"lease_id"}), changes);
        if (!l) return fail(l.error());
        VCUDA_LOG_INFO("lease {} released", l->id);
        return ok(json::object());
    }
    if (method == "gpus.list") {
        json gpus = json::array();
        for (auto& v : state_.gpu_views()) {
            auto& g = *v.gpu;
            json j{{"uuid", g.info.uuid},
                   {"index", g.info.index},
                   {"name", g.info.name},
                   {"memory", g.info.memory},
                   {"sms", g.info.sms},
                   {"driver_version", g.info.driver_version},
                   {"server_id", g.server_id},
                   {"host", v.server ? v.server->host : ""},
                   {"leased_memory", v.leased_memory},
                   {"leases", v.leases},
                   {"exclusive", v.exclusive},
                   {"cordoned", g.cordoned},
                   {"state", v.state},
                   {"sessions", g.load.sessions},
                   {"memory_used", g.load.memory_used}};
            if (g.load_reported) j["utilization"] = g.load.utilization;
            gpus.push_back(std::move(j));
        }
        return ok({{"gpus", gpus}});
    }
    if (method == "servers.list") {
        json servers = json::array();
        for (auto& [id, s] : state_.servers()) {
            uint32_t gpus = 0;
            for (auto& [uuid, g] : state_.gpus()) gpus += g.server_id == id;
            uint32_t leases = state_.leases_on_server(id);
            std::string st = s.down       ? "down"
                             : s.draining ? (leases ? "draining" : "drained")
                             : s.cordoned ? "cordoned"
                                          : "up";
            servers.push_back({{"server_id", id},
                               {"host", s.host},
                               {"endpoints", s.endpoints},
                               {"state", st},
                               {"cordoned", s.cordoned},
                               {"draining", s.draining},
                               {"down", s.down},
                               {"gpus", gpus},
                               {"leases", leases},
                               {"registered_at", to_unix_ms(s.registered_at)},
                               {"last_heartbeat", to_unix_ms(s.last_heartbeat)}});
        }
        return ok({{"servers", servers}});
    }
    if (method == "leases.list") {
        json leases = json::array();
        for (auto& [id, l] : state_.leases()) {
            json devices = json::array();
            for (auto& d : l.devices) {
                auto* s = state_.server_of_gpu(d.uuid);
                auto gi = state_.gpus().find(d.uuid);
                devices.push_back({{"uuid", d.uuid},
                                   {"memory_quota", d.memory_quota},
                                   {"server_id", s ? s->id : ""},
                                   {"host", s ? s->host : ""},
                                   {"gpu_index", gi != state_.gpus().end() ? gi->second.info.index : 0}});
            }
            leases.push_back({{"lease_id", id},
                              {"client_host", l.client_host},
                              {"pid", l.pid},
                              {"exclusive", l.exclusive},
                              {"created_at", to_unix_ms(l.created_at)},
                              {"expires_at", to_unix_ms(l.expires_at)},
                              {"devices", devices}});
        }
        return ok({{"leases", leases}});
    }
    if (method == "sessions.list") {
        json sessions = json::array();
        for (auto& [id, s] : state_.servers())
            for (auto& r : s.sessions) {
                json j = r;
                j["server_id"] = id;
                j["host"] = s.host;
                sessions.push_back(std::move(j));
            }
        return ok({{"sessions", sessions}});
    }
    if (method == "gpu.cordon" || method == "gpu.uncordon") {
        bool on = method == "gpu.cordon";
        std::string target = field(body, {"uuid", "target", "host", "server_id"});
        auto r = state_.cordon(target, on, changes);
        if (!r) return fail(r.error());
        json gpus = json::array(), servers = json::array();
        for (auto& uuid : r->gpus) {
            auto& g = state_.gpus().at(uuid);
            auto* s = state_.server_of_gpu(uuid);
            gpus.push_back({{"uuid", uuid}, {"index", g.info.index}, {"host", s ? s->host : ""}});
        }
        for (auto& id : r->servers)
            servers.push_back({{"server_id", id}, {"host", state_.servers().at(id).host}});
        VCUDA_LOG_INFO("{} {}", on ? "cordoned" : "uncordoned", target);
        return ok({{"gpus", gpus}, {"servers", servers}});
    }
    if (method == "server.drain") {
        std::string target = field(body, {"host", "server_id", "target"});
        auto r = state_.drain(target, changes);
        if (!r) return fail(r.error());
        uint32_t left = 0;
        for (auto& id : *r) left += state_.leases_on_server(id);
        VCUDA_LOG_INFO("draining {}: {} leases left", target, left);
        return ok({{"servers", *r}, {"leases_left", left}});
    }
    return fail(errc::unknown_method,
                "unknown method '" + std::string(method) +
                    "'; this manager knows server.register, server.heartbeat, lease.acquire, "
                    "lease.renew, lease.release, gpus.list, servers.list, leases.list, "
                    "sessions.list, gpu.cordon, gpu.uncordon, server.drain");
}

}  // namespace vcuda::mgmt
