// The manager's moves with a fake clock: where `vcuda migrate` and a drain send a lease (target choice), how
// the request reaches the servers and how their answers settle it, and the rebalancing policy's decisions
// (hysteresis, threshold, cap, cooldown, which lease).
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "mgmt/core/rebalance.hpp"
#include "mgmt/core/state.hpp"
#include "mgmt/daemon/service.hpp"
#include "mgmt/tests/helpers.hpp"
#include "mgmt/token.hpp"
#include "mgmt/wire/codec.hpp"

using namespace vcuda::mgmt;
using namespace vcuda::mgmt::test;
using namespace std::chrono_literals;

namespace {

struct fixture : state_fixture {
    fixture() : state_fixture(state_config{10s, 30s, 64, 20s}) {}  // moves given up after 20 s
    // A heartbeat of `server_id`: one GPU's load and the sessions given.
    void beat(const std::string& server_id, const std::string& uuid, uint32_t util, uint64_t used = 0,
              std::vector<session_report> sessions = {}) {
        heartbeat hb;
        hb.server_id = server_id;
        hb.gpus.push_back({uuid, util, used, static_cast<uint32_t>(sessions.size())});
        hb.sessions = std::move(sessions);
        REQUIRE(st.heartbeat(hb, clock(), ch));
    }
    std::vector<manager_state::move_outcome> settle(const std::string& server_id,
                                                    std::vector<session_report> sessions) {
        heartbeat hb;
        hb.server_id = server_id;
        hb.sessions = std::move(sessions);
        REQUIRE(st.heartbeat(hb, clock(), ch));
        return st.settle_moves(hb, clock(), ch);
    }
    manager_state::move_plan plan(const std::string& lease, const std::string& to) {
        auto p = st.plan_move(lease, 0, to);
        INFO((p ? std::string() : p.error().message));
        REQUIRE(p);
        return *p;
    }
    mgmt_error refusal(const std::string& lease, const std::string& to) {
        auto p = st.plan_move(lease, 0, to);
        REQUIRE_FALSE(p);
        return p.error();
    }
    const active_lease* listed(const std::string& server_id, const std::string& lease,
                               const std::string& uuid) {
        static std::vector<active_lease> keep;
        keep = st.active_leases_on(server_id);
        for (auto& a : keep)
            if (a.lease_id == lease && a.uuid == uuid) return &a;
        return nullptr;
    }
};

session_report report(std::string session, std::string lease, std::string uuid, int64_t idle_ms = 0,
                      uint64_t used = 0) {
    session_report r;
    r.session_id = std::move(session);
    r.lease_id = std::move(lease);
    r.gpu_uuid = std::move(uuid);
    r.idle_ms = idle_ms;
    r.memory_used = used;
    return r;
}

}  // namespace

