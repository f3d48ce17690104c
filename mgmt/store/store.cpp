#include "mgmt/store/store.hpp"

#include <sqlite3.h>

#include <algorithm>
#include <nlohmann/json.hpp>

namespace vcuda::mgmt {

namespace {

// 1: servers, gpus, leases, lease_devices. 2: leases.tenant, credentials. 3: servers.address_window.
constexpr int schema_version = 3;

constexpr const char* schema_sql = R"sql(
CREATE TABLE IF NOT EXISTS servers (
  id            TEXT PRIMARY KEY,
  host          TEXT NOT NULL,
  endpoints     TEXT NOT NULL,          -- JSON array of strings
  cordoned      INTEGER NOT NULL DEFAULT 0,
  draining      INTEGER NOT NULL DEFAULT 0,
  down          INTEGER NOT NULL DEFAULT 0,
  registered_at INTEGER NOT NULL,       -- Unix ms
  address_window INTEGER NOT NULL DEFAULT -1  -- -1: none
);
CREATE TABLE IF NOT EXISTS gpus (
  uuid           TEXT PRIMARY KEY,
  server_id      TEXT NOT NULL,
  idx            INTEGER NOT NULL,
  name           TEXT NOT NULL,
  memory         INTEGER NOT NULL,     -- bytes
  sms            INTEGER NOT NULL,
  driver_version TEXT NOT NULL,
  cordoned       INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS gpus_by_server ON gpus(server_id);
CREATE TABLE IF NOT EXISTS leases (
  id          TEXT PRIMARY KEY,
  client_host TEXT NOT NULL,
  pid         INTEGER NOT NULL,
  exclusive   INTEGER NOT NULL,
  tenant      TEXT NOT NULL DEFAULT '',
  created_at  INTEGER NOT NULL,        -- Unix ms
  expires_at  INTEGER NOT NULL         -- Unix ms
);
CREATE TABLE IF NOT EXISTS lease_devices (
  lease_id     TEXT NOT NULL REFERENCES leases(id) ON DELETE CASCADE,
  position     INTEGER NOT NULL,        -- device ordinal within the lease
  uuid         TEXT NOT NULL,
  memory_quota INTEGER NOT NULL,
  PRIMARY KEY (lease_id, position)
);
CREATE TABLE IF NOT EXISTS credentials (
  id          TEXT PRIMARY KEY,
  tenant      TEXT NOT NULL,
  operator    INTEGER NOT NULL,
  hash        TEXT NOT NULL,           -- hex SHA-256 of the secret part; the credential itself is not kept
  created_at  INTEGER NOT NULL,        -- Unix ms
  expires_at  INTEGER NOT NULL,        -- Unix ms, 0 = never
  revoked_at  INTEGER NOT NULL DEFAULT 0,
  created_by  TEXT NOT NULL DEFAULT ''
);
)sql";

// A prepared statement that finalizes itself.
class stmt {
  public:
    stmt(sqlite3* db, const char* sql) { ok_ = sqlite3_prepare_v2(db, sql, -1, &s_, nullptr) == SQLITE_OK; }
    ~stmt() { sqlite3_finalize(s_); }
    bool ok() const { return ok_; }
    stmt& bind(int i, const std::string& v) {
        sqlite3_bind_text(s_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
        return *this;
    }
    stmt& bind(int i, int64_t v) {
        sqlite3_bind_int64(s_, i, v);
        return *this;
    }
    int step() { return sqlite3_step(s_); }
    void reset() {
        sqlite3_reset(s_);
        sqlite3_clear_bindings(s_);
    }
    bool run() {
        int rc = sqlite3_step(s_);
        sqlite3_reset(s_);
        sqlite3_clear_bindings(s_);
        return rc == SQLITE_DONE;
    }
    std::string text(int col) const {
        auto* p = sqlite3_column_text(s_, col);
        return p ? std::string(reinterpret_cast<const char*>(p), sqlite3_column_bytes(s_, col))
                 : std::string();
    }
    int64_t integer(int col) const { return sqlite3_column_int64(s_, col); }

  private:
    sqlite3_stmt* s_ = nullptr;
    bool ok_ = false;
};

}  // namespace

sqlite_store::~sqlite_store() {
    if (db_) sqlite3_close(db_);
}

std::string sqlite_store::error_text(const char* what) const {
    return std::string(what) + " (" + path_ + "): " + (db_ ? sqlite3_errmsg(db_) : "no database");
}

result<void, std::string> sqlite_store::exec(const char* sql) {
    char* err = nullptr;
    if (sqlite3_exec(db_, sql, nullptr, nullptr, &err) != SQLITE_OK) {
        std::string e = err ? err : "unknown error";
        sqlite3_free(err);
        return unexpected{"database " + path_ + ": " + e};
    }
    return {};
}

result<std::unique_ptr<sqlite_store>, std::string> sqlite_store::open(const std::string& path) {
    std::unique_ptr<sqlite_store> s(new sqlite_store);
    s->path_ = path;
    if (sqlite3_open_v2(path.c_str(), &s->db_,
                        SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX,
                        nullptr) != SQLITE_OK)
        return unexpected{s->error_text("cannot open the database") +
                          "; check that its folder exists and is writable, or pass another --db PATH"};
    sqlite3_busy_timeout(s->db_, 5000);
    // WAL: readers never block the writer and a crash mid-write leaves the last committed state;
    // synchronous=FULL: a granted lease is on disk before the client hears about it.
    for (const char* pragma :
         {"PRAGMA journal_mode=WAL;", "PRAGMA synchronous=FULL;", "PRAGMA foreign_keys=ON;"})
        if (auto r = s->exec(pragma); !r) return unexpected{r.error()};
    {
        stmt v(s->db_, "PRAGMA user_version;");
        if (!v.ok() || v.step() != SQLITE_ROW)
            return unexpected{s->error_text("cannot read the schema version")};
        int64_t have = v.integer(0);
        if (have > schema_version)
            return unexpected{"database " + path + " was written by a newer vcuda-mgmt (schema " +
                              std::to_string(have) + "); run that version, or start with another --db"};
    }
    if (auto r = s->exec(schema_sql); !r) return unexpected{r.error()};
    {
        // Schema 1 -> 2: leases gain their tenant (old leases have none: only operators may renew or release
        // them, so their clients, which have no credential either, let them expire).
        stmt cols(s->db_, "SELECT 1 FROM pragma_table_info('leases') WHERE name = 'tenant';");
        if (!cols.ok()) return unexpected{s->error_text("cannot read the schema")};
        if (cols.step() != SQLITE_ROW)
            if (auto r = s->exec("ALTER TABLE leases ADD COLUMN tenant TEXT NOT NULL DEFAULT '';"); !r)
                return unexpected{r.error()};
    }
    {
        // Schema 2 -> 3: servers gain their address window (old records have none until they register again).
        stmt cols(s->db_, "SELECT 1 FROM pragma_table_info('servers') WHERE name = 'address_window';");
        if (!cols.ok()) return unexpected{s->error_text("cannot read the schema")};
        if (cols.step() != SQLITE_ROW)
            if (auto r =
                    s->exec("ALTER TABLE servers ADD COLUMN address_window INTEGER NOT NULL DEFAULT -1;");
                !r)
                return unexpected{r.error()};
    }
    if (auto r = s->exec(("PRAGMA user_version=" + std::to_string(schema_version) + ";").c_str()); !r)
        return unexpected{r.error()};
    return s;
}

result<state_snapshot, std::string> sqlite_store::load() {
    state_snapshot snap;
    {
        stmt q(db_,
               "SELECT id, host, endpoints, cordoned, draining, down, registered_at, address_window FROM "
               "servers "
               "ORDER BY id;");
        if (!q.ok()) return unexpected{error_text("cannot read servers")};
        while (q.step() == SQLITE_ROW) {
            server_record s;
            s.id = q.text(0);
            s.host = q.text(1);
            auto eps = nlohmann::json::parse(q.text(2), nullptr, false);
            if (eps.is_array())
                for (auto& e : eps)
                    if (e.is_string()) s.endpoints.push_back(e.get<std::string>());
            s.cordoned = q.integer(3) != 0;
            s.draining = q.integer(4) != 0;
            s.down = q.integer(5) != 0;
            s.registered_at = from_unix_ms(q.integer(6));
            s.address_window = static_cast<int32_t>(q.integer(7));
            snap.servers.push_back(std::move(s));
        }
    }
    {
        stmt q(db_,
               "SELECT uuid, server_id, idx, name, memory, sms, driver_version, cordoned FROM gpus ORDER BY "
               "uuid;");
        if (!q.ok()) return unexpected{error_text("cannot read GPUs")};
        while (q.step() == SQLITE_ROW) {
            gpu_record g;
            g.info.uuid = q.text(0);
            g.server_id = q.text(1);
            g.info.index = static_cast<uint32_t>(q.integer(2));
            g.info.name = q.text(3);
            g.info.memory = static_cast<uint64_t>(q.integer(4));
            g.info.sms = static_cast<uint32_t>(q.integer(5));
            g.info.driver_version = q.text(6);
            g.cordoned = q.integer(7) != 0;
            snap.gpus.push_back(std::move(g));
        }
    }
    {
        stmt q(db_,
               "SELECT id, client_host, pid, exclusive, created_at, expires_at, tenant FROM leases ORDER BY "
               "id;");
        stmt d(db_, "SELECT uuid, memory_quota FROM lease_devices WHERE lease_id = ?1 ORDER BY position;");
        if (!q.ok() || !d.ok()) return unexpected{error_text("cannot read leases")};
        while (q.step() == SQLITE_ROW) {
            lease_record l;
            l.id = q.text(0);
            l.client_host = q.text(1);
            l.pid = q.integer(2);
            l.exclusive = q.integer(3) != 0;
            l.created_at = from_unix_ms(q.integer(4));
            l.expires_at = from_unix_ms(q.integer(5));
            l.tenant = q.text(6);
            d.bind(1, l.id);
            while (d.step() == SQLITE_ROW)
                l.devices.push_back({d.text(0), static_cast<uint64_t>(d.integer(1))});
            d.reset();
            snap.leases.push_back(std::move(l));
        }
    }
    return snap;
}

result<void, std::string> sqlite_store::apply(const manager_state& state, const state_changes& changes) {
    if (changes.empty()) return {};
    if (auto r = exec("BEGIN IMMEDIATE;"); !r) return r;
    auto fail = [&](const char* what) -> result<void, std::string> {
        std::string e = error_text(what);
        (void)exec("ROLLBACK;");
        return unexpected{e};
    };
    stmt put_server(
        db_,
        "INSERT OR REPLACE INTO servers (id, host, endpoints, cordoned, draining, down, registered_at, "
        "address_window) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8);");
    stmt del_server(db_, "DELETE FROM servers WHERE id = ?1;");
    stmt del_server_gpus(db_, "DELETE FROM gpus WHERE server_id = ?1;");
    stmt put_gpu(
        db_,
        "INSERT OR REPLACE INTO gpus (uuid, server_id, idx, name, memory, sms, driver_version, cordoned) "
        "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8);");
    stmt put_lease(db_,
                   "INSERT OR REPLACE INTO leases (id, client_host, pid, exclusive, created_at, expires_at, "
                   "tenant) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7);");
    stmt del_lease(db_, "DELETE FROM leases WHERE id = ?1;");
    stmt del_lease_devices(db_, "DELETE FROM lease_devices WHERE lease_id = ?1;");
    stmt put_device(
        db_, "INSERT INTO lease_devices (lease_id, position, uuid, memory_quota) VALUES (?1, ?2, ?3, ?4);");
    for (auto* s : {&put_server, &del_server, &del_server_gpus, &put_gpu, &put_lease, &del_lease,
                    &del_lease_devices, &put_device})
        if (!s->ok()) return fail("cannot prepare a statement");

    auto write_gpu = [&](const gpu_record& g) {
        return put_gpu.bind(1, g.info.uuid)
            .bind(2, g.server_id)
            .bind(3, int64_t(g.info.index))
            .bind(4, g.info.name)
            .bind(5, int64_t(g.info.memory))
            .bind(6, int64_t(g.info.sms))
            .bind(7, g.info.driver_version)
            .bind(8, int64_t(g.cordoned))
            .run();
    };

    for (auto& id : changes.servers_deleted) {
        if (!del_server_gpus.bind(1, id).run() || !del_server.bind(1, id).run())
            return fail("cannot delete a server");
    }
    for (auto& id : changes.servers_put) {
        auto it = state.servers().find(id);
        if (it == state.servers().end()) continue;
        auto& s = it->second;
        if (!put_server.bind(1, s.id)
                 .bind(2, s.host)
                 .bind(3, nlohmann::json(s.endpoints).dump())
                 .bind(4, int64_t(s.cordoned))
                 .bind(5, int64_t(s.draining))
                 .bind(6, int64_t(s.down))
                 .bind(7, to_unix_ms(s.registered_at))
                 .bind(8, int64_t(s.address_window))
                 .run())
            return fail("cannot write a server");
        // The server's GPU rows are rewritten as a whole: GPUs it no longer has disappear.
        if (!del_server_gpus.bind(1, id).run()) return fail("cannot write a server's GPUs");
        for (auto& [uuid, g] : state.gpus())
            if (g.server_id == id && !write_gpu(g)) return fail("cannot write a GPU");
    }
    for (auto& uuid : changes.gpus_put) {
        auto it = state.gpus().find(uuid);
        if (it != state.gpus().end() && !write_gpu(it->second)) return fail("cannot write a GPU");
    }
    for (auto& id : changes.leases_deleted) {
        if (!del_lease_devices.bind(1, id).run() || !del_lease.bind(1, id).run())
            return fail("cannot delete a lease");
    }
    for (auto& id : changes.leases_put) {
        auto it = state.leases().find(id);
        if (it == state.leases().end()) continue;
        auto& l = it->second;
        if (!put_lease.bind(1, l.id)
                 .bind(2, l.client_host)
                 .bind(3, l.pid)
                 .bind(4, int64_t(l.exclusive))
                 .bind(5, to_unix_ms(l.created_at))
                 .bind(6, to_unix_ms(l.expires_at))
                 .bind(7, l.tenant)
                 .run())
            return fail("cannot write a lease");
        if (!del_lease_devices.bind(1, id).run()) return fail("cannot write a lease's devices");
        for (size_t i = 0; i < l.devices.size(); ++i)
            if (!put_device.bind(1, l.id)
                     .bind(2, int64_t(i))
                     .bind(3, l.devices[i].uuid)
                     .bind(4, int64_t(l.devices[i].memory_quota))
                     .run())
                return fail("cannot write a lease's devices");
    }
    if (auto r = exec("COMMIT;"); !r) {
        (void)exec("ROLLBACK;");
        return r;
    }
    return {};
}

result<std::vector<credential_record>, std::string> sqlite_store::load_credentials() {
    std::vector<credential_record> out;
    stmt q(
        db_,
        "SELECT id, tenant, operator, hash, created_at, expires_at, revoked_at, created_by FROM credentials "
        "ORDER BY created_at, id;");
    if (!q.ok()) return unexpected{error_text("cannot read credentials")};
    while (q.step() == SQLITE_ROW) {
        credential_record c;
        c.id = q.text(0);
        c.tenant = q.text(1);
        c.is_operator = q.integer(2) != 0;
        c.hash = q.text(3);
        c.created_at = from_unix_ms(q.integer(4));
        c.expires_at = from_unix_ms(q.integer(5));
        c.revoked = q.integer(6) != 0;
        c.revoked_at = from_unix_ms(q.integer(6));
        c.created_by = q.text(7);
        out.push_back(std::move(c));
    }
    return out;
}

result<void, std::string> sqlite_store::put_credential(const credential_record& c) {
    stmt put(
        db_,
        "INSERT OR REPLACE INTO credentials (id, tenant, operator, hash, created_at, expires_at, revoked_at, "
        "created_by) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8);");
    if (!put.ok()) return unexpected{error_text("cannot prepare a statement")};
    if (!put.bind(1, c.id)
             .bind(2, c.tenant)
             .bind(3, int64_t(c.is_operator))
             .bind(4, c.hash)
             .bind(5, to_unix_ms(c.created_at))
             .bind(6, to_unix_ms(c.expires_at))
             .bind(7, c.revoked ? std::max<int64_t>(to_unix_ms(c.revoked_at), 1) : int64_t(0))
             .bind(8, c.created_by)
             .run())
        return unexpected{error_text("cannot write a credential")};
    return {};
}

}  // namespace vcuda::mgmt
