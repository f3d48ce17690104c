// The manager's core with a fake clock: placement order, no over-commit, exclusive leases, renewal and
// expiry, heartbeat timeouts, cordon and drain, re-registration and restart.
#include <catch2/catch.hpp>

#include "mgmt/core/state.hpp"
#include "mgmt/tests/helpers.hpp"

using namespace vcuda::mgmt;
using namespace vcuda::mgmt::test;
using namespace std::chrono_literals;

namespace {

struct fixture : state_fixture {
    fixture() : state_fixture(state_config{10s, 30s}) {}
    std::string code_of(const lease_request& r) {
        auto l = st.acquire(r, clock(), ch);
        REQUIRE_FALSE(l);
        return l.error().code;
    }
    void load(const std::string& server_id, const std::string& uuid, uint32_t util, uint32_t sessions = 0) {
        heartbeat hb;
        hb.server_id = server_id;
        hb.gpus.push_back({uuid, util, 0, sessions});
        REQUIRE(st.heartbeat(hb, clock(), ch));
    }
};

}  // namespace

TEST_CASE("placement: the client's own host first", "[unit][mgmt]") {
    fixture f;
    f.add(server("alpha", {gpu(0, "GPU-a0", 16 * GiB)}));
    f.add(server("beta", {gpu(0, "GPU-b0", 80 * GiB)}));
    // alpha's 16 GiB GPU is the better fit for 8 GiB, but the client runs on beta.
    CHECK(f.acquire(request("beta", 8 * GiB)).devices.at(0).uuid == "GPU-b0");
    // Host names compare case-insensitively, and a client may name itself by an endpoint's address.
    f.add(server("gamma", {gpu(0, "GPU-g0", 80 * GiB)}, "10.1.2.3:7300"));
    CHECK(f.acquire(request("10.1.2.3", 8 * GiB)).devices.at(0).uuid == "GPU-g0");
    CHECK(f.acquire(request("ALPHA", 8 * GiB)).devices.at(0).uuid == "GPU-a0");
}

TEST_CASE("placement: then best fit by memory", "[unit][mgmt]") {
    fixture f;
    f.add(server("alpha", {gpu(0, "GPU-a0", 16 * GiB), gpu(1, "GPU-a1", 40 * GiB)}));
    f.add(server("beta", {gpu(0, "GPU-b0", 24 * GiB)}));
    // 10 GiB leaves 6 on a0, 30 on a1, 14 on b0: a0 fits best.
    CHECK(f.acquire(request("elsewhere", 10 * GiB)).devices.at(0).uuid == "GPU-a0");
    // 8 GiB more: a0 has only 6 left; b0 would keep 16, a1 32: b0.
    CHECK(f.acquire(request("elsewhere", 8 * GiB)).devices.at(0).uuid == "GPU-b0");
    // 20 GiB: only a1 can (b0 has 16 free).
    CHECK(f.acquire(request("elsewhere", 20 * GiB)).devices.at(0).uuid == "GPU-a1");
}

TEST_CASE("placement: then least loaded", "[unit][mgmt]") {
    fixture f;
    auto a = f.add(server("alpha", {gpu(0, "GPU-a0", 16 * GiB)}));
    auto b = f.add(server("beta", {gpu(0, "GPU-b0", 16 * GiB)}));
    f.load(a, "GPU-a0", 90);
    f.load(b, "GPU-b0", 10);
    CHECK(f.acquire(request("x", 4 * GiB)).devices.at(0).uuid == "GPU-b0");
    // Now b0 fits better (12 GiB free vs 16): memory fit wins over load.
    CHECK(f.acquire(request("x", 4 * GiB)).devices.at(0).uuid == "GPU-b0");
    // Equal utilization: fewer sessions wins.
    fixture g;
    auto c = g.add(server("c", {gpu(0, "GPU-c0", 16 * GiB)}));
    auto d = g.add(server("d", {gpu(0, "GPU-d0", 16 * GiB)}));
    g.load(c, "GPU-c0", 50, 3);
    g.load(d, "GPU-d0", 50, 1);
    CHECK(g.acquire(request("x", 4 * GiB)).devices.at(0).uuid == "GPU-d0");
}

