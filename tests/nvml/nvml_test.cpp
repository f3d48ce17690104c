// vcuda's libnvidia-ml.so.1 as NVML users see it: its exported surface, its answers without a server, and
// its answers next to the CUDA side's, through a real vcuda-server on the software test driver.
// The queries run in vcuda_nvml_probe (a child process), so every run starts with a fresh client.
#include <dlfcn.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/nvml_api.hpp"

namespace {

const std::string nvml_library = std::string(VCUDA_CLIENT_LIB_DIR) + "/libnvidia-ml.so.1";

std::vector<std::string> run_lines(const std::string& cmd) {
    std::vector<std::string> out;
    FILE* p = popen(cmd.c_str(), "r");
    REQUIRE(p);
    char buf[4096];
    while (fgets(buf, sizeof buf, p)) {
        std::string s(buf);
        while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
        out.push_back(s);
    }
    pclose(p);
    return out;
}

// key=value lines of the probe.
std::map<std::string, std::string> run_probe(const std::string& env, const std::string& args,
                                             const std::string& log) {
    std::map<std::string, std::string> kv;
    for (auto& line : run_lines("env " + env + " " VCUDA_NVML_PROBE " " + args + " 2>" + log)) {
        auto eq = line.find('=');
        if (eq != std::string::npos) kv[line.substr(0, eq)] = line.substr(eq + 1);
    }
    return kv;
}

long long num(std::map<std::string, std::string>& kv, const std::string& key) {
    INFO("key " << key);
    REQUIRE(kv.count(key));
    return std::stoll(kv[key]);
}

std::string lower(std::string s) {
    for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
}

// A fresh folder under /tmp (short: it holds a Unix socket), removed at the end.
struct temp_dir {
    std::filesystem::path path;
    temp_dir() {
        std::string tmpl = "/tmp/vcuda-nvml-XXXXXX";
        path = ::mkdtemp(tmpl.data());
    }
    ~temp_dir() {
        std::error_code ec;
        std::filesystem::remove_all(path, ec);
    }
    std::string operator/(const std::string& name) const { return (path / name).string(); }
};

// vcuda-server on the software test driver (`devices` GPUs), serving a Unix socket with a 1 GiB quota.
struct soft_server {
    temp_dir dir;
    std::string socket = dir / "s.sock";
    std::string address = "unix:" + socket;
    pid_t pid = -1;

    // `host_nvml`: the server finds tests/nvml/fake_host_nvml.cpp as the host's NVML (GPUs with NVLinks).
    explicit soft_server(int devices = 1, bool host_nvml = false) {
        std::string log = dir / "server.log";
        pid = fork();
        REQUIRE(pid >= 0);
        if (pid == 0) {
            FILE* f = std::freopen(log.c_str(), "w", stdout);
            (void)f;
            dup2(fileno(stdout), 2);
            setenv("VCUDA_SOFT_DEVICES", std::to_string(devices).c_str(), 1);
            if (host_nvml) setenv("LD_LIBRARY_PATH", VCUDA_FAKE_HOST_NVML_DIR, 1);
            execl(VCUDA_SERVER_BIN, VCUDA_SERVER_BIN, "--listen", address.c_str(), "--driver",
                  VCUDA_SOFTDRIVER, "--memory-quota", "1GiB", "--log-level", "debug",
                  static_cast<char*>(nullptr));
            _exit(127);
        }
        for (int i = 0; i < 200 && !std::filesystem::exists(socket); ++i)
            std::this_thread::sleep_for(std::chrono::milliseconds(25));
        REQUIRE(std::filesystem::exists(socket));
    }
    ~soft_server() {
        kill(pid, SIGTERM);
        int status = 0;
        waitpid(pid, &status, 0);
    }
    std::string env() const { return "VCUDA_SERVER=" + address; }
};

}  // namespace

