#include "mgmt/daemon/service.hpp"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <optional>

#include "common/log.hpp"
#include "mgmt/daemon/metrics.hpp"
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

constexpr const char* how_to_get_a_credential =
    "set VCUDA_CREDENTIAL=<credential> or pass --credential FILE (an operator makes one with `vcuda tokens "
    "create --tenant NAME`)";

bool valid_tenant_name(const std::string& t) {
    if (t.empty() || t.size() > 64) return false;
    return std::all_of(t.begin(), t.end(), [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
               c == '_' || c == '.' || c == '@';
    });
}

// What each method needs: servers' methods the shared secret, operator methods an operator; the rest any
// authenticated caller (lease ownership is checked where the lease is known).
enum class needs { cluster, operator_, anyone };
needs requirement(std::string_view method) {
    if (method == "server.register" || method == "server.heartbeat") return needs::cluster;
    if (method == "gpu.cordon" || method == "gpu.uncordon" || method == "server.drain" ||
        method == "lease.migrate" || method == "events.list" || method == "tokens.create" ||
        method == "tokens.list" || method == "tokens.revoke")
        return needs::operator_;
    return needs::anyone;
}

}  // namespace

std::string principal::describe() const {
    switch (who) {
        case kind::anonymous:
            return "an unauthenticated caller";
        case kind::cluster:
            return "the shared secret";
        case kind::tenant:
            return "tenant " + tenant + (is_operator ? " (operator)" : "") + " with credential " +
                   credential_id;
    }
    return "?";
}

service::service(service_config cfg, std::unique_ptr<sqlite_store> store, clock_fn clock,
                 std::function<std::string()> new_id)
    : cfg_(std::move(cfg)),
      store_(std::move(store)),
      clock_(std::move(clock)),
      state_(cfg_.state, std::move(new_id)) {
    if (cfg_.rebalance) rebalancer_.emplace(*cfg_.rebalance);
    if (!clock_)
        clock_ = [] {
            return std::chrono::time_point_cast<std::chrono::milliseconds>(std::chrono::system_clock::now());
        };
}

result<void, std::string> service::start() {
    std::lock_guard lock(mutex_);
    if (!store_) return {};
    auto creds = store_->load_credentials();
    if (!creds) return unexpected{creds.error()};
    for (auto& c : *creds) credentials_[c.id] = c;
    auto snap = store_->load();
    if (!snap) return unexpected{snap.error()};
    size_t leases = snap->leases.size(), servers = snap->servers.size(), gpus = snap->gpus.size();
    state_.load(std::move(*snap), clock_());
    // load() extended leases to give their clients time to renew: write that down too.
    state_changes changes;
    for (auto& [id, l] : state_.leases()) changes.leases_put.push_back(id);
    if (!persist(changes)) return unexpected{std::string("cannot write the database ") + store_->path()};
    VCUDA_LOG_INFO("state from {}: {} servers, {} GPUs, {} leases, {} credentials", store_->path(), servers,
                   gpus, leases, credentials_.size());
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
    time_ms now = clock_();
    note_move_outcomes(r.moves_given_up, now);
    if (rebalancer_) {
        auto d = rebalancer_->step(state_, now);
        switch (d.what) {
            case rebalance_decision::kind::none:
                break;
            case rebalance_decision::kind::move:
                last_standstill_.clear();
                if (auto l = ask_move(d.plan, "rebalance", "rebalance: " + d.detail, now); l)
                    rebalancer_->moved(now);
                else
                    event(now, "rebalance", d.plan.lease_id, d.detail + ": not asked: " + l.error().message);
                break;
            case rebalance_decision::kind::no_candidate:
            case rebalance_decision::kind::held_back: {
                // The same standstill again (same GPUs, same reason) is logged, not made an event again.
                std::string why =
                    d.detail.substr(d.detail.find(": ") == std::string::npos ? 0 : d.detail.find(": "));
                std::string key = std::to_string(static_cast<int>(d.what)) + d.hot_uuid + d.cool_uuid + why;
                if (key != last_standstill_) {
                    last_standstill_ = key;
                    event(now, "rebalance", "", d.detail);
                } else {
                    VCUDA_LOG_DEBUG("rebalance: {}", d.detail);
                }
                break;
            }
        }
    }
    persist(changes);
}

