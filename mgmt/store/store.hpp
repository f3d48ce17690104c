// The manager's durable state in SQLite (WAL journal, synchronous=FULL): servers, GPUs, leases and cordons,
// and the tenant credentials it issued (their SHA-256 only, never the credentials themselves).
// Every change the core reports (state_changes) is written in one transaction before the caller is answered,
// so a manager killed at any moment (even SIGKILL) restarts with every lease it granted.
// Heartbeat load and session lists are not stored: they are refreshed by the next heartbeats.
// runs on: one thread at a time (the daemon calls it under its state lock).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/result.hpp"
#include "mgmt/core/state.hpp"

struct sqlite3;

namespace vcuda::mgmt {

// A credential the manager issued (`vcuda tokens create`). The credential text is shown once, when made.
struct credential_record {
    std::string id;            // public, e.g. cred-1f2e3d4c5b6a7980
    std::string tenant;        // who presents it: owns the leases acquired with it
    bool is_operator = false;  // may cordon, drain, release others' leases, manage credentials
    std::string hash;          // hex SHA-256 of the credential's secret part
    time_ms created_at{};
    time_ms expires_at{};  // 0: never
    bool revoked = false;
    time_ms revoked_at{};
    std::string created_by;  // the credential id (or "secret-file") that made it
};

class sqlite_store {
  public:
    // Opens (creating if needed) the database at `path` and its schema. ":memory:" works for tests.
    static result<std::unique_ptr<sqlite_store>, std::string> open(const std::string& path);
    ~sqlite_store();
    sqlite_store(const sqlite_store&) = delete;
    sqlite_store& operator=(const sqlite_store&) = delete;

    result<state_snapshot, std::string> load();
    // Writes what `changes` names, reading the current values from `state`, in one transaction.
    result<void, std::string> apply(const manager_state& state, const state_changes& changes);
    result<std::vector<credential_record>, std::string> load_credentials();
    // Inserts or replaces one credential, committed before it returns.
    result<void, std::string> put_credential(const credential_record& c);
    const std::string& path() const { return path_; }

  private:
    sqlite_store() = default;
    result<void, std::string> exec(const char* sql);
    std::string error_text(const char* what) const;

    sqlite3* db_ = nullptr;
    std::string path_;
};

}  // namespace vcuda::mgmt
