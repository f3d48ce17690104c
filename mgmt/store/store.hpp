// The manager's durable state in SQLite (WAL journal, synchronous=FULL): servers, GPUs, leases and cordons.
// Every change the core reports (state_changes) is written in one transaction before the caller is answered,
// so a manager killed at any moment (even SIGKILL) restarts with every lease it granted.
// Heartbeat load and session lists are not stored: they are refreshed by the next heartbeats.
// runs on: one thread at a time (the daemon calls it under its state lock).
#pragma once

#include <memory>
#include <string>

#include "common/result.hpp"
#include "mgmt/core/state.hpp"

struct sqlite3;

namespace vcuda::mgmt {

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
    const std::string& path() const { return path_; }

  private:
    sqlite_store() = default;
    result<void, std::string> exec(const char* sql);
    std::string error_text(const char* what) const;

    sqlite3* db_ = nullptr;
    std::string path_;
};

}  // namespace vcuda::mgmt