TEST_CASE("shared GPUs are never over-committed", "[unit][mgmt]") {
    fixture f;
    f.add(server("alpha", {gpu(0, "GPU-a0", 16 * GiB)}));
    auto l1 = f.acquire(request("x", 6 * GiB));
    auto l2 = f.acquire(request("x", 6 * GiB));
    CHECK(f.code_of(request("x", 6 * GiB)) == errc::no_capacity);  // 12 + 6 > 16
    auto l3 = f.acquire(request("x", 4 * GiB));                    // exactly full
    CHECK(f.code_of(request("x", 1)) == errc::no_capacity);
    auto v = f.st.view(f.st.gpus().at("GPU-a0"));
    CHECK(v.leased_memory == 16 * GiB);
    CHECK(v.leases == 3);
    REQUIRE(f.st.release(l2.id, f.ch));
    CHECK(f.acquire(request("x", 6 * GiB)).devices.at(0).memory_quota == 6 * GiB);
    // Bigger than any GPU: refused with a reason.
    auto big = f.st.acquire(request("x", 17 * GiB), f.clock(), f.ch);
    REQUIRE_FALSE(big);
    CHECK(big.error().message.find("smaller than the request") != std::string::npos);
}

TEST_CASE("memory 0 means the whole GPU", "[unit][mgmt]") {
    fixture f;
    f.add(server("alpha", {gpu(0, "GPU-a0", 16 * GiB)}));
    auto l = f.acquire(request("x", 0));
    CHECK(l.devices.at(0).memory_quota == 16 * GiB);
    CHECK(f.code_of(request("x", 1 * GiB)) == errc::no_capacity);
}

TEST_CASE("exclusive leases take a whole GPU nobody else uses", "[unit][mgmt]") {
    fixture f;
    f.add(server("alpha", {gpu(0, "GPU-a0", 16 * GiB), gpu(1, "GPU-a1", 16 * GiB)}));
    auto shared = f.acquire(request("x", 2 * GiB));
    auto excl = f.acquire(request("x", 1 * GiB, 1, true));
    CHECK(excl.exclusive);
    CHECK(excl.devices.at(0).uuid != shared.devices.at(0).uuid);  // not the GPU that has a shared lease
    CHECK(excl.devices.at(0).memory_quota == 16 * GiB);           // the whole GPU
    // The exclusive GPU takes no shared lease even though the other GPU is fuller.
    auto s2 = f.acquire(request("x", 2 * GiB));
    CHECK(s2.devices.at(0).uuid == shared.devices.at(0).uuid);
    CHECK(f.code_of(request("x", 1 * GiB, 1, true)) == errc::no_capacity);  // no GPU without leases left
    CHECK(f.st.view(f.st.gpus().at(excl.devices.at(0).uuid)).exclusive);
}

TEST_CASE("several GPUs in one lease, on one host when asked", "[unit][mgmt]") {
    fixture f;
    f.add(server("alpha", {gpu(0, "GPU-a0", 16 * GiB)}));
    f.add(server("beta", {gpu(0, "GPU-b0", 16 * GiB), gpu(1, "GPU-b1", 16 * GiB)}));
    auto two = f.acquire(request("alpha", 4 * GiB, 2));
    REQUIRE(two.devices.size() == 2);
    CHECK(two.devices[0].uuid == "GPU-a0");  // local first
    CHECK(two.devices[1].uuid != "GPU-a0");
    lease_request same = request("alpha", 4 * GiB, 2);
    same.hints.same_host = true;
    auto l = f.acquire(same);
    CHECK(f.st.server_of_gpu(l.devices[0].uuid)->host == "beta");
    CHECK(f.st.server_of_gpu(l.devices[1].uuid)->host == "beta");
    CHECK(l.devices[0].uuid != l.devices[1].uuid);
    // All or nothing: 4 GPUs do not exist, and nothing is leased by trying.
    size_t before = f.st.leases().size();
    CHECK(f.code_of(request("x", 1 * GiB, 4)) == errc::no_capacity);
    CHECK(f.st.leases().size() == before);
    CHECK(f.code_of(request("x", 1 * GiB, 0)) == errc::bad_request);
}

