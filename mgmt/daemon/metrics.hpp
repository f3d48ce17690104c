// vcuda-mgmt's Prometheus metrics (README, "Metrics"): servers and their health, GPUs (cordoned or not,
// leased or free), leases and sessions by state, memory leased and used per tenant, the manager's events by
// kind — what its placement, idle reclaim and expiry act on, for operators. Pure: it formats what it is
// given, and service::metrics() gives it the state under the service's lock.
// runs on: the caller's thread (the metrics listener's, through service::metrics).
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "mgmt/core/state.hpp"

namespace vcuda::mgmt {

// `events_total`: events the manager has recorded since it started (`vcuda events`), by kind.
std::string manager_metrics(const manager_state& state, const std::map<std::string, uint64_t>& events_total,
                            time_ms now);

}  // namespace vcuda::mgmt