TEST_CASE("libnvidia-ml.so.1 exports exactly the real NVML's symbols", "[unit]") {
    std::set<std::string> want, ours;
    std::ifstream in(VCUDA_NVML_SYMBOLS);
    for (std::string line; std::getline(in, line);)
        if (!line.empty() && line[0] != '#') want.insert(line);
    for (auto& line : run_lines("nm -D --defined-only " + nvml_library)) {
        std::string name = line.substr(line.rfind(' ') + 1);
        ours.insert(name.substr(0, name.find('@')));
    }
    REQUIRE(want.size() > 50);
    std::vector<std::string> missing, extra;
    for (auto& s : want)
        if (!ours.count(s)) missing.push_back(s);
    for (auto& s : ours)
        if (!want.count(s)) extra.push_back(s);
    INFO("missing: " << (missing.empty() ? "" : missing.front())
                     << " extra: " << (extra.empty() ? "" : extra.front()));
    CHECK(missing.empty());
    CHECK(extra.empty());
}

TEST_CASE("libnvidia-ml.so.1 needs nothing but the C library", "[unit]") {
    auto lines = run_lines("ldd " + nvml_library);
    REQUIRE(!lines.empty());
    for (auto& l : lines) {
        bool allowed = l.find("linux-vdso") != std::string::npos || l.find("libc.so") != std::string::npos ||
                       l.find("libm.so") != std::string::npos || l.find("ld-linux") != std::string::npos;
        bool sanitizer = l.find("libasan") != std::string::npos || l.find("libubsan") != std::string::npos ||
                         l.find("libtsan") != std::string::npos || l.find("libstdc++") != std::string::npos ||
                         l.find("libgcc_s") != std::string::npos;
#ifndef VCUDA_SANITIZED
        sanitizer = false;
#endif
        INFO(l);
        CHECK((allowed || sanitizer));
    }
}

TEST_CASE("before nvmlInit: errors, error strings and stubs answer locally", "[unit]") {
    void* lib = dlopen(nvml_library.c_str(), RTLD_NOW | RTLD_LOCAL);
    REQUIRE(lib);
    auto error_string = reinterpret_cast<decltype(&nvmlErrorString)>(dlsym(lib, "nvmlErrorString"));
    auto count = reinterpret_cast<decltype(&nvmlDeviceGetCount_v2)>(dlsym(lib, "nvmlDeviceGetCount_v2"));
    auto shutdown = reinterpret_cast<decltype(&nvmlShutdown)>(dlsym(lib, "nvmlShutdown"));
    auto vbios = reinterpret_cast<nvmlReturn_t (*)(nvmlDevice_t, char*, unsigned)>(
        dlsym(lib, "nvmlDeviceGetVbiosVersion"));
    REQUIRE((error_string && count && shutdown && vbios));
    CHECK(std::string(error_string(NVML_SUCCESS)) == "Success");
    CHECK(std::string(error_string(NVML_ERROR_NOT_SUPPORTED)) == "Not Supported");
    CHECK(std::string(error_string(NVML_ERROR_GPU_IS_LOST)) == "GPU is lost");
    CHECK(std::string(error_string(static_cast<nvmlReturn_t>(12345))) == "Unknown Error");
    unsigned n = 7;
    CHECK(count(&n) == NVML_ERROR_UNINITIALIZED);
    CHECK(shutdown() == NVML_ERROR_UNINITIALIZED);
    char text[32];
    CHECK(vbios(nullptr, text, sizeof text) == NVML_ERROR_NOT_SUPPORTED);  // a generated stub
}

TEST_CASE("nvmlInit without a reachable server fails fast with an NVML error", "[unit]") {
    temp_dir dir;
    for (std::string env : {"VCUDA_SERVER=127.0.0.1:1 VCUDA_CONNECT_TIMEOUT_MS=2000", "-u VCUDA_SERVER",
                            "VCUDA_SERVER=unix:/nonexistent/vcuda.sock"}) {
        INFO(env);
        auto kv = run_probe(env, "init", dir / "probe.log");
        CHECK(num(kv, "init.rc") == NVML_ERROR_DRIVER_NOT_LOADED);
        CHECK(num(kv, "init.ms") < 2500);
        CHECK(num(kv, "count.rc") == NVML_ERROR_UNINITIALIZED);
    }
}