std::string service::describe_gpu(const std::string& uuid) const {
    const server_record* s = state_.server_of_gpu(uuid);
    return "GPU " + uuid + (s ? " (" + s->host + ", " + s->id + ")" : std::string());
}

mgmt_result<lease_record> service::ask_move(const manager_state::move_plan& plan, const std::string& kind,
                                            const std::string& reason, time_ms now) {
    auto l = state_.request_move(plan, reason, now);
    if (!l) return l;
    event(now, kind, plan.lease_id,
          "move from " + describe_gpu(plan.from_uuid) + " to " + describe_gpu(plan.to_uuid) + " asked (" +
              reason + "); its server acts at its next heartbeat");
    return l;
}

void service::note_move_outcomes(const std::vector<manager_state::move_outcome>& outcomes, time_ms now) {
    for (auto& o : outcomes) {
        std::string took = std::to_string(o.took.count()) + " ms after it was asked";
        if (o.moved)
            event(now, "moved", o.lease_id,
                  "from " + describe_gpu(o.from_uuid) + " to " + describe_gpu(o.to_uuid) + ", " + took +
                      ": " + o.note + " (" + o.reason + ")");
        else
            event(now, "not-moved", o.lease_id,
                  "from " + describe_gpu(o.from_uuid) + " to " + describe_gpu(o.to_uuid) + ": " +
                      (o.note.empty() ? std::string("no reason given") : o.note) +
                      "; it stays where it was (" + o.reason + ")");
    }
}

void service::sign_move_tokens(std::vector<active_lease>& leases, time_ms now) const {
    // The target checks the token when the state arrives, after the gate closed and the state was saved
    // (seconds for a large session), so it lives at least move_token_life, however soon the lease would
    // expire without a renewal. A lease that ends meanwhile is still refused there: the target was told it
    // is alive (the pending move), and refuses the tokens of leases that were alive and are no longer.
    const int64_t until = std::max(to_unix_ms(now + move_token_life), int64_t{0});
    for (auto& a : leases)
        if (!a.move_to_uuid.empty()) {
            auto l = state_.leases().find(a.lease_id);
            a.move_token =
                sign_token(cfg_.secret, {a.lease_id, a.move_to_uuid, a.memory_quota,
                                         std::chrono::system_clock::time_point(
                                             std::chrono::milliseconds(std::max(a.expires_at, until))),
                                         l != state_.leases().end() ? l->second.tenant : std::string()});
        }
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
        dg.token = sign_token(
            cfg_.secret, {l.id, d.uuid, d.memory_quota,
                          std::chrono::system_clock::time_point(l.expires_at.time_since_epoch()), l.tenant});
        g.devices.push_back(std::move(dg));
    }
    return encode(g);
}

