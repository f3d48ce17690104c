#include "mgmt/daemon/metrics.hpp"

#include "common/metrics_http.hpp"

namespace vcuda::mgmt {

namespace {

using metrics::metric_type;

const char* yes_no(bool b) { return b ? "true" : "false"; }

}  // namespace

std::string manager_metrics(const manager_state& state, const std::map<std::string, uint64_t>& events_total,
                            time_ms now) {
    metrics::exposition out;

    // States no server or GPU is in are left out (the states are manager_state's to name; no copy here).
    std::map<std::string, uint64_t> servers;
    for (auto& [id, s] : state.servers()) ++servers[state.server_state(s)];
    out.family(
        "vcuda_mgmt_servers", metric_type::gauge,
        "Registered vcuda-servers by state: up, cordoned, draining (leases still on it), drained, down "
        "(missed heartbeats)");
    for (auto& [st, n] : servers) out.sample("vcuda_mgmt_servers", {{"state", st}}, n);
    out.family("vcuda_mgmt_server_heartbeat_age_seconds", metric_type::gauge,
               "Time since each server's last heartbeat (past --heartbeat-timeout it is marked down)");
    for (auto& [id, s] : state.servers())
        out.sample("vcuda_mgmt_server_heartbeat_age_seconds", {{"server", id}, {"host", s.host}},
                   metrics::seconds(now - s.last_heartbeat));

    const auto views = state.gpu_views();
    std::map<std::pair<std::string, bool>, uint64_t> gpus;
    for (auto& v : views) ++gpus[{v.state, v.leases > 0}];
    out.family(
        "vcuda_mgmt_gpus", metric_type::gauge,
        "GPUs by state (up, cordoned, draining, down: their server's or their own) and whether a lease "
        "holds them");
    for (auto& [key, n] : gpus)
        out.sample("vcuda_mgmt_gpus", {{"state", key.first}, {"leased", yes_no(key.second)}}, n);
    auto gpu_labels = [](const gpu_view& v) {
        return metrics::labels{{"gpu", v.gpu->info.uuid}, {"server", v.gpu->server_id}};
    };
    out.family("vcuda_mgmt_gpu_memory_total_bytes", metric_type::gauge,
               "Each GPU's memory, as its server registered it");
    for (auto& v : views) {
        auto l = gpu_labels(v);
        l.emplace_back("host", v.server ? v.server->host : "");
        l.emplace_back("index", std::to_string(v.gpu->info.index));
        l.emplace_back("name", v.gpu->info.name);
        out.sample("vcuda_mgmt_gpu_memory_total_bytes", l, v.gpu->info.memory);
    }
    out.family("vcuda_mgmt_gpu_leased_memory_bytes", metric_type::gauge,
               "Memory the leases on each GPU may allocate (placement never lets it pass the GPU's memory)");
    for (auto& v : views) out.sample("vcuda_mgmt_gpu_leased_memory_bytes", gpu_labels(v), v.leased_memory);
    out.family("vcuda_mgmt_gpu_leases", metric_type::gauge, "Leases on each GPU");
    for (auto& v : views) out.sample("vcuda_mgmt_gpu_leases", gpu_labels(v), v.leases);
    out.family("vcuda_mgmt_gpu_sessions", metric_type::gauge,
               "vcuda sessions on each GPU, as its server last reported");
    for (auto& v : views) out.sample("vcuda_mgmt_gpu_sessions", gpu_labels(v), v.gpu->load.sessions);
    out.family(
        "vcuda_mgmt_gpu_utilization_percent", metric_type::gauge,
        "Each GPU's utilization as its server last reported it (NVML; absent where the server has none)");
    for (auto& v : views)
        if (v.gpu->load_reported)
            out.sample("vcuda_mgmt_gpu_utilization_percent", gpu_labels(v), v.gpu->load.utilization);

    // Sessions as the servers last reported them; a lease is suspended when every session it has is.
    std::map<std::string, std::pair<uint32_t, uint32_t>> lease_sessions;  // lease -> (sessions, suspended)
    std::map<std::string, uint64_t> sessions{{"active", 0}, {"suspended", 0}};
    std::map<std::string, uint64_t> used_by_lease;
    for (auto& [id, s] : state.servers())
        for (auto& r : s.sessions) {
            if (!r.moved_to.empty())
                continue;  // reported once more by the server it left; it lives elsewhere
            ++sessions[r.suspended ? "suspended" : "active"];
            auto& [n, suspended] = lease_sessions[r.lease_id];
            ++n;
            suspended += r.suspended;
            used_by_lease[r.lease_id] += r.memory_used;
        }
    out.family("vcuda_mgmt_sessions", metric_type::gauge,
               "Sessions on all servers by state (active, suspended), as their servers last reported them");
    for (auto& [st, n] : sessions) out.sample("vcuda_mgmt_sessions", {{"state", st}}, n);

    std::map<std::string, uint64_t> leases{{"active", 0}, {"suspended", 0}};
    struct tenant_sums {
        uint64_t leases = 0, leased = 0, used = 0;
    };
    std::map<std::string, tenant_sums> tenants;
    for (auto& [id, l] : state.leases()) {
        auto it = lease_sessions.find(id);
        const bool suspended = it != lease_sessions.end() && it->second.first == it->second.second;
        ++leases[suspended ? "suspended" : "active"];
        auto& t = tenants[l.tenant];
        ++t.leases;
        for (auto& d : l.devices) t.leased += d.memory_quota;
        if (auto u = used_by_lease.find(id); u != used_by_lease.end()) t.used += u->second;
    }
    out.family(
        "vcuda_mgmt_leases", metric_type::gauge,
        "Leases by state: suspended when every session of the lease is (idle reclaim or an operator), else "
        "active");
    for (auto& [st, n] : leases) out.sample("vcuda_mgmt_leases", {{"state", st}}, n);
    out.family("vcuda_mgmt_tenant_leases", metric_type::gauge, "Leases each tenant holds");
    for (auto& [tenant, t] : tenants) out.sample("vcuda_mgmt_tenant_leases", {{"tenant", tenant}}, t.leases);
    out.family("vcuda_mgmt_tenant_leased_memory_bytes", metric_type::gauge,
               "GPU memory each tenant's leases may allocate, on all their GPUs");
    for (auto& [tenant, t] : tenants)
        out.sample("vcuda_mgmt_tenant_leased_memory_bytes", {{"tenant", tenant}}, t.leased);
    out.family("vcuda_mgmt_tenant_memory_used_bytes", metric_type::gauge,
               "GPU memory each tenant's sessions hold, as their servers last reported it");
    for (auto& [tenant, t] : tenants)
        out.sample("vcuda_mgmt_tenant_memory_used_bytes", {{"tenant", tenant}}, t.used);

    out.family("vcuda_mgmt_events_total", metric_type::counter,
               "What the manager did and why (`vcuda events`), by kind, since it started");
    for (auto& [kind, n] : events_total) out.sample("vcuda_mgmt_events_total", {{"kind", kind}}, n);
    return out.text();
}

}  // namespace vcuda::mgmt