TEST_CASE("NVML reports the vGPU as CUDA does, through vcuda-server on the software driver",
          "[integration]") {
    soft_server server;
    auto kv = run_probe(server.env(), "query", server.dir / "probe.log");
    INFO("probe log: " << server.dir / "probe.log");
    REQUIRE(num(kv, "init.rc") == NVML_SUCCESS);
    REQUIRE(num(kv, "count.rc") == NVML_SUCCESS);
    long long count = num(kv, "count");
    CHECK(count >= 1);
    CHECK(count == num(kv, "cuda.count"));
    CHECK(num(kv, "cuda_version") == num(kv, "cuda.cuda_version"));
    // The software driver has no NVML: what only the server's NVML knows is "not supported".
    CHECK(num(kv, "driver_version.rc") == NVML_ERROR_NOT_SUPPORTED);

    for (long long i = 0; i < count; ++i) {
        std::string p = "dev" + std::to_string(i) + ".";
        INFO("device " << i);
        CHECK(num(kv, p + "handle.rc") == NVML_SUCCESS);
        CHECK(num(kv, p + "name.rc") == NVML_SUCCESS);
        CHECK(kv[p + "name"] == kv[p + "cuda.name"]);
        CHECK(kv[p + "uuid"] == kv[p + "cuda.uuid"]);
        CHECK(kv[p + "uuid"].rfind("GPU-", 0) == 0);
        CHECK(num(kv, p + "by_uuid.rc") == NVML_SUCCESS);
        CHECK(num(kv, p + "by_uuid.same") == 1);
        CHECK(num(kv, p + "pci.rc") == NVML_SUCCESS);
        CHECK(lower(kv[p + "pci.bus_id_legacy"]) == lower(kv[p + "cuda.bus_id"]));
        CHECK(lower(kv[p + "pci.bus_id"]).substr(4) == lower(kv[p + "cuda.bus_id"]));
        CHECK(num(kv, p + "by_pci.rc") == NVML_SUCCESS);
        CHECK(num(kv, p + "by_pci.same") == 1);
        CHECK(num(kv, p + "index") == i);
        CHECK(num(kv, p + "cc.rc") == NVML_SUCCESS);
        CHECK(num(kv, p + "cc") > 0);

        // Memory: the vGPU's size, and what this process holds.
        CHECK(num(kv, p + "cuda.total") == (1ll << 30));
        CHECK(num(kv, p + "before.memory.total") == (1ll << 30));
        CHECK(num(kv, p + "before.memory.used") == 0);
        CHECK(num(kv, p + "before.memory.free") == (1ll << 30));
        CHECK(num(kv, p + "before.memory_v2.rc") == NVML_SUCCESS);
        CHECK(num(kv, p + "before.processes.count") == 0);
        CHECK(num(kv, p + "cuda.alloc.rc") == 0);
        CHECK(num(kv, p + "allocated.memory.used") == (64ll << 20));
        CHECK(num(kv, p + "allocated.memory.free") == (1ll << 30) - (64ll << 20));
        CHECK(num(kv, p + "allocated.memory_v2.used") == (64ll << 20));
        CHECK(num(kv, p + "allocated.processes.rc") == NVML_SUCCESS);
        CHECK(num(kv, p + "allocated.processes.count") == 1);
        CHECK(num(kv, p + "allocated.processes.pid") == num(kv, "pid"));
        CHECK(num(kv, p + "allocated.processes.used") == (64ll << 20));
        CHECK(num(kv, p + "freed.memory.used") == 0);
        CHECK(num(kv, p + "freed.processes.count") == 1);  // the context is still there

        // Live state comes from the server's NVML, which the software driver's server lacks.
        CHECK(num(kv, p + "utilization.rc") == NVML_ERROR_NOT_SUPPORTED);
        CHECK(num(kv, p + "temperature.rc") == NVML_ERROR_NOT_SUPPORTED);
        CHECK(num(kv, p + "power.rc") == NVML_ERROR_NOT_SUPPORTED);
        CHECK(num(kv, p + "serial.rc") == NVML_ERROR_NOT_SUPPORTED);
        CHECK(num(kv, p + "vbios.rc") == NVML_ERROR_NOT_SUPPORTED);
        CHECK(num(kv, p + "fields.rc") == NVML_SUCCESS);
        CHECK(num(kv, p + "fields.field_rc") == NVML_ERROR_NOT_SUPPORTED);
        CHECK(num(kv, p + "is_mig.rc") == NVML_SUCCESS);
        CHECK(num(kv, p + "is_mig") == 0);
        CHECK(num(kv, p + "p2p_self.rc") == NVML_SUCCESS);                // NCCL asks this of every GPU
        CHECK(num(kv, p + "p2p_self") == NVML_P2P_STATUS_NOT_SUPPORTED);  // as the real NVML answers
        CHECK(num(kv, p + "p2p_loopback.rc") == NVML_SUCCESS);
        CHECK(num(kv, p + "p2p_loopback") == NVML_P2P_STATUS_OK);
        CHECK(num(kv, p + "p2p_bad_index.rc") == NVML_ERROR_INVALID_ARGUMENT);
    }
    CHECK(num(kv, "shutdown.rc") == NVML_SUCCESS);
    CHECK(num(kv, "after_shutdown.rc") == NVML_ERROR_UNINITIALIZED);
}