result<principal, service_reply> service::authenticate(std::string_view method, std::string_view body,
                                                       std::string_view auth, time_ms now) {
    principal p;
    if (auth.empty()) return p;
    if (is_signed_request(auth)) {
        auto r = verify_request(cfg_.secret, auth, method, body,
                                std::chrono::system_clock::time_point(now.time_since_epoch()));
        if (!r)
            return unexpected{fail(errc::unauthenticated, std::string(method) + " refused: " + r.error())};
        // Each signature once: forget what is older than the window, then refuse a nonce seen before.
        int64_t oldest = to_unix_ms(now) - 2 * request_window.count();
        if (nonces_.size() > 1024) std::erase_if(nonces_, [&](auto& kv) { return kv.second < oldest; });
        if (!nonces_.emplace(r->nonce, r->at_ms).second)
            return unexpected{fail(errc::unauthenticated,
                                   std::string(method) +
                                       " refused: this signed request was already used (a replay); sign each "
                                       "request afresh")};
        p.who = principal::kind::cluster;
        p.is_operator = true;
        p.tenant = "secret-file";
        return p;
    }
    auto parts = parse_credential(auth);
    if (!parts)
        return unexpected{fail(errc::unauthenticated, std::string(method) + " refused: " + parts.error())};
    auto it = credentials_.find(parts->id);
    if (it == credentials_.end() || !same_hash(it->second.hash, parts->hash))
        return unexpected{
            fail(errc::unauthenticated, std::string(method) +
                                            " refused: this manager did not issue that credential "
                                            "(or it was altered); " +
                                            how_to_get_a_credential)};
    auto& c = it->second;
    if (c.revoked)
        return unexpected{fail(errc::unauthenticated, std::string(method) + " refused: credential " + c.id +
                                                          " of tenant " + c.tenant +
                                                          " was revoked; ask an operator for a new one")};
    if (to_unix_ms(c.expires_at) != 0 && now >= c.expires_at)
        return unexpected{fail(errc::unauthenticated, std::string(method) + " refused: credential " + c.id +
                                                          " of tenant " + c.tenant +
                                                          " has expired; ask an operator for a new one")};
    p.who = principal::kind::tenant;
    p.tenant = c.tenant;
    p.credential_id = c.id;
    p.is_operator = c.is_operator;
    return p;
}

