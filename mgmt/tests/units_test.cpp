// Sizes and durations as operators write them; `vcuda run`'s environment plan; tables.
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <map>

#include "mgmt/cli/run_command.hpp"
#include "mgmt/cli/table.hpp"
#include "mgmt/wire/units.hpp"

using namespace vcuda::mgmt;
using namespace vcuda::cli;
using namespace std::chrono_literals;

TEST_CASE("sizes", "[unit][mgmt]") {
    CHECK(parse_size("1073741824") == 1073741824ull);
    CHECK(parse_size("8G") == 8ull << 30);
    CHECK(parse_size("8GiB") == 8ull << 30);
    CHECK(parse_size("8 gb") == 8ull << 30);
    CHECK(parse_size("1.5G") == 3ull << 29);
    CHECK(parse_size("512M") == 512ull << 20);
    CHECK(parse_size("64k") == 64ull << 10);
    CHECK_FALSE(parse_size(""));
    CHECK_FALSE(parse_size("G"));
    CHECK_FALSE(parse_size("8X"));
    CHECK_FALSE(parse_size("-1"));
    CHECK_FALSE(parse_size("99999999999T"));
    CHECK(format_size(80ull << 30) == "80.0 GiB");
    CHECK(format_size(512ull << 20) == "512 MiB");
    CHECK(format_size(12) == "12 B");
}

TEST_CASE("durations", "[unit][mgmt]") {
    CHECK(parse_duration("30s") == 30000ms);
    CHECK(parse_duration("10") == 10000ms);
    CHECK(parse_duration("500ms") == 500ms);
    CHECK(parse_duration("2m") == 120000ms);
    CHECK(parse_duration("1h") == 3600000ms);
    CHECK_FALSE(parse_duration("soon"));
    CHECK_FALSE(parse_duration("5d"));
}

namespace {
struct fake_env {
    std::map<std::string, std::string> vars;
    std::function<const char*(const char*)> fn() {
        return [this](const char* k) -> const char* {
            auto it = vars.find(k);
            return it == vars.end() ? nullptr : it->second.c_str();
        };
    }
};
std::map<std::string, std::string> as_map(const run_plan& p) { return {p.set_env.begin(), p.set_env.end()}; }
}  // namespace

TEST_CASE("vcuda run: the program gets vcuda's library and its target", "[unit][mgmt][cli]") {
    fake_env env;
    run_options o;
    o.command = {"--", "./app", "-x", "--flag"};
    o.server = "gpu1:7300";
    env.vars["LD_LIBRARY_PATH"] = "/opt/lib";
    env.vars["VCUDA_MANAGER"] = "m:1";
    auto p = plan_run(o, env.fn(), "/opt/vcuda/lib/vcuda", true);
    REQUIRE(p);
    CHECK(p->argv == std::vector<std::string>{"./app", "-x", "--flag"});
    auto m = as_map(*p);
    CHECK(m["LD_LIBRARY_PATH"] == "/opt/vcuda/lib/vcuda:/opt/lib");
    CHECK(m["VCUDA_SERVER"] == "gpu1:7300");
    CHECK(m["VCUDA_MANAGER"] == "");  // removed: the flag decides

    run_options mo;
    mo.command = {"./app"};
    mo.manager = "unix:/run/vcuda-mgmt.sock";
    mo.gpus = 2;
    mo.memory = "8G";
    mo.exclusive = true;
    auto q = plan_run(mo, fake_env{}.fn(), "/L", true);
    REQUIRE(q);
    auto n = as_map(*q);
    CHECK(n["LD_LIBRARY_PATH"] == "/L");
    CHECK(n["VCUDA_MANAGER"] == "unix:/run/vcuda-mgmt.sock");
    CHECK(n["VCUDA_GPUS"] == "2");
    CHECK(n["VCUDA_MEMORY"] == std::to_string(8ull << 30));
    CHECK(n["VCUDA_EXCLUSIVE"] == "1");
}

TEST_CASE("vcuda run: the environment names the target when no flag does", "[unit][mgmt][cli]") {
    fake_env env;
    env.vars["VCUDA_SERVER"] = "10.0.0.5:7300";
    run_options o;
    o.command = {"./app"};
    auto p = plan_run(o, env.fn(), "/L", true);
    REQUIRE(p);
    CHECK(as_map(*p).count("VCUDA_SERVER") == 0);  // inherited as it is
}

TEST_CASE("vcuda run: mistakes are explained, exit code 2", "[unit][mgmt][cli]") {
    fake_env env;
    run_options o;
    o.command = {"./app"};
    auto none = plan_run(o, env.fn(), "/L", true);
    REQUIRE_FALSE(none);
    CHECK(none.error().exit_code == 2);
    CHECK(none.error().message.find("vcuda-server --listen HOST:PORT") != std::string::npos);
    CHECK(none.error().message.find("--manager") != std::string::npos);

    o.server = "nonsense";
    auto bad = plan_run(o, env.fn(), "/L", true);
    REQUIRE_FALSE(bad);
    CHECK(bad.error().message.find("HOST:PORT") != std::string::npos);

    o.server = "h:1";
    o.manager = "m:2";
    CHECK_FALSE(plan_run(o, env.fn(), "/L", true));
    o.manager.clear();
    auto nolib = plan_run(o, env.fn(), "/L", false);
    REQUIRE_FALSE(nolib);
    CHECK(nolib.error().message.find("libcuda.so.1") != std::string::npos);
    o.command.clear();
    CHECK_FALSE(plan_run(o, env.fn(), "/L", true));
    o.command = {"./app"};
    o.memory = "lots";
    CHECK_FALSE(plan_run(o, env.fn(), "/L", true));
}

TEST_CASE("vcuda run --credential: the program reads the file, only with a manager, only a private file",
          "[unit][mgmt][cli]") {
    char tmpl[] = "/tmp/vcuda-cred-XXXXXX";
    std::string dir = ::mkdtemp(tmpl);
    std::string file = dir + "/alice.cred";
    { std::ofstream(file) << "vcc1.cred-0123456789abcdef.secret\n"; }
    ::chmod(file.c_str(), 0600);
    fake_env env;
    env.vars["VCUDA_CREDENTIAL"] = "vcc1.someone-else";
    run_options o;
    o.command = {"./app"};
    o.manager = "m:1";
    o.credential_file = file;
    auto p = plan_run(o, env.fn(), "/L", true);
    REQUIRE(p);
    auto m = as_map(*p);
    CHECK(m["VCUDA_CREDENTIAL_FILE"] == file);
    CHECK(m["VCUDA_CREDENTIAL"] == "");  // removed: the flag decides, and the secret stays out of the env
    o.manager.clear();
    o.server = "gpu1:7300";
    auto standalone = plan_run(o, env.fn(), "/L", true);
    REQUIRE_FALSE(standalone);
    CHECK(standalone.error().message.find("--token") != std::string::npos);
    o.server.clear();
    o.manager = "m:1";
    ::chmod(file.c_str(), 0644);
    auto readable = plan_run(o, env.fn(), "/L", true);
    REQUIRE_FALSE(readable);
    CHECK(readable.error().message.find("chmod 600") != std::string::npos);
    ::unlink(file.c_str());
    ::rmdir(dir.c_str());
}

TEST_CASE("tables pad columns and right-align numbers", "[unit][mgmt][cli]") {
    table t({"HOST", "GPU>", "MODEL"});
    t.add({"alpha", "0", "H100"});
    t.add({"b", "12", "T4"});
    CHECK(t.render() == "HOST   GPU  MODEL\nalpha    0  H100\nb       12  T4\n");
}
