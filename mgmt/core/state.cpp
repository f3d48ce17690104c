#include "mgmt/core/state.hpp"

#include <algorithm>
#include <cctype>
#include <random>
#include <set>
#include <tuple>

#include "mgmt/wire/units.hpp"

namespace vcuda::mgmt {

namespace {

std::string lower(std::string_view s) {
    std::string out(s);
    for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return out;
}

// The host part of "host:port", "[v6]:port", "tcp://host:port"; empty for unix: endpoints.
std::string endpoint_host(std::string_view ep) {
    if (ep.starts_with("unix:")) return {};
    if (ep.starts_with("tcp://")) ep.remove_prefix(6);
    auto colon = ep.rfind(':');
    std::string_view h = colon == std::string_view::npos ? ep : ep.substr(0, colon);
    if (h.starts_with('[') && h.ends_with(']')) h = h.substr(1, h.size() - 2);
    return std::string(h);
}

bool is_local(const server_record& s, const std::string& client_host) {
    if (client_host.empty()) return false;
    std::string c = lower(client_host);
    if (lower(s.host) == c) return true;
    for (auto& ep : s.endpoints)
        if (lower(endpoint_host(ep)) == c) return true;
    return false;
}

}  // namespace

manager_state::manager_state(state_config cfg, std::function<std::string()> new_id)
    : cfg_(cfg), new_id_(std::move(new_id)) {}

std::string manager_state::make_id(const char* prefix) {
    for (;;) {
        std::string suffix;
        if (new_id_) {
            suffix = new_id_();
        } else {
            static thread_local std::mt19937_64 rng{std::random_device{}()};
            static constexpr char hex[] = "0123456789abcdef";
            uint64_t v = rng() ^ ++counter_;
            for (int i = 0; i < 12; ++i, v >>= 4) suffix.push_back(hex[v & 15]);
        }
        std::string id = std::string(prefix) + suffix;
        if (!servers_.contains(id) && !leases_.contains(id)) return id;
    }
}

void manager_state::load(state_snapshot snap, time_ms now) {
    servers_.clear();
    gpus_.clear();
    leases_.clear();
    for (auto& s : snap.servers) {
        s.last_heartbeat = now;
        s.sessions.clear();
        servers_[s.id] = std::move(s);
    }
    for (auto& g : snap.gpus) {
        g.load_reported = false;
        g.load = gpu_load{g.info.uuid};
        gpus_[g.info.uuid] = std::move(g);
    }
    for (auto& l : snap.leases) {
        l.expires_at = std::max(l.expires_at, now + cfg_.lease_ttl);
        leases_[l.id] = std::move(l);
    }
}

state_snapshot manager_state::snapshot() const {
    state_snapshot s;
    for (auto& [_, v] : servers_) s.servers.push_back(v);
    for (auto& [_, v] : gpus_) s.gpus.push_back(v);
    for (auto& [_, v] : leases_) s.leases.push_back(v);
    return s;
}

// ------------------------------------------------------------------------------------------------ servers

mgmt_result<std::string> manager_state::register_server(const server_registration& reg, time_ms now,
                                                        state_changes& changes) {
    if (reg.host.empty()) return unexpected{mgmt_error{errc::bad_request, "server.register needs 'host'"}};
    if (reg.endpoints.empty())
        return unexpected{mgmt_error{errc::bad_request,
                                     "server.register needs at least one endpoint clients can connect to "
                                     "(start vcuda-server with --listen HOST:PORT)"}};
    std::set<std::string> seen;
    for (auto& g : reg.gpus) {
        if (g.uuid.empty()) return unexpected{mgmt_error{errc::bad_request, "every GPU needs a 'uuid'"}};
        if (!seen.insert(g.uuid).second)
            return unexpected{mgmt_error{errc::bad_request, "GPU " + g.uuid + " is listed twice"}};
    }

    if (reg.address_window < -1 || reg.address_window >= address_window_count)
        return unexpected{mgmt_error{errc::bad_request, "address_window must be -1 (none) or 0-" +
                                                            std::to_string(address_window_count - 1)}};

    server_record* server = nullptr;
    for (auto& [id, s] : servers_)
        if (s.host == reg.host && s.endpoints == reg.endpoints) server = &s;
    int32_t window = reg.address_window;
    if (reg.address_window >= 0) {
        // Another server in the same window would hand out the same device addresses: one client leasing GPUs
        // of both could not tell their memory apart, and sessions moved between them would collide. A record
        // this registration replaces (the same server, or one whose GPUs it now reports) does not count.
        std::set<int32_t> taken;
        const server_record* holder = nullptr;
        for (auto& [id, s] : servers_) {
            if (&s == server || s.address_window < 0) continue;
            const std::string& holder_id = id;  // a structured binding cannot be captured (C++17)
            const bool replaced =
                std::any_of(reg.gpus.begin(), reg.gpus.end(), [&](const gpu_description& d) {
                    auto g = gpus_.find(d.uuid);
                    return g != gpus_.end() && g->second.server_id == holder_id;
                });
            if (replaced) continue;
            taken.insert(s.address_window);
            if (s.address_window == reg.address_window) holder = &s;
        }
        // A server that chose its window itself takes a free one: the one it had here, else the lowest.
        if (holder && reg.address_window_auto) {
            int32_t w = server && server->address_window >= 0 && !taken.contains(server->address_window)
                            ? server->address_window
                            : 0;
            while (w < address_window_count && taken.contains(w)) ++w;
            if (w < address_window_count) {
                window = w;
                holder = nullptr;
            }
        }
        if (holder) {
            std::string free;
            int listed = 0;
            for (int32_t w = 0; w < address_window_count; ++w) {
                if (taken.contains(w)) continue;
                if (listed++ == 8) {
                    free += ", ...";
                    break;
                }
                free += (free.empty() ? "" : ", ") + std::to_string(w);
            }
            std::string where = holder->host;
            for (auto& e : holder->endpoints) where += " " + e;
            return unexpected{mgmt_error{
                errc::address_window_taken,
                "address window " + std::to_string(reg.address_window) + " is server " + holder->id + "'s (" +
                    where + (holder->down ? ", down" : "") +
                    "): two servers in one window hand out the same device addresses; start this server "
                    "with --address-window N, a free one (" +
                    (free.empty() ? std::string("none left") : free) + ")"}};
        }
    }
    if (!server) {
        std::string id = make_id("srv-");
        server = &servers_[id];
        server->id = id;
        server->host = reg.host;
        server->endpoints = reg.endpoints;
        server->registered_at = now;
    }
    server->address_window = window;
    server->down = false;
    server->last_heartbeat = now;
    server->sessions.clear();

    // GPUs of this server that it no longer reports are forgotten (their leases stay until they run out).
    std::set<std::string> previous_owners;
    for (auto it = gpus_.begin(); it != gpus_.end();) {
        if (it->second.server_id == server->id && !seen.contains(it->first))
            it = gpus_.erase(it);
        else
            ++it;
    }
    for (auto& d : reg.gpus) {
        auto& g = gpus_[d.uuid];
        if (!g.server_id.empty() && g.server_id != server->id) previous_owners.insert(g.server_id);
        g.info = d;
        g.server_id = server->id;
        if (!g.load_reported) g.load = gpu_load{d.uuid};
    }
    changes.servers_put.push_back(server->id);
    // A server whose GPUs all moved here (it came back on another address) is gone.
    for (auto& old : previous_owners) {
        bool has_gpus =
            std::any_of(gpus_.begin(), gpus_.end(), [&](auto& kv) { return kv.second.server_id == old; });
        if (!has_gpus) {
            servers_.erase(old);
            changes.servers_deleted.push_back(old);
        }
    }
    return server->id;
}

mgmt_result<heartbeat_reply> manager_state::heartbeat(const mgmt::heartbeat& hb, time_ms now,
                                                      state_changes& changes) {
    auto it = servers_.find(hb.server_id);
    if (it == servers_.end())
        return unexpected{mgmt_error{
            errc::unknown_server, "server id '" + hb.server_id + "' is not registered here; register again"}};
    auto& s = it->second;
    if (hb.address_window != s.address_window)
        return unexpected{
            mgmt_error{errc::unknown_server, "server " + s.id + " is registered here with address window " +
                                                 std::to_string(s.address_window) + ", not " +
                                                 std::to_string(hb.address_window) + "; register again"}};
    s.last_heartbeat = now;
    if (s.down) {
        s.down = false;
        changes.servers_put.push_back(s.id);
    }
    for (auto& load : hb.gpus) {
        auto g = gpus_.find(load.uuid);
        if (g == gpus_.end() || g->second.server_id != s.id) continue;
        g->second.load = load;
        g->second.load.utilization = std::min<uint32_t>(load.utilization, 100);
        g->second.load_reported = true;
    }
    s.sessions = hb.sessions;
    heartbeat_reply reply;
    reply.leases = active_leases_on(s.id);
    reply.heartbeat_interval_ms = std::max<int64_t>(cfg_.heartbeat_timeout.count() / 3, 100);
    return reply;
}

// ------------------------------------------------------------------------------------------------ leases

mgmt_result<lease_record> manager_state::acquire(const lease_request& req, time_ms now,
                                                 state_changes& changes, const std::string& tenant) {
    if (req.gpus == 0 || req.gpus > cfg_.max_gpus_per_lease)
        return unexpected{mgmt_error{
            errc::bad_request, "'gpus' must be between 1 and " + std::to_string(cfg_.max_gpus_per_lease)}};
    const bool exclusive = req.hints.exclusive;
    const std::string model = lower(req.hints.model);

    struct candidate {
        gpu_view v;
        uint64_t quota;
        std::tuple<int, uint64_t, uint32_t, uint32_t, uint32_t, std::string, uint32_t> key;
    };
    std::vector<candidate> candidates;
    size_t total = 0, unavailable = 0, wrong_model = 0, too_small = 0, full = 0;
    for (auto& [uuid, g] : gpus_) {
        ++total;
        gpu_view v = view(g);
        if (!v.server || v.state != "up") {
            ++unavailable;
            continue;
        }
        if (!model.empty() && lower(g.info.name).find(model) == std::string::npos) {
            ++wrong_model;
            continue;
        }
        uint64_t mem = g.info.memory;
        uint64_t quota = exclusive || req.memory_per_gpu == 0 ? mem : req.memory_per_gpu;
        if (req.memory_per_gpu > mem) {
            ++too_small;
            continue;
        }
        bool fits = exclusive ? v.leases == 0
                              : !v.exclusive && v.leased_memory <= mem && quota <= mem - v.leased_memory;
        if (!fits) {
            ++full;
            continue;
        }
        uint64_t leftover = mem - v.leased_memory - quota;
        candidates.push_back({v,
                              quota,
                              {is_local(*v.server, req.client_host) ? 0 : 1, leftover, g.load.utilization,
                               g.load.sessions, v.leases, v.server->host, g.info.index}});
    }
    std::stable_sort(candidates.begin(), candidates.end(), [](auto& a, auto& b) { return a.key < b.key; });

    std::vector<const candidate*> picked;
    if (req.hints.same_host) {
        std::set<std::string> tried;
        for (auto& c : candidates) {
            const std::string& host = c.v.server->host;
            if (!tried.insert(host).second) continue;
            std::vector<const candidate*> on_host;
            for (auto& d : candidates)
                if (d.v.server->host == host && on_host.size() < req.gpus) on_host.push_back(&d);
            if (on_host.size() == req.gpus) {
                picked = std::move(on_host);
                break;
            }
        }
    } else {
        for (auto& c : candidates)
            if (picked.size() < req.gpus) picked.push_back(&c);
    }

    if (picked.size() < req.gpus) {
        std::string what =
            std::to_string(req.gpus) + (req.gpus == 1 ? " GPU" : " GPUs") +
            (exclusive ? " (exclusive)" : "") +
            (req.memory_per_gpu ? " with " + format_size(req.memory_per_gpu) + " each" : " (whole GPU)") +
            (model.empty() ? "" : " of model '" + req.hints.model + "'") +
            (req.hints.same_host ? " on one host" : "");
        std::string why;
        if (total == 0) {
            why = "no GPUs are registered: start vcuda-server with --manager on the GPU hosts";
        } else {
            why = std::to_string(candidates.size()) + " of " + std::to_string(total) + " GPUs can take it";
            if (unavailable) why += "; " + std::to_string(unavailable) + " down, cordoned or draining";
            if (wrong_model) why += "; " + std::to_string(wrong_model) + " of another model";
            if (too_small) why += "; " + std::to_string(too_small) + " smaller than the request";
            if (full) why += "; " + std::to_string(full) + " without enough free memory";
            why +=
                ". Ask for less memory or fewer GPUs, wait for leases to end, or uncordon GPUs (`vcuda gpus` "
                "shows them)";
        }
        return unexpected{mgmt_error{errc::no_capacity, "cannot place " + what + ": " + why + "."}};
    }

    lease_record l;
    l.id = make_id("lease-");
    l.client_host = req.client_host;
    l.pid = req.pid;
    l.tenant = tenant;
    l.exclusive = exclusive;
    l.created_at = now;
    l.expires_at = now + cfg_.lease_ttl;
    for (auto* c : picked) l.devices.push_back({c->v.gpu->info.uuid, c->quota});
    leases_[l.id] = l;
    changes.leases_put.push_back(l.id);
    return l;
}

mgmt_result<lease_record> manager_state::renew(const std::string& lease_id, time_ms now,
                                               state_changes& changes) {
    auto it = leases_.find(lease_id);
    if (it == leases_.end())
        return unexpected{mgmt_error{
            errc::unknown_lease, "lease '" + lease_id + "' is unknown or has expired; acquire a new one"}};
    it->second.expires_at = now + cfg_.lease_ttl;
    changes.leases_put.push_back(lease_id);
    return it->second;
}

mgmt_result<lease_record> manager_state::release(const std::string& lease_id, state_changes& changes) {
    auto it = leases_.find(lease_id);
    if (it == leases_.end())
        return unexpected{mgmt_error{
            errc::unknown_lease,
            "lease '" + lease_id + "' is unknown or has already ended (`vcuda leases` lists them)"}};
    lease_record l = std::move(it->second);
    leases_.erase(it);
    changes.leases_deleted.push_back(lease_id);
    return l;
}

// ------------------------------------------------------------------------------------------------ operators

std::vector<const server_record*> manager_state::servers_matching(const std::string& host_or_id) const {
    std::vector<const server_record*> out;
    if (auto it = servers_.find(host_or_id); it != servers_.end()) return {&it->second};
    std::string h = lower(host_or_id);
    for (auto& [id, s] : servers_)
        if (lower(s.host) == h) out.push_back(&s);
    return out;
}

mgmt_result<manager_state::cordon_result> manager_state::cordon(const std::string& target, bool on,
                                                                state_changes& changes) {
    cordon_result r;
    if (target.empty())
        return unexpected{mgmt_error{errc::bad_request, "name a GPU uuid, a server host or a server id"}};
    if (auto g = gpus_.find(target); g != gpus_.end()) {
        g->second.cordoned = on;
        r.gpus.push_back(target);
        changes.gpus_put.push_back(target);
        return r;
    }
    auto servers = servers_matching(target);
    if (servers.empty())
        return unexpected{
            mgmt_error{errc::not_found, "no GPU uuid, server host or server id '" + target +
                                            "' is known; `vcuda gpus` and `vcuda servers` list them"}};
    for (auto* cs : servers) {
        auto& s = servers_.at(cs->id);
        s.cordoned = on;
        if (!on) {
            s.draining = false;  // uncordon ends a drain too
            for (auto& [uuid, g] : gpus_)
                if (g.server_id == s.id && g.cordoned) {
                    g.cordoned = false;
                    r.gpus.push_back(uuid);
                    changes.gpus_put.push_back(uuid);
                }
        }
        r.servers.push_back(s.id);
        changes.servers_put.push_back(s.id);
    }
    return r;
}

mgmt_result<std::vector<std::string>> manager_state::drain(const std::string& host_or_id,
                                                           state_changes& changes) {
    auto servers = servers_matching(host_or_id);
    if (servers.empty())
        return unexpected{mgmt_error{errc::not_found, "no server with host or id '" + host_or_id +
                                                          "' is known; `vcuda servers` lists them"}};
    std::vector<std::string> ids;
    for (auto* cs : servers) {
        servers_.at(cs->id).draining = true;
        ids.push_back(cs->id);
        changes.servers_put.push_back(cs->id);
    }
    return ids;
}

manager_state::tick_result manager_state::tick(time_ms now, state_changes& changes) {
    tick_result r;
    for (auto& [id, s] : servers_) {
        if (!s.down && now - s.last_heartbeat > cfg_.heartbeat_timeout) {
            s.down = true;
            s.sessions.clear();
            for (auto& [uuid, g] : gpus_)
                if (g.server_id == id) g.load_reported = false;
            r.servers_down.push_back(id);
            changes.servers_put.push_back(id);
        }
    }
    for (auto& [id, l] : leases_)
        for (auto& d : l.devices)
            if (d.move && now - d.move->asked_at >= cfg_.move_timeout) {
                r.moves_given_up.push_back({id, d.uuid, d.move->to_uuid, false,
                                            "no server reported an outcome within " +
                                                std::to_string(cfg_.move_timeout.count() / 1000) +
                                                " s; the lease stays where it was",
                                            d.move->reason, now - d.move->asked_at});
                d.move.reset();
            }
    for (auto it = leases_.begin(); it != leases_.end();) {
        if (it->second.expires_at <= now) {
            changes.leases_deleted.push_back(it->first);
            r.leases_expired.push_back(std::move(it->second));
            it = leases_.erase(it);
        } else {
            ++it;
        }
    }
    return r;
}

// ------------------------------------------------------------------------------------------------ views

const server_record* manager_state::server_of_gpu(const std::string& uuid) const {
    auto g = gpus_.find(uuid);
    if (g == gpus_.end()) return nullptr;
    auto s = servers_.find(g->second.server_id);
    return s == servers_.end() ? nullptr : &s->second;
}

gpu_view manager_state::view(const gpu_record& g) const {
    gpu_view v;
    v.gpu = &g;
    if (auto s = servers_.find(g.server_id); s != servers_.end()) v.server = &s->second;
    for (auto& [id, l] : leases_)
        for (auto& d : l.devices)
            if (d.uuid == g.info.uuid || (d.move && d.move->to_uuid == g.info.uuid)) {
                v.leased_memory += d.memory_quota;  // a lease on its way here holds its room already
                ++v.leases;
                v.exclusive = v.exclusive || l.exclusive;
            }
    if (!v.server || v.server->down)
        v.state = "down";
    else if (v.server->draining)
        v.state = "draining";
    else if (v.server->cordoned || g.cordoned)
        v.state = "cordoned";
    else
        v.state = "up";
    return v;
}

std::vector<gpu_view> manager_state::gpu_views() const {
    std::vector<gpu_view> out;
    for (auto& [uuid, g] : gpus_) out.push_back(view(g));
    std::sort(out.begin(), out.end(), [](const gpu_view& a, const gpu_view& b) {
        std::string ha = a.server ? a.server->host : "", hb = b.server ? b.server->host : "";
        std::string ia = a.server ? a.server->id : "", ib = b.server ? b.server->id : "";
        return std::tie(ha, ia, a.gpu->info.index) < std::tie(hb, ib, b.gpu->info.index);
    });
    return out;
}

std::string manager_state::server_state(const server_record& s) const {
    if (s.down) return "down";
    if (s.draining) return leases_on_server(s.id) ? "draining" : "drained";
    return s.cordoned ? "cordoned" : "up";
}

uint32_t manager_state::leases_on_server(const std::string& server_id) const {
    uint32_t n = 0;
    for (auto& [id, l] : leases_)
        for (auto& d : l.devices)
            if (auto g = gpus_.find(d.uuid); g != gpus_.end() && g->second.server_id == server_id) {
                ++n;
                break;
            }
    return n;
}

std::vector<active_lease> manager_state::active_leases_on(const std::string& server_id) const {
    std::vector<active_lease> out;
    auto on_server = [&](const std::string& uuid) {
        auto g = gpus_.find(uuid);
        return g != gpus_.end() && g->second.server_id == server_id;
    };
    for (auto& [id, l] : leases_)
        for (auto& d : l.devices) {
            active_lease a{id,
                           d.uuid,
                           d.memory_quota,
                           to_unix_ms(l.expires_at),
                           l.suspend_seq,
                           l.resume_seq,
                           l.suspend_seq ? to_unix_ms(l.suspend_asked_at) : 0,
                           l.resume_seq ? to_unix_ms(l.resume_asked_at) : 0};
            if (on_server(d.uuid)) {
                a.move_seq = d.move_seq;
                a.move_asked_at = d.move_seq ? to_unix_ms(d.move_asked_at) : 0;
                if (d.move) {
                    a.move_to_uuid = d.move->to_uuid;
                    if (auto* target = server_of_gpu(d.move->to_uuid))
                        a.move_to_endpoints = endpoints_from(*target, server_of_gpu(d.uuid));
                }
                out.push_back(std::move(a));
            } else if (d.move && on_server(d.move->to_uuid)) {
                // On its way here: listed so that the server keeps the session it receives; nothing asked.
                a.uuid = d.move->to_uuid;
                out.push_back(std::move(a));
            }
        }
    return out;
}

std::vector<std::string> manager_state::endpoints_from(const server_record& target,
                                                       const server_record* source) const {
    std::vector<std::string> out;
    const bool same_host = source && lower(source->host) == lower(target.host);
    for (auto& ep : target.endpoints)
        if (same_host || !ep.starts_with("unix:")) out.push_back(ep);
    return out;
}

// ------------------------------------------------------------------------------------------------ moves

mgmt_result<std::pair<std::string, size_t>> manager_state::find_lease_device(
    const std::string& lease_or_session) const {
    if (lease_or_session.empty())
        return unexpected{
            mgmt_error{errc::bad_request, "name a lease id or a session id (`vcuda sessions`)"}};
    if (auto l = leases_.find(lease_or_session); l != leases_.end()) {
        if (l->second.devices.size() != 1)
            return unexpected{
                mgmt_error{errc::bad_request,
                           "lease " + lease_or_session + " has " + std::to_string(l->second.devices.size()) +
                               " GPUs: name the session to move instead (`vcuda sessions` lists them)"}};
        return std::make_pair(lease_or_session, size_t{0});
    }
    std::vector<std::pair<std::string, size_t>> found;
    for (auto& [sid, s] : servers_)
        for (auto& r : s.sessions) {
            if (r.session_id != lease_or_session || !r.moved_to.empty() || r.lease_id.empty()) continue;
            auto l = leases_.find(r.lease_id);
            if (l == leases_.end()) continue;
            for (size_t i = 0; i < l->second.devices.size(); ++i)
                if (l->second.devices[i].uuid == r.gpu_uuid) found.emplace_back(r.lease_id, i);
        }
    if (found.size() == 1) return found.front();
    if (found.size() > 1)
        return unexpected{mgmt_error{errc::bad_request, "several servers report a session " +
                                                            lease_or_session +
                                                            ": name its lease instead (`vcuda sessions`)"}};
    return unexpected{
        mgmt_error{errc::not_found, "no lease or session '" + lease_or_session +
                                        "' (`vcuda leases` and `vcuda sessions` list them; a "
                                        "session of a lease without a lease token cannot move)"}};
}

mgmt_result<manager_state::move_plan> manager_state::plan_move(const std::string& lease_id, size_t device,
                                                               const std::string& to) const {
    auto l = leases_.find(lease_id);
    if (l == leases_.end())
        return unexpected{mgmt_error{errc::not_found, "no lease " + lease_id + " (see `vcuda leases`)"}};
    const lease_record& lease = l->second;
    if (device >= lease.devices.size())
        return unexpected{
            mgmt_error{errc::bad_request, "lease " + lease_id + " has no GPU " + std::to_string(device)}};
    const lease_device& d = lease.devices[device];
    if (d.move)
        return unexpected{mgmt_error{errc::bad_request, "lease " + lease_id + " is already moving to GPU " +
                                                            d.move->to_uuid +
                                                            "; wait for the outcome (`vcuda events`)"}};
    auto from = gpus_.find(d.uuid);
    const server_record* source = server_of_gpu(d.uuid);
    if (from == gpus_.end() || !source)
        return unexpected{
            mgmt_error{errc::not_found, "the GPU " + d.uuid + " of lease " + lease_id +
                                            " is no longer registered: nothing can move its session"}};
    if (source->down)
        return unexpected{mgmt_error{errc::bad_request, "the server of lease " + lease_id + " (" +
                                                            source->host + ", " + source->id +
                                                            ") is down: nothing can move its session"}};

    std::vector<const gpu_record*> targets;
    if (to.empty()) {
        for (auto& [uuid, g] : gpus_) targets.push_back(&g);
    } else if (auto g = gpus_.find(to); g != gpus_.end()) {
        targets.push_back(&g->second);
    } else {
        auto servers = servers_matching(to);
        if (servers.empty())
            return unexpected{
                mgmt_error{errc::not_found, "no GPU uuid, server host or server id '" + to +
                                                "' is known; `vcuda gpus` and `vcuda servers` list them"}};
        for (auto* s : servers)
            for (auto& [uuid, g] : gpus_)
                if (g.server_id == s->id) targets.push_back(&g);
    }

    using key_t = std::tuple<uint64_t, uint32_t, uint32_t, uint32_t, std::string, uint32_t>;
    std::optional<std::pair<key_t, const gpu_record*>> best;
    size_t same = 0, unavailable = 0, too_small = 0, full = 0;
    for (auto* g : targets) {
        if (g->info.uuid == d.uuid) {
            ++same;
            continue;
        }
        gpu_view v = view(*g);
        if (!v.server || v.state != "up") {
            ++unavailable;
            continue;
        }
        const uint64_t mem = g->info.memory;
        if (d.memory_quota > mem) {
            ++too_small;
            continue;
        }
        bool fits = lease.exclusive
                        ? v.leases == 0
                        : !v.exclusive && v.leased_memory <= mem && d.memory_quota <= mem - v.leased_memory;
        if (!fits) {
            ++full;
            continue;
        }
        key_t key{mem - v.leased_memory - d.memory_quota,
                  g->load.utilization,
                  g->load.sessions,
                  v.leases,
                  v.server->host,
                  g->info.index};
        if (!best || key < best->first) best.emplace(key, g);
    }
    if (!best) {
        std::string why;
        if (targets.empty()) why = "no GPUs are registered";
        if (same)
            why += "; it is on " + std::string(targets.size() == 1 ? "that GPU" : "one of them") + " already";
        if (unavailable) why += "; " + std::to_string(unavailable) + " down, cordoned or draining";
        if (too_small) why += "; " + std::to_string(too_small) + " smaller than its quota";
        if (full) why += "; " + std::to_string(full) + " without room for its " + format_size(d.memory_quota);
        if (why.starts_with("; ")) why.erase(0, 2);
        return unexpected{
            mgmt_error{errc::no_capacity, "no GPU" + (to.empty() ? std::string() : " of '" + to + "'") +
                                              " can take lease " + lease_id + ": " + why +
                                              ". Uncordon a GPU, free one, or name another target"}};
    }
    return move_plan{lease_id, device, d.uuid, best->second->info.uuid};
}

mgmt_result<lease_record> manager_state::request_move(const move_plan& plan, std::string reason,
                                                      time_ms now) {
    auto l = leases_.find(plan.lease_id);
    if (l == leases_.end() || plan.device >= l->second.devices.size() ||
        l->second.devices[plan.device].uuid != plan.from_uuid || l->second.devices[plan.device].move)
        return unexpected{mgmt_error{
            errc::bad_request, "lease " + plan.lease_id + " changed since the move was planned; ask again"}};
    auto& d = l->second.devices[plan.device];
    d.move_seq = ++l->second.move_seq;
    d.move_asked_at = now;
    d.move = pending_move{d.move_seq, plan.to_uuid, now, std::move(reason)};
    return l->second;
}

std::vector<manager_state::move_outcome> manager_state::settle_moves(const mgmt::heartbeat& hb, time_ms now,
                                                                     state_changes& changes) {
    std::vector<move_outcome> out;
    auto settle = [&](lease_record& l, lease_device& d, bool moved, std::string note) {
        move_outcome o{
            l.id, d.uuid, d.move->to_uuid, moved, std::move(note), d.move->reason, now - d.move->asked_at};
        if (moved) {
            d.uuid = d.move->to_uuid;
            l.last_moved_at = now;
            changes.leases_put.push_back(l.id);
        }
        d.move.reset();
        out.push_back(std::move(o));
    };
    auto s = servers_.find(hb.server_id);
    if (s == servers_.end()) return out;
    for (auto& r : hb.sessions) {
        auto l = leases_.find(r.lease_id);
        if (l == leases_.end()) continue;
        for (auto& d : l->second.devices) {
            if (!d.move) continue;
            auto from = gpus_.find(d.uuid);
            // The answer of the server it leaves: the session reports the request it acted on.
            if (r.move_seq == d.move->seq && r.gpu_uuid == d.uuid && from != gpus_.end() &&
                from->second.server_id == s->first) {
                settle(l->second, d, !r.moved_to.empty(), r.note);
                break;
            }
            // The server it left is down and cannot answer, but the session is running where it was sent.
            const server_record* source = server_of_gpu(d.uuid);
            if (r.moved_to.empty() && r.gpu_uuid == d.move->to_uuid && (!source || source->down)) {
                auto to = gpus_.find(d.move->to_uuid);
                if (to != gpus_.end() && to->second.server_id == s->first) {
                    settle(l->second, d, true,
                           "its new server reports the session (the old one is down and did not say)");
                    break;
                }
            }
        }
    }
    return out;
}

size_t manager_state::moves_pending() const {
    size_t n = 0;
    for (auto& [id, l] : leases_)
        for (auto& d : l.devices) n += d.move.has_value();
    return n;
}

mgmt_result<lease_record> manager_state::request_suspend(const std::string& lease_id, bool resume,
                                                         time_ms now) {
    auto it = leases_.find(lease_id);
    if (it == leases_.end())
        return unexpected{mgmt_error{errc::not_found, "no lease " + lease_id + " (see `vcuda leases`)"}};
    if (resume) {
        ++it->second.resume_seq;
        it->second.resume_asked_at = now;
    } else {
        ++it->second.suspend_seq;
        it->second.suspend_asked_at = now;
    }
    return it->second;
}

std::vector<std::string> manager_state::reclaim_idle(const std::string& server_id,
                                                     std::chrono::milliseconds idle_after, time_ms now) {
    std::vector<std::string> asked;
    auto s = servers_.find(server_id);
    if (s == servers_.end()) return asked;
    std::map<std::string, bool> idle;  // lease -> every session of it here idle and running
    for (auto& r : s->second.sessions) {
        if (r.lease_id.empty() || !r.moved_to.empty()) continue;  // a moved session lives elsewhere now
        bool ok = !r.suspended && r.idle_ms >= idle_after.count();
        auto [it, fresh] = idle.emplace(r.lease_id, ok);
        if (!fresh) it->second = it->second && ok;
    }
    for (auto& [lease_id, all_idle] : idle) {
        auto l = leases_.find(lease_id);
        if (!all_idle || l == leases_.end() || now - l->second.suspend_asked_at < idle_after) continue;
        ++l->second.suspend_seq;
        l->second.suspend_asked_at = now;
        asked.push_back(lease_id);
    }
    return asked;
}

}  // namespace vcuda::mgmt