TEST_CASE("the model hint picks GPUs by name", "[unit][mgmt]") {
    fixture f;
    f.add(server("alpha", {gpu(0, "GPU-a0", 16 * GiB, "Tesla T4")}));
    f.add(server("beta", {gpu(0, "GPU-b0", 80 * GiB, "NVIDIA H100 80GB HBM3")}));
    lease_request r = request("alpha", 1 * GiB);
    r.hints.model = "h100";
    CHECK(f.acquire(r).devices.at(0).uuid == "GPU-b0");
    r.hints.model = "A100";
    CHECK(f.code_of(r) == errc::no_capacity);
}

TEST_CASE("leases are renewed and expire after the TTL", "[unit][mgmt]") {
    fixture f;
    auto a = f.add(server("alpha", {gpu(0, "GPU-a0", 16 * GiB)}));
    auto l = f.acquire(request("x", 16 * GiB));
    CHECK(l.expires_at == f.clock() + 30s);
    f.clock.advance(20s);
    auto r = f.st.renew(l.id, f.clock(), f.ch);
    REQUIRE(r);
    CHECK(r->expires_at == f.clock() + 30s);
    f.clock.advance(29s);
    CHECK(f.st.tick(f.clock(), f.ch).leases_expired.empty());
    CHECK(f.code_of(request("x", 1 * GiB)) == errc::no_capacity);  // still held
    f.clock.advance(1s);
    auto t = f.st.tick(f.clock(), f.ch);
    REQUIRE(t.leases_expired.size() == 1);
    CHECK(t.leases_expired[0].id == l.id);
    CHECK(f.st.leases().empty());
    auto again = f.st.renew(l.id, f.clock(), f.ch);
    REQUIRE_FALSE(again);
    CHECK(again.error().code == errc::unknown_lease);
    f.load(a, "GPU-a0", 0);             // (the server was silent for 50 s: it is down until it speaks)
    f.acquire(request("x", 16 * GiB));  // the memory is free again
}

TEST_CASE("a server that misses heartbeats is marked down and comes back", "[unit][mgmt]") {
    fixture f;
    auto a = f.add(server("alpha", {gpu(0, "GPU-a0", 16 * GiB)}));
    f.clock.advance(9s);
    f.load(a, "GPU-a0", 5);  // heartbeat at 9 s
    f.clock.advance(10s);    // 10 s since: not yet over the timeout
    CHECK(f.st.tick(f.clock(), f.ch).servers_down.empty());
    f.clock.advance(1ms);
    auto t = f.st.tick(f.clock(), f.ch);
    REQUIRE(t.servers_down == std::vector<std::string>{a});
    CHECK(f.st.servers().at(a).down);
    CHECK(f.st.view(f.st.gpus().at("GPU-a0")).state == "down");
    CHECK(f.code_of(request("x", 1 * GiB)) == errc::no_capacity);
    CHECK(f.st.tick(f.clock(), f.ch).servers_down.empty());  // reported once
    f.load(a, "GPU-a0", 5);
    CHECK_FALSE(f.st.servers().at(a).down);
    f.acquire(request("x", 1 * GiB));
    // A heartbeat from an unknown server asks it to register again.
    heartbeat hb;
    hb.server_id = "srv-nope";
    auto r = f.st.heartbeat(hb, f.clock(), f.ch);
    REQUIRE_FALSE(r);
    CHECK(r.error().code == errc::unknown_server);
}

