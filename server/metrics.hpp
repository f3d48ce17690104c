// vcuda-server's Prometheus metrics (README, "Metrics"): its GPUs, the sessions it serves and what each
// holds on each GPU, calls, suspends and resumes, migrations — what the manager's policies see, for
// operators. Only reads: the counters are kept where things happen (server/session.hpp, session_counters).
// runs on: the metrics listener's thread (common/metrics_http.hpp).
// locks: the registry's mutex briefly, then each session's `mu` in turn for its memory, as the manager's
// heartbeat does (a scrape waits while a session holds it, e.g. during a suspend; sessions never wait for a
// scrape longer than that read).
#pragma once

#include <string>

namespace vcuda::server {

class server;
class driver;

// One scrape's exposition text.
std::string collect_metrics(server& srv, const driver& drv);

}  // namespace vcuda::server
