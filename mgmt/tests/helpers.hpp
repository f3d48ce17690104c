// Test helpers for vcuda_mgmt_tests: a fake clock, GPU and server builders, temporary folders, a manager
// state to drive.
#pragma once

#include <unistd.h>

#include <catch2/catch.hpp>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "mgmt/core/state.hpp"

namespace vcuda::mgmt::test {

constexpr uint64_t GiB = 1ull << 30;

// A clock that only moves when told to.
struct fake_clock {
    time_ms t = from_unix_ms(1'700'000'000'000);
    time_ms operator()() const { return t; }
    void advance(std::chrono::milliseconds d) { t += d; }
};

inline gpu_description gpu(uint32_t index, std::string uuid, uint64_t memory,
                           std::string name = "NVIDIA H100 80GB HBM3") {
    gpu_description g;
    g.index = index;
    g.uuid = std::move(uuid);
    g.name = std::move(name);
    g.memory = memory;
    g.sms = 132;
    g.driver_version = "580.65";
    return g;
}

inline server_registration server(std::string host, std::vector<gpu_description> gpus,
                                  std::string endpoint = "") {
    server_registration r;
    r.endpoints = {endpoint.empty() ? host + ":7300" : endpoint};
    r.host = std::move(host);
    r.gpus = std::move(gpus);
    return r;
}

inline lease_request request(std::string client_host, uint64_t memory, uint32_t gpus = 1,
                             bool exclusive = false) {
    lease_request r;
    r.client_host = std::move(client_host);
    r.pid = 4242;
    r.gpus = gpus;
    r.memory_per_gpu = memory;
    r.hints.exclusive = exclusive;
    return r;
}

// A fresh folder under /tmp, removed when the object dies.
struct temp_dir {
    std::filesystem::path path;
    temp_dir() {
        std::string tmpl = (std::filesystem::temp_directory_path() / "vcuda-mgmt-test-XXXXXX").string();
        path = ::mkdtemp(tmpl.data());
    }
    ~temp_dir() {
        std::error_code ec;
        std::filesystem::remove_all(path, ec);
    }
    std::string operator/(const std::string& name) const { return (path / name).string(); }
};

// Counter ids: deterministic lease and server ids in tests.
struct counter_ids {
    int n = 0;
    std::string operator()() { return std::to_string(++n); }
};

// A manager state on the fake clock (ids counted from 1), with the changes its calls record.
struct state_fixture {
    explicit state_fixture(const state_config& config) : st(config, counter_ids{}) {}
    fake_clock clock;
    manager_state st;
    state_changes ch;

    std::string add(const server_registration& r) {
        auto id = st.register_server(r, clock(), ch);
        REQUIRE(id);
        return *id;
    }
    lease_record acquire(const lease_request& r) {
        auto l = st.acquire(r, clock(), ch);
        INFO((l ? std::string() : l.error().message));
        REQUIRE(l);
        return *l;
    }
};

}  // namespace vcuda::mgmt::test

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>

#include <thread>
#include <vector>

namespace vcuda::mgmt::test {

// A child process running one of vcuda's binaries, its output going to a log file.
struct child_process {
    pid_t pid = -1;

    static child_process spawn(const std::vector<std::string>& args, const std::string& log) {
        std::vector<char*> argv;
        for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
        argv.push_back(nullptr);
        int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        child_process c;
        c.pid = ::fork();
        if (c.pid == 0) {
            ::dup2(fd, 1);
            ::dup2(fd, 2);
            ::execv(argv[0], argv.data());
            ::_exit(127);
        }
        ::close(fd);
        return c;
    }
    void signal(int sig) const {
        if (pid > 0) ::kill(pid, sig);
    }
    int wait() {
        int status = 0;
        if (pid > 0) ::waitpid(pid, &status, 0);
        pid = -1;
        return status;
    }
    ~child_process() {
        if (pid > 0) {
            signal(SIGKILL);
            wait();
        }
    }
    child_process() = default;
    child_process(child_process&& o) noexcept : pid(o.pid) { o.pid = -1; }
    child_process& operator=(child_process&& o) noexcept {
        std::swap(pid, o.pid);
        return *this;
    }
};

// Polls `done` every 20 ms until it is true or `timeout` passes.
template <class F>
bool eventually(F done, std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    auto end = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < end) {
        if (done()) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return done();
}

// Runs a shell command and returns its standard output and exit status.
inline std::pair<std::string, int> run_command(const std::string& cmd) {
    std::string out;
    FILE* p = ::popen(cmd.c_str(), "r");
    if (!p) return {"", -1};
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    int status = ::pclose(p);
    return {out, WIFEXITED(status) ? WEXITSTATUS(status) : -1};
}

}  // namespace vcuda::mgmt::test