service_reply service::handle(std::string_view method, std::string_view body, std::string_view auth) {
    std::lock_guard lock(mutex_);
    state_changes changes;
    service_reply r;
    time_ms now = clock_();
    auto who = authenticate(method, body, auth, now);
    if (!who) {
        VCUDA_LOG_WARN("{}: {}", method, who.error().error);
        return who.error();
    }
    switch (requirement(method)) {
        case needs::cluster:
            if (who->who != principal::kind::cluster)
                return fail(
                    who->who == principal::kind::anonymous ? errc::unauthenticated : errc::forbidden,
                    std::string(method) +
                        " refused: only a vcuda-server may call it, signing with the manager's shared "
                        "secret; start vcuda-server with the same --secret-file as vcuda-mgmt");
            break;
        case needs::operator_:
            if (!who->is_operator) {
                std::string why =
                    std::string(method) + " refused: this command needs an operator credential" +
                    (who->who == principal::kind::anonymous ? " and none was given"
                                                            : " (" + who->describe() + " is not one)") +
                    ": set VCUDA_CREDENTIAL=<operator credential> or pass --credential FILE (one made with "
                    "`vcuda tokens create --tenant NAME --operator`), or, on a host with the manager's "
                    "secret "
                    "file, pass --secret-file FILE";
                VCUDA_LOG_WARN("{}", why);
                return fail(who->who == principal::kind::anonymous ? errc::unauthenticated : errc::forbidden,
                            why);
            }
            break;
        case needs::anyone:
            if (who->who == principal::kind::anonymous)
                return fail(errc::unauthenticated, std::string(method) +
                                                       " refused: the manager serves only callers with a "
                                                       "credential: " +
                                                       how_to_get_a_credential);
            break;
    }
    try {
        r = dispatch(method, body, now, *who, changes);
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
                                const principal& who, state_changes& changes) {
    json body = body_text.empty() ? json::object() : json::parse(body_text, nullptr, false);
    if (body.is_discarded() || !body.is_object())
        return fail(errc::bad_request, "the request body is not a JSON object");
    // Only the lease's tenant, or an operator, may renew or release it.
    auto may_touch = [&](const std::string& lease_id) -> std::optional<service_reply> {
        auto it = state_.leases().find(lease_id);
        if (it == state_.leases().end() || who.is_operator || it->second.tenant == who.tenant) return {};
        VCUDA_LOG_WARN("{} refused: lease {} belongs to {}, not to {}", method, lease_id,
                       it->second.tenant.empty() ? "no tenant" : "tenant " + it->second.tenant,
                       who.describe());
        return fail(errc::forbidden, std::string(method) + " refused: lease " + lease_id + " belongs to " +
                                         (it->second.tenant.empty() ? std::string("no tenant")
                                                                    : "tenant " + it->second.tenant) +
                                         "; only its tenant or an operator may renew or release it");
    };
    auto sees = [&](const std::string& lease_id) {
        if (who.is_operator) return true;
        auto it = state_.leases().find(lease_id);
        return it != state_.leases().end() && it->second.tenant == who.tenant;
    };
    if (method.starts_with("tokens.")) return tokens(method, body, now, who);

    if (method == "server.register") {
        auto reg = decode<server_registration>(body_text);
        if (!reg) return fail(errc::bad_request, reg.error());
        auto id = state_.register_server(*reg, now, changes);
        const std::string key =
            reg->host + " " + dump(json(reg->endpoints)) + " " + std::to_string(reg->address_window);
        if (!id) {
            if (id.error().code == errc::address_window_taken && refused_windows_.insert(key).second)
                VCUDA_LOG_WARN("server.register from host {} (endpoints {}) refused: {}", reg->host,
                               dump(json(reg->endpoints)), id.error().message);
            return fail(id.error());
        }
        refused_windows_.erase(key);
        const int32_t window = state_.servers().at(*id).address_window;
        VCUDA_LOG_INFO("server {} registered: host {}, {} GPUs, endpoints {}, address window {}{}", *id,
                       reg->host, reg->gpus.size(), dump(json(reg->endpoints)),
                       window >= 0 ? std::to_string(window) : "none",
                       window != reg->address_window
                           ? " (it asked for " + std::to_string(reg->address_window) + ", another server's)"
                           : "");
        if (window != reg->address_window)
            event(now, "window", "",
                  "server " + *id + " (host " + reg->host + ") chose address window " +
                      std::to_string(reg->address_window) + ", another server's: given window " +
                      std::to_string(window));
        return ok(
            {{"server_id", *id},
             {"address_window", window},
             {"heartbeat_interval_ms", std::max<int64_t>(cfg_.state.heartbeat_timeout.count() / 3, 100)}});
    }
    if (method == "server.heartbeat") {
        auto hb = decode<heartbeat>(body_text);
        if (!hb) return fail(errc::bad_request, hb.error());
        bool was_down = state_.servers().contains(hb->server_id) && state_.servers().at(hb->server_id).down;
        if (auto s = state_.servers().find(hb->server_id); s != state_.servers().end())
            note_session_changes(s->second, *hb, now);
        auto r = state_.heartbeat(*hb, now, changes);
        if (!r) return fail(r.error());
        if (was_down) VCUDA_LOG_INFO("server {} is back", hb->server_id);
        if (auto settled = state_.settle_moves(*hb, now, changes); !settled.empty()) {
            note_move_outcomes(settled, now);
            r->leases = state_.active_leases_on(hb->server_id);
        }
        if (cfg_.idle_suspend_after.count() > 0) {
            auto asked = state_.reclaim_idle(hb->server_id, cfg_.idle_suspend_after, now);
            for (auto& id : asked)
                event(now, "idle-reclaim", id,
                      "no call for " + std::to_string(cfg_.idle_suspend_after.count() / 1000) +
                          " s: suspend asked (--idle-suspend-after)");
            if (!asked.empty()) r->leases = state_.active_leases_on(hb->server_id);
        }
        sign_move_tokens(r->leases, now);
        return ok(json(*r));
    }
    if (method == "lease.acquire") {
        auto req = decode<lease_request>(body_text);
        if (!req) return fail(errc::bad_request, req.error());
        auto l = state_.acquire(*req, now, changes, who.tenant);
        if (!l) {
            VCUDA_LOG_INFO("lease for {} pid {} refused: {}", req->client_host, req->pid, l.error().message);
            return fail(l.error());
        }
        std::string devices;
        for (auto& d : l->devices) devices += (devices.empty() ? "" : ", ") + d.uuid;
        VCUDA_LOG_INFO("lease {} for tenant {} ({} pid {}): {}", l->id, who.tenant, l->client_host, l->pid,
                       devices);
        service_reply r;
        r.body = grant_json(*l);
        return r;
    }
    if (method == "lease.renew") {
        if (auto no = may_touch(field(body, {"lease_id"}))) return *no;
        auto l = state_.renew(field(body, {"lease_id"}), now, changes);
        if (!l) return fail(l.error());
        service_reply r;
        r.body = grant_json(*l);
        return r;
    }
    if (method == "lease.release") {
        if (auto no = may_touch(field(body, {"lease_id"}))) return *no;
        auto l = state_.release(field(body, {"lease_id"}), changes);
        if (!l) return fail(l.error());
        VCUDA_LOG_INFO("lease {} of tenant {} released by {}", l->id, l->tenant, who.describe());
        return ok(json::object());
    }
    if (method == "lease.suspend" || method == "lease.resume") {
        const bool resume = method == "lease.resume";
        std::string lease_id = field(body, {"lease_id"});
        if (auto no = may_touch(lease_id)) return *no;
        auto l = state_.request_suspend(lease_id, resume, now);
        if (!l) return fail(l.error());
        event(now, resume ? "resume" : "suspend", lease_id,
              std::string(resume ? "resume" : "suspend") + " asked by " + who.describe());
        return ok({{"lease_id", lease_id}, {"suspend_seq", l->suspend_seq}, {"resume_seq", l->resume_seq}});
    }
    if (method == "lease.migrate") {
        std::string what = field(body, {"target", "lease_id", "session_id"});
        std::string to = field(body, {"to"});
        auto device = state_.find_lease_device(what);
        if (!device) return fail(device.error());
        auto plan = state_.plan_move(device->first, device->second, to);
        if (!plan) {
            event(now, "migrate", device->first,
                  "move" + (to.empty() ? std::string() : " to " + to) + " asked by " + who.describe() +
                      ": refused: " + plan.error().message);
            return fail(plan.error());
        }
        auto l = ask_move(*plan, "migrate", "asked by " + who.describe(), now);
        if (!l) return fail(l.error());
        const server_record* target = state_.server_of_gpu(plan->to_uuid);
        return ok({{"lease_id", plan->lease_id},
                   {"from_uuid", plan->from_uuid},
                   {"to_uuid", plan->to_uuid},
                   {"to_host", target ? target->host : ""},
                   {"to_server_id", target ? target->id : ""},
                   {"move_seq", l->devices[plan->device].move_seq}});
    }
    if (method == "events.list") {
        json events = json::array();
        for (auto& e : events_)
            events.push_back(
                {{"at", e.at}, {"kind", e.kind}, {"lease_id", e.lease_id}, {"detail", e.detail}});
        return ok({{"events", events}});
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
            servers.push_back({{"server_id", id},
                               {"host", s.host},
                               {"endpoints", s.endpoints},
                               {"address_window", s.address_window >= 0 ? json(s.address_window) : json()},
                               {"state", state_.server_state(s)},
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
            if (!sees(id)) continue;  // tenants see their own leases; operators all
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
                              {"tenant", l.tenant},
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
                // A session that moved is reported once more by the server it left: it lives elsewhere.
                if (!sees(r.lease_id) || !r.moved_to.empty()) continue;
                json j = r;
                j["server_id"] = id;
                j["host"] = s.host;
                // A move under way: from here (moving_to) or to here (arriving_from).
                if (auto l = state_.leases().find(r.lease_id); l != state_.leases().end())
                    for (auto& d : l->second.devices) {
                        if (!d.move) continue;
                        if (d.uuid == r.gpu_uuid) j["moving_to"] = d.move->to_uuid;
                        if (d.move->to_uuid == r.gpu_uuid) j["arriving_from"] = d.uuid;
                    }
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
        auto wait = body.find("wait");
        if (wait != body.end() && !wait->is_boolean())
            return fail(errc::bad_request, "'wait' must be true or false");
        const bool only_wait = wait != body.end() && wait->get<bool>();
        auto r = state_.drain(target, changes);
        if (!r) return fail(r.error());
        uint32_t left = 0;
        for (auto& id : *r) left += state_.leases_on_server(id);
        VCUDA_LOG_INFO("draining {}: {} leases left", target, left);
        json moving = json::array(), staying = json::array();
        if (!only_wait) {
            // Every lease device on the drained servers' GPUs moves elsewhere (their GPUs take nothing now).
            std::vector<std::pair<std::string, size_t>> on_them;
            for (auto& [id, l] : state_.leases())
                for (size_t i = 0; i < l.devices.size(); ++i) {
                    const server_record* s = state_.server_of_gpu(l.devices[i].uuid);
                    if (s && std::find(r->begin(), r->end(), s->id) != r->end()) on_them.emplace_back(id, i);
                }
            const std::string reason = "drain of " + target + " asked by " + who.describe();
            for (auto& [lease_id, i] : on_them) {
                const lease_device& d = state_.leases().at(lease_id).devices[i];
                if (d.move) {
                    moving.push_back(
                        {{"lease_id", lease_id}, {"from_uuid", d.uuid}, {"to_uuid", d.move->to_uuid}});
                    continue;
                }
                auto plan = state_.plan_move(lease_id, i, "");
                mgmt_result<lease_record> asked = plan ? ask_move(*plan, "drain", reason, now)
                                                       : mgmt_result<lease_record>(unexpected{plan.error()});
                if (asked) {
                    moving.push_back(
                        {{"lease_id", lease_id}, {"from_uuid", plan->from_uuid}, {"to_uuid", plan->to_uuid}});
                } else {
                    event(now, "drain", lease_id,
                          "not moved from " + describe_gpu(d.uuid) + ": " + asked.error().message +
                              "; it runs out there (" + reason + ")");
                    staying.push_back(
                        {{"lease_id", lease_id}, {"uuid", d.uuid}, {"why", asked.error().message}});
                }
            }
        }
        return ok({{"servers", *r}, {"leases_left", left}, {"moving", moving}, {"staying", staying}});
    }
    return fail(errc::unknown_method,
                "unknown method '" + std::string(method) +
                    "'; this manager knows server.register, server.heartbeat, lease.acquire, "
                    "lease.renew, lease.release, gpus.list, servers.list, leases.list, "
                    "sessions.list, gpu.cordon, gpu.uncordon, server.drain, lease.suspend, lease.resume, "
                    "lease.migrate, events.list, tokens.create, tokens.list, tokens.revoke");
}

std::string service::metrics() {
    std::lock_guard lock(mutex_);
    return manager_metrics(state_, events_total_, clock_());
}

void service::event(time_ms now, std::string kind, std::string lease_id, std::string detail) {
    VCUDA_LOG_INFO("{}{}: {}", kind, lease_id.empty() ? "" : " " + lease_id, detail);
    ++events_total_[kind];
    events_.push_back({to_unix_ms(now), std::move(kind), std::move(lease_id), std::move(detail)});
    if (events_.size() > max_events) events_.pop_front();
}

void service::note_session_changes(const server_record& before, const heartbeat& hb, time_ms now) {
    for (auto& r : hb.sessions) {
        // Moves' outcomes are settled and recorded with the move (note_move_outcomes).
        if (r.note.empty() || r.note.starts_with("moved to ") || r.note.starts_with("not moved: ")) continue;
        auto old = std::find_if(before.sessions.begin(), before.sessions.end(), [&](const session_report& b) {
            return b.session_id == r.session_id && b.gpu_uuid == r.gpu_uuid;
        });
        if (old != before.sessions.end() && old->note == r.note) continue;
        event(now, "session", r.lease_id,
              "server " + hb.server_id + ", session " + r.session_id + ": " + r.note);
    }
}

service_reply service::tokens(std::string_view method, const json& body, time_ms now, const principal& who) {
    auto record_json = [](const credential_record& c) {
        return json{{"id", c.id},
                    {"tenant", c.tenant},
                    {"operator", c.is_operator},
                    {"created_at", to_unix_ms(c.created_at)},
                    {"expires_at", to_unix_ms(c.expires_at)},
                    {"revoked", c.revoked},
                    {"created_by", c.created_by}};
    };
    if (method == "tokens.create") {
        std::string tenant = field(body, {"tenant"});
        if (!valid_tenant_name(tenant))
            return fail(errc::bad_request,
                        "'tenant' must be 1-64 letters, digits or - _ . @ (e.g. --tenant alice)");
        auto op = body.find("operator");
        auto ttl = body.find("ttl_ms");
        if ((op != body.end() && !op->is_boolean()) ||
            (ttl != body.end() && (!ttl->is_number_integer() || ttl->get<int64_t>() < 0)))
            return fail(errc::bad_request, "'operator' must be true or false and 'ttl_ms' a number of ms");
        auto made = make_credential();
        credential_record c;
        c.id = made.id;
        c.tenant = tenant;
        c.is_operator = op != body.end() && op->get<bool>();
        c.hash = made.hash;
        c.created_at = now;
        int64_t ttl_ms = ttl != body.end() ? ttl->get<int64_t>() : 0;
        c.expires_at = ttl_ms > 0 ? now + std::chrono::milliseconds(ttl_ms) : time_ms{};
        c.created_by = who.who == principal::kind::cluster ? "secret-file" : who.credential_id;
        if (store_)
            if (auto r = store_->put_credential(c); !r) {
                VCUDA_LOG_ERROR("{}", r.error());
                return fail(errc::internal, "the manager cannot write its database " + store_->path() +
                                                "; check the disk and the manager's log");
            }
        credentials_[c.id] = c;
        VCUDA_LOG_INFO("credential {} for tenant {}{} made by {}", c.id, c.tenant,
                       c.is_operator ? " (operator)" : "", who.describe());
        json j = record_json(c);
        j["credential"] = made.text;
        return ok(j);
    }
    if (method == "tokens.list") {
        json all = json::array();
        for (auto& [id, c] : credentials_) all.push_back(record_json(c));
        return ok({{"credentials", all}});
    }
    if (method == "tokens.revoke") {
        std::string id = field(body, {"id"});
        auto it = credentials_.find(id);
        if (it == credentials_.end())
            return fail(errc::not_found, "no credential '" + id + "': `vcuda tokens list` shows their ids");
        credential_record c = it->second;
        if (!c.revoked) {
            c.revoked = true;
            c.revoked_at = now;
            if (store_)
                if (auto r = store_->put_credential(c); !r) {
                    VCUDA_LOG_ERROR("{}", r.error());
                    return fail(errc::internal, "the manager cannot write its database " + store_->path() +
                                                    "; check the disk and the manager's log");
                }
            it->second = c;
            VCUDA_LOG_INFO("credential {} of tenant {} revoked by {}", c.id, c.tenant, who.describe());
        }
        return ok(record_json(c));
    }
    return fail(errc::unknown_method, "unknown method '" + std::string(method) +
                                          "'; the credential methods are tokens.create, tokens.list, "
                                          "tokens.revoke");
}

}  // namespace vcuda::mgmt