TEST_CASE("heartbeat replies list the leases alive on the server", "[unit][mgmt]") {
    fixture f;
    auto a = f.add(server("alpha", {gpu(0, "GPU-a0", 16 * GiB)}));
    f.add(server("beta", {gpu(0, "GPU-b0", 16 * GiB)}));
    auto l = f.acquire(request("alpha", 3 * GiB));
    f.acquire(request("beta", 3 * GiB));
    heartbeat hb;
    hb.server_id = a;
    auto r = f.st.heartbeat(hb, f.clock(), f.ch);
    REQUIRE(r);
    REQUIRE(r->leases.size() == 1);
    CHECK(r->leases[0].lease_id == l.id);
    CHECK(r->leases[0].uuid == "GPU-a0");
    CHECK(r->leases[0].memory_quota == 3 * GiB);
    CHECK(r->heartbeat_interval_ms == 3333);
}

TEST_CASE("cordon and drain stop new leases but existing ones keep running", "[unit][mgmt]") {
    fixture f;
    auto a = f.add(server("alpha", {gpu(0, "GPU-a0", 16 * GiB), gpu(1, "GPU-a1", 16 * GiB)}));
    auto b = f.add(server("beta", {gpu(0, "GPU-b0", 16 * GiB)}));

    SECTION("a GPU") {
        REQUIRE(f.st.cordon("GPU-a0", true, f.ch));
        CHECK(f.st.view(f.st.gpus().at("GPU-a0")).state == "cordoned");
        for (int i = 0; i < 2; ++i) CHECK(f.acquire(request("alpha", 16 * GiB)).devices[0].uuid != "GPU-a0");
        CHECK(f.code_of(request("alpha", 16 * GiB)) == errc::no_capacity);
        REQUIRE(f.st.cordon("GPU-a0", false, f.ch));
        CHECK(f.acquire(request("alpha", 16 * GiB)).devices[0].uuid == "GPU-a0");
    }
    SECTION("a server, by host") {
        auto held = f.acquire(request("alpha", 4 * GiB));
        auto r = f.st.cordon("alpha", true, f.ch);
        REQUIRE(r);
        CHECK(r->servers == std::vector<std::string>{a});
        CHECK(f.acquire(request("alpha", 4 * GiB)).devices[0].uuid == "GPU-b0");
        CHECK(f.st.renew(held.id, f.clock(), f.ch));  // existing leases are renewed
        REQUIRE(f.st.cordon("alpha", false, f.ch));
        CHECK(f.acquire(request("alpha", 4 * GiB)).devices[0].uuid != "GPU-b0");
    }
    SECTION("drain") {
        auto held = f.acquire(request("beta", 4 * GiB));
        REQUIRE(held.devices[0].uuid == "GPU-b0");
        auto r = f.st.drain("beta", f.ch);
        REQUIRE(r);
        CHECK(*r == std::vector<std::string>{b});
        CHECK(f.st.view(f.st.gpus().at("GPU-b0")).state == "draining");
        CHECK(f.acquire(request("beta", 4 * GiB)).devices[0].uuid != "GPU-b0");
        CHECK(f.st.renew(held.id, f.clock(), f.ch));
        CHECK(f.st.leases_on_server(b) == 1);
        REQUIRE(f.st.release(held.id, f.ch));
        CHECK(f.st.leases_on_server(b) == 0);
        REQUIRE(f.st.cordon("beta", false, f.ch));  // uncordon ends the drain
        CHECK_FALSE(f.st.servers().at(b).draining);
        CHECK(f.acquire(request("beta", 4 * GiB)).devices[0].uuid == "GPU-b0");
    }
    SECTION("unknown targets are refused") {
        auto r = f.st.cordon("nowhere", true, f.ch);
        REQUIRE_FALSE(r);
        CHECK(r.error().code == errc::not_found);
        CHECK_FALSE(f.st.drain("nowhere", f.ch));
    }
}