TEST_CASE("migrate: the target is up, of any index, with room, not where the lease is", "[unit][mgmt]") {
    fixture f;
    f.add(server("alpha", {gpu(0, "GPU-a0", 16 * GiB), gpu(1, "GPU-a1", 16 * GiB)}));
    f.add(server("beta", {gpu(0, "GPU-b0", 16 * GiB), gpu(1, "GPU-b1", 80 * GiB)}));
    std::string gamma = f.add(server("gamma", {gpu(0, "GPU-g0", 40 * GiB)}));
    auto l = f.acquire(request("alpha", 8 * GiB));
    REQUIRE(l.devices[0].uuid == "GPU-a0");

    // Any host: best fit by memory, as placement: a1, the other GPU of its own server (16 GiB, as b0; the
    // server moves the session's device there).
    CHECK(f.plan(l.id, "").to_uuid == "GPU-a1");
    CHECK(f.plan(l.id, "GPU-a1").to_uuid == "GPU-a1");
    REQUIRE(f.st.cordon("GPU-a1", true, f.ch));  // the other servers' GPUs from here on
    // A host: its best-fitting GPU (b0's 16 GiB fits 8 GiB better than b1's 80).
    CHECK(f.plan(l.id, "beta").to_uuid == "GPU-b0");
    // A GPU of another index than the session's: its device index stays the client's, placed on that GPU.
    CHECK(f.plan(l.id, "GPU-b1").to_uuid == "GPU-b1");
    // Any host: best fit by memory (b0's 16 GiB fits 8 GiB better than g0's 40).
    CHECK(f.plan(l.id, "").to_uuid == "GPU-b0");
    // A GPU by uuid; a server by id.
    CHECK(f.plan(l.id, "GPU-g0").to_uuid == "GPU-g0");
    CHECK(f.plan(l.id, gamma).to_uuid == "GPU-g0");
    // Refused, each with its reason.
    auto e = f.refusal(l.id, "GPU-a0");
    CHECK(e.code == errc::no_capacity);
    CHECK_THAT(e.message, Catch::Contains("on that GPU already"));
    CHECK(f.refusal(l.id, "nowhere").code == errc::not_found);
    CHECK(f.refusal("lease-none", "beta").code == errc::not_found);
    REQUIRE(f.st.cordon("GPU-b0", true, f.ch));
    CHECK_THAT(f.refusal(l.id, "GPU-b0").message, Catch::Contains("cordoned or draining"));
    CHECK(f.plan(l.id, "").to_uuid == "GPU-g0");  // the next best
    REQUIRE(f.st.drain("gamma", f.ch));
    CHECK(f.plan(l.id, "").to_uuid == "GPU-b1");
    REQUIRE(f.st.cordon("GPU-b1", true, f.ch));
    CHECK_THAT(f.refusal(l.id, "").message, Catch::Contains("4 down, cordoned or draining"));
    REQUIRE(f.st.cordon("GPU-b0", false, f.ch));
    REQUIRE(f.st.cordon("GPU-b1", false, f.ch));
    REQUIRE(f.st.cordon("gamma", false, f.ch));

    // Room: b0 holds 12 GiB of another lease, so 8 more do not fit.
    f.acquire(request("beta", 12 * GiB));
    CHECK_THAT(f.refusal(l.id, "GPU-b0").message, Catch::Contains("without room for its 8"));
}

TEST_CASE("migrate: an exclusive lease needs a GPU nobody uses, and a lease moves once at a time",
          "[unit][mgmt]") {
    fixture f;
    f.add(server("alpha", {gpu(0, "GPU-a0", 16 * GiB)}));
    f.add(server("beta", {gpu(0, "GPU-b0", 16 * GiB)}));
    f.add(server("gamma", {gpu(0, "GPU-g0", 16 * GiB)}));
    auto ex = f.acquire(request("alpha", 0, 1, true));
    auto shared = f.acquire(request("beta", 1 * GiB));
    REQUIRE(shared.devices[0].uuid == "GPU-b0");
    CHECK_THAT(f.refusal(ex.id, "GPU-b0").message, Catch::Contains("without room"));
    auto p = f.plan(ex.id, "");
    CHECK(p.to_uuid == "GPU-g0");
    REQUIRE(f.st.request_move(p, "test", f.clock()));
    // Under way: no second move, and the target's room is taken meanwhile.
    CHECK_THAT(f.refusal(ex.id, "").message, Catch::Contains("already moving"));
    CHECK(f.st.view(f.st.gpus().at("GPU-g0")).leases == 1);
    auto other = f.st.acquire(request("gamma", 1 * GiB), f.clock(), f.ch);
    REQUIRE(other);
    CHECK(other->devices[0].uuid == "GPU-b0");
}

