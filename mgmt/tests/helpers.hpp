// Test helpers for vcuda_mgmt_tests: a fake clock, GPU and server builders, temporary folders.
#pragma once

#include <unistd.h>

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

inline gpu_description gpu(uint32_t index, std::string uuid, uint64_t memory, std::string name = "NVIDIA H100 80GB HBM3") {
    gpu_description g;
    g.index = index;
    g.uuid = std::move(uuid);
    g.name = std::move(name);
    g.memory = memory;
    g.sms = 132;
    g.driver_version = "580.65";
    return g;
}

inline server_registration server(std::string host, std::vector<gpu_description> gpus, std::string endpoint = "") {
    server_registration r;
    r.endpoints = {endpoint.empty() ? host + ":7300" : endpoint};
    r.host = std::move(host);
    r.gpus = std::move(gpus);
    return r;
}

inline lease_request request(std::string client_host, uint64_t memory, uint32_t gpus = 1, bool exclusive = false) {
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

}  // namespace vcuda::mgmt::test