TEST_CASE("re-registration keeps the server id, cordons and leases", "[unit][mgmt]") {
    fixture f;
    auto a = f.add(server("alpha", {gpu(0, "GPU-a0", 16 * GiB)}));
    REQUIRE(f.st.cordon("GPU-a0", true, f.ch));
    REQUIRE(f.st.cordon("GPU-a0", false, f.ch));
    auto l = f.acquire(request("x", 4 * GiB));
    REQUIRE(f.st.cordon("GPU-a0", true, f.ch));
    CHECK(f.add(server("alpha", {gpu(0, "GPU-a0", 16 * GiB)})) == a);
    CHECK(f.st.gpus().at("GPU-a0").cordoned);
    CHECK(f.st.leases().contains(l.id));
    // The same GPUs announced from another address: the old server record goes, the GPUs and leases stay.
    state_changes ch;
    auto moved =
        f.st.register_server(server("alpha", {gpu(0, "GPU-a0", 16 * GiB)}, "alpha:7301"), f.clock(), ch);
    REQUIRE(moved);
    CHECK(*moved != a);
    CHECK(ch.servers_deleted == std::vector<std::string>{a});
    CHECK_FALSE(f.st.servers().contains(a));
    CHECK(f.st.gpus().at("GPU-a0").server_id == *moved);
    CHECK(f.st.view(f.st.gpus().at("GPU-a0")).leased_memory == 4 * GiB);
    // Bad registrations.
    CHECK_FALSE(f.st.register_server(server("", {}), f.clock(), ch));
    CHECK_FALSE(f.st.register_server(server("h", {gpu(0, "G", 1), gpu(1, "G", 1)}), f.clock(), ch));
}

TEST_CASE("one server per address window: another asking for a held one is refused, naming free ones",
          "[unit][mgmt]") {
    fixture f;
    auto windowed = [](server_registration r, int32_t w) {
        r.address_window = w;
        return r;
    };
    auto a = f.add(windowed(server("alpha", {gpu(0, "GPU-a0", 16 * GiB)}), 1));
    f.add(windowed(server("beta", {gpu(0, "GPU-b0", 16 * GiB)}), 0));
    state_changes ch;
    auto refused =
        f.st.register_server(windowed(server("gamma", {gpu(0, "GPU-g0", 16 * GiB)}), 1), f.clock(), ch);
    REQUIRE_FALSE(refused);
    CHECK(refused.error().code == errc::address_window_taken);
    CHECK_THAT(refused.error().message, Catch::Contains("address window 1 is server " + a + "'s (alpha") &&
                                            Catch::Contains("--address-window N, a free one (2, 3, 4"));
    CHECK_FALSE(f.st.gpus().contains("GPU-g0"));
    CHECK(ch.servers_put.empty());
    // Still refused while the holder is down: its sessions keep their addresses wherever they go.
    f.clock.advance(20s);
    f.st.tick(f.clock(), ch);
    REQUIRE(f.st.servers().at(a).down);
    CHECK_FALSE(
        f.st.register_server(windowed(server("gamma", {gpu(0, "GPU-g0", 16 * GiB)}), 1), f.clock(), ch));
    // The holder itself registers again (the same server, or its GPUs from another address); other windows
    // and servers without one are free; a window out of range is a bad request.
    CHECK(f.add(windowed(server("alpha", {gpu(0, "GPU-a0", 16 * GiB)}), 1)) == a);
    auto moved = f.st.register_server(
        windowed(server("alpha", {gpu(0, "GPU-a0", 16 * GiB)}, "alpha:7301"), 1), f.clock(), ch);
    REQUIRE(moved);
    CHECK(f.st.servers().at(*moved).address_window == 1);
    CHECK(f.st.register_server(windowed(server("gamma", {gpu(0, "GPU-g0", 16 * GiB)}), 2), f.clock(), ch));
    CHECK(f.st.register_server(server("delta", {gpu(0, "GPU-d0", 16 * GiB)}), f.clock(), ch));
    CHECK(f.st.register_server(server("epsilon", {gpu(0, "GPU-e0", 16 * GiB)}), f.clock(), ch));
    auto bad =
        f.st.register_server(windowed(server("zeta", {gpu(0, "GPU-z0", 16 * GiB)}), 64), f.clock(), ch);
    REQUIRE_FALSE(bad);
    CHECK(bad.error().code == errc::bad_request);
    // A heartbeat naming another window than the record's (a record a manager without windows stored) is told
    // to register again, where the rule applies.
    heartbeat hb;
    hb.server_id = *moved;
    hb.address_window = 1;
    CHECK(f.st.heartbeat(hb, f.clock(), ch));
    hb.address_window = 5;
    auto again = f.st.heartbeat(hb, f.clock(), ch);
    REQUIRE_FALSE(again);
    CHECK(again.error().code == errc::unknown_server);
}