TEST_CASE("migrate: the request reaches both servers, and the old one's answer settles it", "[unit][mgmt]") {
    fixture f;
    auto areg = server("alpha", {gpu(0, "GPU-a0", 16 * GiB)}, "unix:/run/a.sock");
    areg.endpoints.push_back("10.0.0.1:7300");
    std::string a = f.add(areg);
    auto breg = server("beta", {gpu(0, "GPU-b0", 16 * GiB)}, "unix:/run/b.sock");
    breg.endpoints.push_back("10.0.0.2:7300");
    std::string b = f.add(breg);
    auto l = f.acquire(request("alpha", 4 * GiB));
    REQUIRE(l.devices[0].uuid == "GPU-a0");
    REQUIRE(f.st.request_move(f.plan(l.id, "beta"), "asked by test", f.clock()));

    // The old server is asked, with the target's addresses (no Unix socket of another host).
    auto* src = f.listed(a, l.id, "GPU-a0");
    REQUIRE(src);
    CHECK(src->move_seq == 1);
    CHECK(src->move_to_uuid == "GPU-b0");
    CHECK(src->move_to_endpoints == std::vector<std::string>{"10.0.0.2:7300"});
    // The target lists the lease already (it keeps the session it receives), and is asked nothing.
    auto* dst = f.listed(b, l.id, "GPU-b0");
    REQUIRE(dst);
    CHECK(dst->move_to_uuid.empty());

    // A report of another request, or with none, settles nothing.
    auto r = report("7", l.id, "GPU-a0");
    CHECK(f.settle(a, {r}).empty());
    // The old server says it moved: the lease is on b0 from now on, listed there only.
    r.move_seq = 1;
    r.moved_to = "10.0.0.2:7300";
    r.note = "moved to 10.0.0.2:7300: 64 MiB of GPU state, paused 80 ms";
    f.clock.advance(2s);
    auto done = f.settle(a, {r});
    REQUIRE(done.size() == 1);
    CHECK(done[0].moved);
    CHECK(done[0].note == r.note);
    CHECK(done[0].took == 2s);
    CHECK(done[0].reason == "asked by test");
    CHECK(f.st.leases().at(l.id).devices[0].uuid == "GPU-b0");
    CHECK(f.st.leases().at(l.id).last_moved_at == f.clock());
    CHECK(f.listed(a, l.id, "GPU-a0") == nullptr);
    CHECK(f.listed(b, l.id, "GPU-b0") != nullptr);
    CHECK(std::find(f.ch.leases_put.begin(), f.ch.leases_put.end(), l.id) != f.ch.leases_put.end());
    CHECK(f.st.moves_pending() == 0);
    // The same answer again changes nothing.
    CHECK(f.settle(a, {r}).empty());
}

TEST_CASE("migrate: a failed move leaves the lease where it was, and unanswered ones are given up",
          "[unit][mgmt]") {
    fixture f;
    std::string a = f.add(server("alpha", {gpu(0, "GPU-a0", 16 * GiB)}));
    std::string b = f.add(server("beta", {gpu(0, "GPU-b0", 16 * GiB)}));
    auto l = f.acquire(request("alpha", 4 * GiB));
    REQUIRE(f.st.request_move(f.plan(l.id, "beta"), "asked by test", f.clock()));
    auto r = report("7", l.id, "GPU-a0");
    r.move_seq = 1;
    r.note = "not moved: it uses CUDA graphs";
    auto done = f.settle(a, {r});
    REQUIRE(done.size() == 1);
    CHECK_FALSE(done[0].moved);
    CHECK(done[0].note == r.note);
    CHECK(f.st.leases().at(l.id).devices[0].uuid == "GPU-a0");
    CHECK(f.listed(b, l.id, "GPU-b0") == nullptr);
    CHECK(f.st.view(f.st.gpus().at("GPU-b0")).leases == 0);

    // Asked again (a new counter), and nobody answers within the timeout.
    REQUIRE(f.st.request_move(f.plan(l.id, "beta"), "asked by test", f.clock()));
    CHECK(f.listed(a, l.id, "GPU-a0")->move_seq == 2);
    f.clock.advance(f.st.config().move_timeout - 1s);
    f.beat(a, "GPU-a0", 0);
    f.beat(b, "GPU-b0", 0);
    CHECK(f.st.tick(f.clock(), f.ch).moves_given_up.empty());
    f.clock.advance(1s);
    f.beat(a, "GPU-a0", 0);
    f.beat(b, "GPU-b0", 0);
    auto t = f.st.tick(f.clock(), f.ch);
    REQUIRE(t.moves_given_up.size() == 1);
    CHECK_FALSE(t.moves_given_up[0].moved);
    CHECK(f.st.moves_pending() == 0);
    CHECK(f.listed(a, l.id, "GPU-a0")->move_to_uuid.empty());
}