TEST_CASE("NVML reports the server's NVLinks only where CUDA can use them", "[integration]") {
    // Two GPUs of one server, peers: the links the host's NVML reports, as NCCL reads them.
    {
        soft_server server(2, /*host_nvml=*/true);
        auto kv = run_probe(server.env(), "nvlinks", server.dir / "probe.log");
        INFO("probe log: " << server.dir / "probe.log");
        REQUIRE(num(kv, "count") == 2);
        for (int d = 0; d < 2; ++d) {
            std::string p = "dev" + std::to_string(d) + ".";
            INFO("device " << d);
            for (int l = 0; l < 2; ++l) {
                std::string k = p + "link" + std::to_string(l) + ".";
                CHECK(num(kv, k + "cap.rc") == NVML_SUCCESS);
                CHECK(num(kv, k + "cap") == 1);
                CHECK(num(kv, k + "state.rc") == NVML_SUCCESS);
                CHECK(num(kv, k + "state") == NVML_FEATURE_ENABLED);
                CHECK(num(kv, k + "far.rc") == NVML_SUCCESS);
                CHECK(kv[k + "far"] == "FFFFFFFF:FF:FF.0");
                CHECK(num(kv, k + "far_legacy.rc") == NVML_SUCCESS);
                CHECK(kv[k + "far_legacy"] == "FFFFFFFF:FF:FF.");  // the old layout's 16 bytes
                CHECK(num(kv, k + "field.rc") == NVML_SUCCESS);
                CHECK(num(kv, k + "field") == NVML_FEATURE_ENABLED);
            }
            CHECK(num(kv, p + "link2.cap.rc") == NVML_ERROR_NOT_SUPPORTED);  // the host has two
            CHECK(num(kv, p + "link2.field.rc") == NVML_ERROR_NOT_SUPPORTED);
        }
    }
    // One vGPU visible to CUDA: its peers may be another server's, so no link is reported.
    {
        soft_server server(2, /*host_nvml=*/true);
        auto kv = run_probe(server.env() + " CUDA_VISIBLE_DEVICES=1", "nvlinks", server.dir / "probe.log");
        INFO("probe log: " << server.dir / "probe.log");
        CHECK(num(kv, "dev0.link0.cap.rc") == NVML_ERROR_NOT_SUPPORTED);
        CHECK(num(kv, "dev1.link0.state.rc") == NVML_ERROR_NOT_SUPPORTED);
        CHECK(num(kv, "dev1.link0.field.rc") == NVML_ERROR_NOT_SUPPORTED);
    }
    // No NVML on the server: nothing to report.
    {
        soft_server server(2);
        auto kv = run_probe(server.env(), "nvlinks", server.dir / "probe.log");
        CHECK(num(kv, "dev0.link0.cap.rc") == NVML_ERROR_NOT_SUPPORTED);
        CHECK(num(kv, "dev0.link0.far.rc") == NVML_ERROR_NOT_SUPPORTED);
    }
}