TEST_CASE("a server that chose its window itself is given a free one: the one it had, else the lowest",
          "[unit][mgmt]") {
    fixture f;
    auto windowed = [](server_registration r, int32_t w, bool chosen) {
        r.address_window = w;
        r.address_window_auto = chosen;
        return r;
    };
    f.add(windowed(server("alpha", {gpu(0, "GPU-a0", 16 * GiB)}), 0, false));
    f.add(windowed(server("beta", {gpu(0, "GPU-b0", 16 * GiB)}), 1, false));
    state_changes ch;
    // Its own choice when free.
    auto gamma =
        f.st.register_server(windowed(server("gamma", {gpu(0, "GPU-g0", 16 * GiB)}), 7, true), f.clock(), ch);
    REQUIRE(gamma);
    CHECK(f.st.servers().at(*gamma).address_window == 7);
    // Taken: the lowest free one, recorded (and persisted: servers_put).
    ch = {};
    auto delta =
        f.st.register_server(windowed(server("delta", {gpu(0, "GPU-d0", 16 * GiB)}), 1, true), f.clock(), ch);
    REQUIRE(delta);
    CHECK(f.st.servers().at(*delta).address_window == 2);
    CHECK(ch.servers_put == std::vector<std::string>{*delta});
    // Restarted, it chose 7 again (gamma's): it gets back the window it had.
    auto again =
        f.st.register_server(windowed(server("delta", {gpu(0, "GPU-d0", 16 * GiB)}), 7, true), f.clock(), ch);
    REQUIRE(again);
    CHECK(*again == *delta);
    CHECK(f.st.servers().at(*delta).address_window == 2);
    // Every window taken: refused as a server that named its window is.
    for (int32_t w = 3; w < address_window_count; ++w)
        if (w != 7)
            REQUIRE(f.st.register_server(
                windowed(server("h" + std::to_string(w), {gpu(0, "GPU-h" + std::to_string(w), GiB)}), w,
                         false),
                f.clock(), ch));
    auto full =
        f.st.register_server(windowed(server("omega", {gpu(0, "GPU-o0", 16 * GiB)}), 1, true), f.clock(), ch);
    REQUIRE_FALSE(full);
    CHECK(full.error().code == errc::address_window_taken);
    CHECK_THAT(full.error().message, Catch::Contains("none left"));
}

TEST_CASE("a restarted manager keeps leases and gives clients and servers time", "[unit][mgmt]") {
    fixture f;
    auto a = f.add(server("alpha", {gpu(0, "GPU-a0", 16 * GiB)}));
    auto l = f.acquire(request("x", 4 * GiB));
    auto snap = f.st.snapshot();
    f.clock.advance(60s);  // the manager was away longer than the TTL and the heartbeat timeout
    manager_state restarted(f.st.config());
    restarted.load(snap, f.clock());
    state_changes ch;
    auto t = restarted.tick(f.clock(), ch);
    CHECK(t.leases_expired.empty());
    CHECK(t.servers_down.empty());
    REQUIRE(restarted.leases().contains(l.id));
    CHECK(restarted.leases().at(l.id).expires_at == f.clock() + 30s);
    CHECK(restarted.renew(l.id, f.clock(), ch));
    CHECK(restarted.servers().contains(a));
}