TEST_CASE("migrate: when the old server is down, the new one's report settles the move", "[unit][mgmt]") {
    fixture f;
    std::string a = f.add(server("alpha", {gpu(0, "GPU-a0", 16 * GiB)}));
    std::string b = f.add(server("beta", {gpu(0, "GPU-b0", 16 * GiB)}));
    auto l = f.acquire(request("alpha", 4 * GiB));
    REQUIRE(f.st.request_move(f.plan(l.id, "beta"), "drain", f.clock()));
    // While the old server is up, the target's report is not an answer (the copy may still fail).
    CHECK(f.settle(b, {report("7", l.id, "GPU-b0")}).empty());
    f.clock.advance(11s);
    f.beat(b, "GPU-b0", 0);
    f.st.tick(f.clock(), f.ch);
    REQUIRE(f.st.servers().at(a).down);
    auto done = f.settle(b, {report("7", l.id, "GPU-b0")});
    REQUIRE(done.size() == 1);
    CHECK(done[0].moved);
    CHECK(f.st.leases().at(l.id).devices[0].uuid == "GPU-b0");
}

TEST_CASE("migrate: a session id names its lease's GPU", "[unit][mgmt]") {
    fixture f;
    std::string a = f.add(server("alpha", {gpu(0, "GPU-a0", 16 * GiB)}));
    std::string b = f.add(server("beta", {gpu(0, "GPU-b0", 16 * GiB)}));
    auto two = f.acquire(request("x", 4 * GiB, 2));
    REQUIRE(two.devices.size() == 2);
    // A lease of two GPUs is ambiguous; its sessions are not.
    CHECK(f.st.find_lease_device(two.id).error().code == errc::bad_request);
    f.beat(a, "GPU-a0", 0, 0, {report("11", two.id, "GPU-a0")});
    f.beat(b, "GPU-b0", 0, 0, {report("12", two.id, "GPU-b0")});
    auto d = f.st.find_lease_device("12");
    REQUIRE(d);
    CHECK(d->first == two.id);
    CHECK(two.devices[d->second].uuid == "GPU-b0");
    CHECK(f.st.find_lease_device("13").error().code == errc::not_found);
}

// ------------------------------------------------------------------------------------------------ rebalance

namespace {

struct cluster : fixture {
    std::string a, b, c;
    rebalancer policy{rebalance_config{30, 3, 5s, 1, 10min}};
    cluster() {
        a = add(server("alpha", {gpu(0, "GPU-a0", 80 * GiB)}));
        b = add(server("beta", {gpu(0, "GPU-b0", 80 * GiB)}));
        c = add(server("gamma", {gpu(0, "GPU-g0", 80 * GiB)}));
    }
    // Every server reports: alpha at `hot` percent with `sessions`, the others at the given loads.
    void loads(uint32_t hot, uint32_t beta, uint32_t gamma, std::vector<session_report> sessions = {}) {
        beat(a, "GPU-a0", hot, 0, std::move(sessions));
        beat(b, "GPU-b0", beta);
        beat(c, "GPU-g0", gamma);
    }
    rebalance_decision step() {
        auto d = policy.step(st, clock());
        clock.advance(5s);
        return d;
    }
};

using kind = rebalance_decision::kind;

}  // namespace

TEST_CASE("rebalance: pressure is the larger of utilization and memory in use", "[unit][mgmt]") {
    gpu_record g;
    g.info.memory = 80 * GiB;
    g.load.utilization = 20;
    g.load.memory_used = 60 * GiB;
    CHECK(gpu_pressure(g) == 75);
    g.load.utilization = 90;
    CHECK(gpu_pressure(g) == 90);
}

TEST_CASE("rebalance: only after the spread stayed above the threshold for `sustain` samples",
          "[unit][mgmt]") {
    cluster f;
    auto l = f.acquire(request("alpha", 8 * GiB));
    REQUIRE(l.devices[0].uuid == "GPU-a0");
    auto s = report("1", l.id, "GPU-a0", 0, 2 * GiB);
    f.loads(90, 50, 70, {s});  // spread 40 > 30
    CHECK(f.step().what == kind::none);
    CHECK(f.step().what == kind::none);
    f.loads(90, 65, 70, {s});  // 25: even enough; the count starts again
    CHECK(f.step().what == kind::none);
    f.loads(90, 10, 70, {s});
    CHECK(f.step().what == kind::none);
    CHECK(f.step().what == kind::none);
    // Samples come no faster than the interval, however often the policy is asked.
    CHECK(f.policy.step(f.st, f.clock() - 1s).what == kind::none);
    auto d = f.step();
    REQUIRE(d.what == kind::move);
    CHECK(d.plan.lease_id == l.id);
    CHECK(d.plan.to_uuid == "GPU-b0");  // the coolest
    CHECK(d.hot_pressure == 90);
    CHECK(d.cool_pressure == 10);
    CHECK_THAT(d.detail, Catch::Contains("moving lease " + l.id));
}

