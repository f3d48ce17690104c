// The SQLite store: what the core changed is on disk, and a reopened database gives the same state.
#include <sqlite3.h>

#include <catch2/catch.hpp>

#include "mgmt/store/store.hpp"
#include "mgmt/tests/helpers.hpp"

using namespace vcuda::mgmt;
using namespace vcuda::mgmt::test;
using namespace std::chrono_literals;

TEST_CASE("the store persists servers, GPUs, leases and cordons across a reopen", "[unit][mgmt][store]") {
    temp_dir dir;
    auto db = dir / "mgmt.db";
    fake_clock clock;
    manager_state st(state_config{10s, 30s});
    std::string a, lease_id, drained;
    {
        auto store = sqlite_store::open(db);
        REQUIRE(store);
        state_changes ch;
        a = *st.register_server(server("alpha", {gpu(0, "GPU-a0", 16 * GiB), gpu(1, "GPU-a1", 16 * GiB)}),
                                clock(), ch);
        auto beta = server("beta", {gpu(0, "GPU-b0", 40 * GiB)});
        beta.address_window = 7;
        drained = *st.register_server(beta, clock(), ch);
        auto l = st.acquire(request("alpha", 4 * GiB, 2), clock(), ch);
        REQUIRE(l);
        lease_id = l->id;
        auto gone = st.acquire(request("x", 1 * GiB), clock(), ch);
        REQUIRE(gone);
        REQUIRE(st.cordon("GPU-a1", true, ch));
        REQUIRE(st.drain("beta", ch));
        REQUIRE((*store)->apply(st, ch));
        state_changes ch2;
        REQUIRE(st.release(gone->id, ch2));
        REQUIRE((*store)->apply(st, ch2));
    }
    auto store = sqlite_store::open(db);
    REQUIRE(store);
    auto snap = (*store)->load();
    REQUIRE(snap);
    manager_state back(state_config{10s, 30s});
    back.load(*snap, clock());

    REQUIRE(back.servers().size() == 2);
    CHECK(back.servers().at(a).host == "alpha");
    CHECK(back.servers().at(a).endpoints == std::vector<std::string>{"alpha:7300"});
    CHECK(back.servers().at(drained).draining);
    CHECK(back.servers().at(drained).address_window == 7);
    CHECK(back.servers().at(a).address_window == -1);
    REQUIRE(back.gpus().size() == 3);
    CHECK(back.gpus().at("GPU-a1").cordoned);
    CHECK_FALSE(back.gpus().at("GPU-a0").cordoned);
    CHECK(back.gpus().at("GPU-b0").info.memory == 40 * GiB);
    CHECK(back.gpus().at("GPU-b0").info.name == "NVIDIA H100 80GB HBM3");
    REQUIRE(back.leases().size() == 1);
    auto& l = back.leases().at(lease_id);
    CHECK(l.client_host == "alpha");
    CHECK(l.pid == 4242);
    REQUIRE(l.devices.size() == 2);
    CHECK(l.devices == st.leases().at(lease_id).devices);
    CHECK(l.expires_at == st.leases().at(lease_id).expires_at);
}

TEST_CASE("the store follows re-registration, expiry and server removal", "[unit][mgmt][store]") {
    temp_dir dir;
    auto store = sqlite_store::open(dir / "mgmt.db");
    REQUIRE(store);
    fake_clock clock;
    manager_state st(state_config{10s, 30s});
    state_changes ch;
    auto a = *st.register_server(server("alpha", {gpu(0, "GPU-a0", 16 * GiB), gpu(1, "GPU-a1", 16 * GiB)}),
                                 clock(), ch);
    REQUIRE(st.acquire(request("x", 1 * GiB), clock(), ch));
    REQUIRE((*store)->apply(st, ch));
    // The server drops a GPU, then comes back on another port; the lease expires.
    state_changes ch2;
    REQUIRE(*st.register_server(server("alpha", {gpu(0, "GPU-a0", 16 * GiB)}), clock(), ch2) == a);
    auto moved =
        *st.register_server(server("alpha", {gpu(0, "GPU-a0", 16 * GiB)}, "alpha:7301"), clock(), ch2);
    REQUIRE(moved != a);
    clock.advance(31s);
    st.tick(clock(), ch2);
    REQUIRE((*store)->apply(st, ch2));
    auto snap = (*store)->load();
    REQUIRE(snap);
    REQUIRE(snap->servers.size() == 1);
    CHECK(snap->servers[0].id == moved);
    CHECK(snap->servers[0].endpoints == std::vector<std::string>{"alpha:7301"});
    REQUIRE(snap->gpus.size() == 1);
    CHECK(snap->gpus[0].info.uuid == "GPU-a0");
    CHECK(snap->gpus[0].server_id == moved);
    CHECK(snap->leases.empty());
    // The server marked down is stored as down.
    state_changes ch3;
    clock.advance(11s);
    st.tick(clock(), ch3);
    REQUIRE((*store)->apply(st, ch3));
    CHECK((*store)->load()->servers[0].down);
}

TEST_CASE("the store refuses a database it cannot open, saying what to do", "[unit][mgmt][store]") {
    auto s = sqlite_store::open("/nonexistent-folder/x/mgmt.db");
    REQUIRE_FALSE(s);
    CHECK(s.error().find("--db") != std::string::npos);
}

TEST_CASE("the store upgrades a schema-2 database: servers gain their address window",
          "[unit][mgmt][store]") {
    temp_dir dir;
    auto db = dir / "mgmt.db";
    {
        sqlite3* raw = nullptr;
        REQUIRE(sqlite3_open((db).c_str(), &raw) == SQLITE_OK);
        const char* v2 =
            "CREATE TABLE servers (id TEXT PRIMARY KEY, host TEXT NOT NULL, endpoints TEXT NOT NULL, "
            "cordoned "
            "INTEGER NOT NULL DEFAULT 0, draining INTEGER NOT NULL DEFAULT 0, down INTEGER NOT NULL DEFAULT "
            "0, "
            "registered_at INTEGER NOT NULL);"
            "INSERT INTO servers VALUES ('srv-old', 'alpha', '[\"alpha:7300\"]', 0, 0, 0, 1);"
            "PRAGMA user_version=2;";
        CHECK(sqlite3_exec(raw, v2, nullptr, nullptr, nullptr) == SQLITE_OK);
        sqlite3_close(raw);
    }
    auto store = sqlite_store::open(db);
    REQUIRE(store);
    auto snap = (*store)->load();
    REQUIRE(snap);
    REQUIRE(snap->servers.size() == 1);
    CHECK(snap->servers[0].host == "alpha");
    CHECK(snap->servers[0].address_window == -1);
}
