#include "mgmt/core/rebalance.hpp"

#include <algorithm>
#include <tuple>
#include <vector>

#include "mgmt/wire/units.hpp"

namespace vcuda::mgmt {

uint32_t gpu_pressure(const gpu_record& g) {
    uint32_t mem = 0;
    if (g.info.memory > 0)
        mem = static_cast<uint32_t>(std::min<uint64_t>(g.load.memory_used, g.info.memory) * 100 /
                                    g.info.memory);
    return std::max(std::min<uint32_t>(g.load.utilization, 100), mem);
}

namespace {

std::string where(const manager_state& st, const std::string& uuid, uint32_t pressure) {
    const server_record* s = st.server_of_gpu(uuid);
    return "GPU " + uuid + " (" + (s ? s->host + " " + s->id : std::string("?")) + ", " +
           std::to_string(pressure) + "%)";
}

}  // namespace

rebalance_decision rebalancer::step(const manager_state& st, time_ms now) {
    rebalance_decision d;
    if (sampled_ && now - last_sample_ < cfg_.interval) return d;
    sampled_ = true;
    last_sample_ = now;
    while (!moves_.empty() && now - moves_.front() >= std::chrono::minutes(1)) moves_.pop_front();

    // A move under way changes the load: wait for it, and sample afresh after it.
    if (st.moves_pending() > 0) {
        streak_ = 0;
        return d;
    }
    struct sample {
        const gpu_record* gpu;
        uint32_t pressure;
    };
    std::vector<sample> gpus;
    for (auto& v : st.gpu_views())
        if (v.server && v.state == "up" && v.gpu->load_reported)
            gpus.push_back({v.gpu, gpu_pressure(*v.gpu)});
    if (gpus.size() < 2) {
        streak_ = 0;
        return d;
    }
    // Coolest first; among equals, listing order.
    std::stable_sort(gpus.begin(), gpus.end(), [](auto& a, auto& b) { return a.pressure < b.pressure; });
    const sample& hot = gpus.back();
    const sample& cool = gpus.front();
    d.hot_uuid = hot.gpu->info.uuid;
    d.cool_uuid = cool.gpu->info.uuid;
    d.hot_pressure = hot.pressure;
    d.cool_pressure = cool.pressure;
    if (hot.pressure - cool.pressure <= cfg_.threshold) {
        streak_ = 0;
        return d;
    }
    if (++streak_ < cfg_.sustain) return d;
    streak_ = 0;  // a decision now; the next one needs `sustain` samples again

    d.detail = where(st, d.hot_uuid, hot.pressure) + " vs " + where(st, d.cool_uuid, cool.pressure) +
               " for " + std::to_string(cfg_.sustain) + " samples (threshold " +
               std::to_string(cfg_.threshold) + " points)";
    if (moves_.size() >= cfg_.max_moves_per_minute) {
        d.what = rebalance_decision::kind::held_back;
        d.detail += ": no move, " + std::to_string(moves_.size()) +
                    " already this minute (--rebalance-max-moves " +
                    std::to_string(cfg_.max_moves_per_minute) + ")";
        return d;
    }

    // The sessions on the hottest GPU that may move, busiest first, then smallest.
    struct candidate {
        const session_report* report;
        std::string lease_id;
        size_t device;
    };
    std::vector<candidate> candidates;
    std::string why_not;
    size_t cooling = 0;
    if (const server_record* s = st.server_of_gpu(d.hot_uuid))
        for (auto& r : s->sessions) {
            if (r.gpu_uuid != d.hot_uuid || r.lease_id.empty() || !r.moved_to.empty()) continue;
            auto l = st.leases().find(r.lease_id);
            if (l == st.leases().end() || r.suspended) continue;
            if (l->second.last_moved_at != time_ms{} && now - l->second.last_moved_at < cfg_.cooldown) {
                ++cooling;
                continue;
            }
            for (size_t i = 0; i < l->second.devices.size(); ++i)
                if (l->second.devices[i].uuid == d.hot_uuid && !l->second.devices[i].move)
                    candidates.push_back({&r, r.lease_id, i});
        }
    const int64_t busy_ms = cfg_.interval.count();
    std::stable_sort(candidates.begin(), candidates.end(), [&](const candidate& a, const candidate& b) {
        return std::make_tuple(a.report->idle_ms >= busy_ms, a.report->memory_used) <
               std::make_tuple(b.report->idle_ms >= busy_ms, b.report->memory_used);
    });
    for (auto& c : candidates)
        for (auto& target : gpus) {
            if (hot.pressure - target.pressure <= cfg_.threshold) break;  // the rest are no cooler
            auto plan = st.plan_move(c.lease_id, c.device, target.gpu->info.uuid);
            if (!plan) {
                if (why_not.empty()) why_not = plan.error().message;
                continue;
            }
            d.what = rebalance_decision::kind::move;
            d.plan = *plan;
            d.session_id = c.report->session_id;
            d.memory_used = c.report->memory_used;
            if (target.gpu != cool.gpu) {
                d.cool_uuid = target.gpu->info.uuid;
                d.cool_pressure = target.pressure;
            }
            d.detail += ": moving lease " + c.lease_id + " (session " + c.report->session_id + ", " +
                        format_size(c.report->memory_used) + " in use" +
                        (c.report->idle_ms < busy_ms ? ", busy" : ", idle") + ") to " +
                        where(st, target.gpu->info.uuid, target.pressure);
            return d;
        }
    d.what = rebalance_decision::kind::no_candidate;
    if (candidates.empty())
        d.detail +=
            ": no lease can move: " +
            (cooling ? std::to_string(cooling) + " moved within the cooldown (--rebalance-cooldown " +
                           std::to_string(cfg_.cooldown.count() / 1000) + " s), none else running there"
                     : std::string("no running session with a lease is reported there"));
    else
        d.detail += ": no lease can move: " + why_not;
    return d;
}

}  // namespace vcuda::mgmt