TEST_CASE("NVML lists every GPU whatever CUDA_VISIBLE_DEVICES says, as the real NVML does", "[integration]") {
    soft_server server(2);
    auto kv = run_probe(server.env() + " CUDA_VISIBLE_DEVICES=1", "listing", server.dir / "probe.log");
    INFO("probe log: " << server.dir / "probe.log");
    REQUIRE(num(kv, "init.rc") == NVML_SUCCESS);
    CHECK(num(kv, "count") == 2);
    CHECK(num(kv, "cuda.count") == 1);
    CHECK(kv["nvml0.uuid"] != kv["nvml1.uuid"]);
    CHECK(kv["cuda0.uuid"] == kv["nvml1.uuid"]);  // CUDA's only device is the server's second
    REQUIRE(num(kv, "cuda.alloc.rc") == 0);
    CHECK(num(kv, "nvml1.memory.used") == (64ll << 20));
    CHECK(num(kv, "nvml1.processes.count") == 1);
    CHECK(num(kv, "nvml0.memory.rc") == NVML_SUCCESS);
    CHECK(num(kv, "nvml0.memory.used") == 0);
    CHECK(num(kv, "nvml0.processes.count") == 0);

    auto all = run_probe(server.env(), "listing", server.dir / "probe2.log");
    CHECK(num(all, "count") == 2);
    CHECK(num(all, "cuda.count") == 2);
    CHECK(all["cuda0.uuid"] == all["nvml0.uuid"]);
    CHECK(all["cuda1.uuid"] == all["nvml1.uuid"]);

    // Every GPU hidden from CUDA: cuInit fails, NVML still lists them (nvidia-smi works as natively).
    auto none = run_probe(server.env() + " CUDA_VISIBLE_DEVICES=7", "listing", server.dir / "probe3.log");
    CHECK(num(none, "init.rc") == NVML_SUCCESS);
    CHECK(num(none, "count") == 2);
    CHECK(num(none, "cuda.count") == 0);
    CHECK(none["nvml0.uuid"] == all["nvml0.uuid"]);
    CHECK(num(none, "nvml0.memory.used") == 0);
}

TEST_CASE("a lost server gives NVML errors, not a hang", "[integration]") {
    soft_server server;
    auto kv = run_probe(server.env(), "lost " + std::to_string(server.pid), server.dir / "probe.log");
    INFO("probe log: " << server.dir / "probe.log");
    REQUIRE(num(kv, "init.rc") == NVML_SUCCESS);
    CHECK(num(kv, "before.utilization.rc") == NVML_ERROR_NOT_SUPPORTED);
    CHECK(num(kv, "after.utilization.rc") == NVML_ERROR_GPU_IS_LOST);
    CHECK(num(kv, "after.memory.rc") == NVML_ERROR_GPU_IS_LOST);
    CHECK(num(kv, "after.name.rc") == NVML_SUCCESS);  // what the device is does not need the server
    CHECK(num(kv, "after.ms") < 3000);
}
