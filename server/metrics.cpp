#include "server/metrics.hpp"

#include <chrono>
#include <vector>

#include "common/metrics_http.hpp"
#include "server/server.hpp"

namespace vcuda::server {

namespace {

using metrics::metric_type;

// What a scrape reports of one session, read under its lock and written after.
struct session_row {
    std::string id, lease, peer;
    bool suspended = false;
    double idle_seconds = 0;
    uint64_t calls = 0;
    struct gpu_memory {
        size_t gpu = 0;
        uint64_t mapped = 0, resident = 0;
    };
    std::vector<gpu_memory> memory;
};

}  // namespace

std::string collect_metrics(server& srv, const driver& drv) {
    metrics::exposition out;
    std::vector<std::string> uuids;
    for (auto& g : drv.gpus()) uuids.push_back(gpu_uuid_string(g.uuid));

    out.family("vcuda_server_gpu_memory_total_bytes", metric_type::gauge,
               "Memory of each GPU this server serves");
    for (size_t i = 0; i < drv.gpus().size(); ++i)
        out.sample("vcuda_server_gpu_memory_total_bytes",
                   {{"gpu", uuids[i]}, {"index", std::to_string(i)}, {"name", drv.gpus()[i].name}},
                   drv.gpus()[i].total_memory);

    const auto now = std::chrono::steady_clock::now();
    std::vector<session_row> rows;
    for (auto& sp :
         srv.sessions().snapshot()) {  // the registry is not held while a session's lock is awaited
        auto& s = *sp;
        session_row r{std::to_string(s.id()), s.lease_id(), s.peer()};
        r.suspended = s.suspended();
        r.idle_seconds = metrics::seconds(now - s.last_call());
        r.calls = s.counters.calls.load(std::memory_order_relaxed);
        std::lock_guard lock(s.mu);
        for (size_t i = 0; i < s.device_count(); ++i)
            if (s.allowed(i)) r.memory.push_back({s.gpu_of(i), s.memory(i).mapped(), s.memory(i).resident()});
        rows.push_back(std::move(r));
    }
    // --isolation process: those sessions live in worker processes, which this process cannot read; they are
    // counted and named, and are never suspended (not supported there yet).
    const auto workers = srv.worker_sessions();

    size_t suspended = 0;
    for (auto& r : rows) suspended += r.suspended;
    out.family("vcuda_server_sessions", metric_type::gauge,
               "Sessions (client processes) by state: active, or suspended (GPU state saved in host memory)");
    out.sample("vcuda_server_sessions", {{"state", "active"}}, rows.size() - suspended + workers.size());
    out.sample("vcuda_server_sessions", {{"state", "suspended"}}, suspended);
    out.family("vcuda_server_connections", metric_type::gauge,
               "Connections served now: one per client thread (lane), plus bulk connections");
    out.sample("vcuda_server_connections", srv.connections());

    out.family("vcuda_server_session_info", metric_type::gauge,
               "One per session: its lease (empty without a manager) and its client's address");
    for (auto& r : rows)
        out.sample("vcuda_server_session_info", {{"session", r.id}, {"lease", r.lease}, {"peer", r.peer}}, 1);
    for (auto& w : workers)
        out.sample("vcuda_server_session_info",
                   {{"session", std::to_string(w.id)}, {"lease", w.grant.lease_id}, {"peer", w.peer}}, 1);
    out.family("vcuda_server_session_suspended", metric_type::gauge,
               "1 while the session is suspended (its next call, or an operator, resumes it)");
    for (auto& r : rows)
        out.sample("vcuda_server_session_suspended", {{"session", r.id}, {"lease", r.lease}},
                   r.suspended ? 1 : 0);
    out.family("vcuda_server_session_idle_seconds", metric_type::gauge,
               "Time since the session's last call: what the manager's idle reclaim looks at");
    for (auto& r : rows)
        out.sample("vcuda_server_session_idle_seconds", {{"session", r.id}, {"lease", r.lease}},
                   r.idle_seconds);
    out.family("vcuda_server_session_calls_total", metric_type::counter,
               "Calls the session's lanes received (rate() of it: the session's calls per second)");
    for (auto& r : rows)
        out.sample("vcuda_server_session_calls_total", {{"session", r.id}, {"lease", r.lease}}, r.calls);
    out.family("vcuda_server_session_memory_mapped_bytes", metric_type::gauge,
               "GPU memory charged to the session's quota on each GPU, suspended or not");
    for (auto& r : rows)
        for (auto& m : r.memory)
            out.sample("vcuda_server_session_memory_mapped_bytes",
                       {{"session", r.id}, {"lease", r.lease}, {"gpu", uuids[m.gpu]}}, m.mapped);
    out.family("vcuda_server_session_memory_resident_bytes", metric_type::gauge,
               "Of it, what is on the GPU now (0 while the session is suspended)");
    for (auto& r : rows)
        for (auto& m : r.memory)
            out.sample("vcuda_server_session_memory_resident_bytes",
                       {{"session", r.id}, {"lease", r.lease}, {"gpu", uuids[m.gpu]}}, m.resident);

    session_counters all;
    srv.sessions().add_counters(all);
    constexpr auto relaxed = std::memory_order_relaxed;
    out.family("vcuda_server_calls_total", metric_type::counter,
               "Calls received by every session since the server started (rate() of it: calls per second)");
    out.sample("vcuda_server_calls_total", all.calls.load(relaxed));
    auto summary = [&](const char* name, const char* help, const timed_count& t) {
        out.summary(name, help, t.count.load(relaxed), double(t.micros.load(relaxed)) / 1e6);
    };
    summary("vcuda_server_suspend_seconds",
            "Suspends (GPU state saved to host memory and the GPU given back) and the time they took",
            all.suspends);
    summary("vcuda_server_resume_seconds",
            "Resumes (GPU state rebuilt at the same addresses) and the time they took", all.resumes);
    summary("vcuda_server_migration_pause_seconds",
            "Sessions moved from here to another server and the pause each program saw (gate closed to "
            "the other server's answer)",
            all.migrations);
    return out.text();
}

}  // namespace vcuda::server