TEST_CASE("rebalance: the busiest, then the smallest lease of the hottest GPU goes", "[unit][mgmt]") {
    cluster f;
    auto big = f.acquire(request("alpha", 8 * GiB));
    auto small = f.acquire(request("alpha", 8 * GiB));
    auto idle = f.acquire(request("alpha", 8 * GiB));
    f.loads(95, 0, 50,
            {report("1", big.id, "GPU-a0", 0, 6 * GiB), report("2", small.id, "GPU-a0", 100, 1 * GiB),
             report("3", idle.id, "GPU-a0", 60'000, 10 * 1024 * 1024)});
    for (int i = 0; i < 2; ++i) CHECK(f.step().what == kind::none);
    auto d = f.step();
    REQUIRE(d.what == kind::move);
    CHECK(d.plan.lease_id == small.id);
    CHECK(d.session_id == "2");
}

TEST_CASE("rebalance: a cap per minute, a cooldown per lease, nothing while a move is under way",
          "[unit][mgmt]") {
    cluster f;
    auto l1 = f.acquire(request("alpha", 8 * GiB));
    auto l2 = f.acquire(request("alpha", 8 * GiB));
    std::vector<session_report> on_a{report("1", l1.id, "GPU-a0"), report("2", l2.id, "GPU-a0")};
    f.loads(90, 0, 0, on_a);
    f.step();
    f.step();
    auto d = f.step();
    REQUIRE(d.what == kind::move);
    REQUIRE(f.st.request_move(d.plan, "rebalance", f.clock()));
    f.policy.moved(f.clock());
    // Under way: no sample counts.
    for (int i = 0; i < 4; ++i) CHECK(f.step().what == kind::none);
    auto r = on_a[0].lease_id == d.plan.lease_id ? on_a[0] : on_a[1];
    r.move_seq = 1;
    r.moved_to = "beta:7300";
    REQUIRE(f.settle(f.a, {r}).size() == 1);
    // Still uneven, but one move this minute already (the clock went 35 s since it was asked).
    std::vector<session_report> left{on_a[0].lease_id == d.plan.lease_id ? on_a[1] : on_a[0]};
    f.loads(90, 0, 0, left);
    f.clock.advance(1s);
    for (int i = 0; i < 2; ++i) CHECK(f.step().what == kind::none);
    CHECK(f.step().what == kind::held_back);
    // A minute on, the other lease may go.
    f.clock.advance(30s);
    f.loads(90, 0, 0, left);
    for (int i = 0; i < 2; ++i) f.step();
    auto d2 = f.step();
    REQUIRE(d2.what == kind::move);
    CHECK(d2.plan.lease_id != d.plan.lease_id);

    // The lease that moved, now hot on beta, stays there during its cooldown.
    f.beat(f.a, "GPU-a0", 0);
    f.beat(f.b, "GPU-b0", 90, 0, {report("9", d.plan.lease_id, "GPU-b0")});
    f.beat(f.c, "GPU-g0", 0);
    f.clock.advance(2min);
    f.step();
    f.step();
    auto d3 = f.step();
    CHECK(d3.what == kind::no_candidate);
    CHECK_THAT(d3.detail, Catch::Contains("cooldown"));
    // After it, it may move again.
    f.clock.advance(10min);
    f.beat(f.a, "GPU-a0", 0);
    f.beat(f.b, "GPU-b0", 90, 0, {report("9", d.plan.lease_id, "GPU-b0")});
    f.beat(f.c, "GPU-g0", 0);
    f.step();
    f.step();
    CHECK(f.step().what == kind::move);
}

TEST_CASE("rebalance: cordoned GPUs and GPUs without load reports do not count", "[unit][mgmt]") {
    cluster f;
    auto l = f.acquire(request("alpha", 8 * GiB));
    f.beat(f.a, "GPU-a0", 90, 0, {report("1", l.id, "GPU-a0")});
    // Only alpha has reported load: nothing to compare.
    for (int i = 0; i < 4; ++i) CHECK(f.step().what == kind::none);
    f.beat(f.b, "GPU-b0", 0);
    REQUIRE(f.st.cordon("GPU-b0", true, f.ch));
    for (int i = 0; i < 4; ++i) CHECK(f.step().what == kind::none);
    REQUIRE(f.st.cordon("GPU-b0", false, f.ch));
    f.step();
    f.step();
    CHECK(f.step().what == kind::move);
}

// ------------------------------------------------------------------------------------------------ service

namespace {

const std::string secret = "test-secret-0123456789";

template <class T>
nlohmann::json json_of(const T& v) {
    return nlohmann::json(v);
}

struct manager {
    fake_clock clock;
    service svc{service_config{{10s, 30s}, secret}, nullptr, [this] { return clock(); }};
    nlohmann::json call(const std::string& method, const nlohmann::json& body) {
        auto text = body.dump();
        auto r = svc.handle(method, text,
                            sign_request(secret, method, text,
                                         std::chrono::system_clock::time_point(clock().time_since_epoch())));
        INFO(method << ": " << r.error);
        REQUIRE(r.ok);
        return nlohmann::json::parse(r.body);
    }
};

}  // namespace

TEST_CASE("service: lease.migrate signs a token for the target, and server.drain moves leases unless --wait",
          "[unit][mgmt]") {
    manager m;
    std::string a =
        m.call("server.register", json_of(server("alpha", {gpu(0, "GPU-a0", 16 * GiB)})))["server_id"];
    std::string b =
        m.call("server.register", json_of(server("beta", {gpu(0, "GPU-b0", 16 * GiB)})))["server_id"];
    auto grant = m.call("lease.acquire", json_of(request("alpha", 4 * GiB)));
    std::string lease = grant["lease_id"];
    auto moved = m.call("lease.migrate", {{"target", lease}, {"to", "beta"}});
    CHECK(moved["to_uuid"] == "GPU-b0");
    CHECK(moved["to_server_id"] == b);

    heartbeat hb;
    hb.server_id = a;
    auto reply = m.call("server.heartbeat", nlohmann::json::parse(encode(hb)));
    auto leases = reply["leases"];
    REQUIRE(leases.size() == 1);
    CHECK(leases[0]["move_to_uuid"] == "GPU-b0");
    auto claims = verify_token(secret, leases[0]["move_token"].get<std::string>(),
                               std::chrono::system_clock::time_point(m.clock().time_since_epoch()));
    REQUIRE(claims);
    CHECK(claims->lease_id == lease);
    CHECK(claims->gpu_uuid == "GPU-b0");
    CHECK(claims->memory_quota == 4 * GiB);

    // The server's answer: an event says where it went.
    hb.sessions.push_back(report("5", lease, "GPU-a0"));
    hb.sessions[0].move_seq = 1;
    hb.sessions[0].moved_to = "beta:7300";
    hb.sessions[0].note = "moved to beta:7300: 1 MiB of GPU state, paused 9 ms";
    m.call("server.heartbeat", nlohmann::json::parse(encode(hb)));
    auto events = m.call("events.list", nlohmann::json::object())["events"];
    bool said = false;
    for (auto& e : events) said = said || (e["kind"] == "moved" && e["lease_id"] == lease);
    CHECK(said);
    // `vcuda sessions` lists it where it runs, not where it was.
    CHECK(m.call("sessions.list", nlohmann::json::object())["sessions"].empty());

    // A drain of beta moves it back to alpha; --wait moves nothing.
    auto w = m.call("server.drain", {{"host", "beta"}, {"wait", true}});
    CHECK(w["moving"].empty());
    m.call("gpu.uncordon", {{"target", "beta"}});
    auto d = m.call("server.drain", {{"host", "beta"}});
    REQUIRE(d["moving"].size() == 1);
    CHECK(d["moving"][0]["to_uuid"] == "GPU-a0");
    // A lease that cannot move stays, with the reason.
    m.call("gpu.cordon", {{"target", "alpha"}});
    m.call("gpu.uncordon", {{"target", "beta"}});
    auto other = m.call("lease.acquire", json_of(request("beta", 4 * GiB)));
    auto d2 = m.call("server.drain", {{"host", "beta"}});
    REQUIRE(d2["staying"].size() == 1);
    CHECK(d2["staying"][0]["lease_id"] == other["lease_id"]);
}
