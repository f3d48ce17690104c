// The manager over TCP with TLS (vcuda-mgmt --tls-cert/--tls-key/--tls-client-ca): a server registers and
// heartbeats and an operator calls, both through VCUDA_TLS_CA (and VCUDA_TLS_CERT/KEY for mutual TLS); a
// plain caller and one without a client certificate are refused with the reason; the Unix socket stays plain.
#include <catch2/catch.hpp>

#include "common/tls.hpp"
#include "mgmt/daemon/server.hpp"
#include "mgmt/tests/helpers.hpp"
#include "mgmt/token.hpp"
#include "mgmt/wire/rpc.hpp"
#include "mgmt/wire/server_agent.hpp"
#include "tests/tls/test_certs.hpp"

using namespace vcuda;
using namespace vcuda::mgmt;
using namespace vcuda::mgmt::test;
using namespace std::chrono_literals;

namespace {

const std::string secret = "tls-test-secret-0123456789";

result<std::string, rpc_error> signed_call(const endpoint& m, const std::string& method) {
    return mgmt_call(m, method, "{}", 5s, sign_request(secret, method, "{}"));
}

// VCUDA_TLS_* set for the scope (this process's connections), unset after.
struct tls_env {
    tls_env(const std::string& ca, const std::string& cert = "", const std::string& key = "") {
        set("VCUDA_TLS_CA", ca);
        set("VCUDA_TLS_CERT", cert);
        set("VCUDA_TLS_KEY", key);
    }
    ~tls_env() {
        ::unsetenv("VCUDA_TLS_CA");
        ::unsetenv("VCUDA_TLS_CERT");
        ::unsetenv("VCUDA_TLS_KEY");
    }
    static void set(const char* name, const std::string& v) {
        if (v.empty())
            ::unsetenv(name);
        else
            ::setenv(name, v.c_str(), 1);
    }
};

bool contains(const std::string& hay, const std::string& needle) {
    return hay.find(needle) != std::string::npos;
}

}  // namespace

TEST_CASE("the manager over mutual TLS: servers and operators with certificates, nobody without",
          "[integration][mgmt][tls]") {
    temp_dir dir;
    vcuda::test::test_cert_files certs;
    REQUIRE(vcuda::test::write_test_certs(dir.path.string(), certs).empty());
    auto tls = tls_context::server({certs.server_cert, certs.server_key, certs.ca});
    REQUIRE(tls);
    service svc(service_config{{2s, 2s}, secret}, nullptr);
    REQUIRE(svc.start());
    mgmt_server server(svc, 50ms);
    REQUIRE(server.listen({*endpoint::parse("127.0.0.1:0"), *endpoint::parse("unix:" + dir / "mgmt.sock")},
                          *tls));
    server.start();
    endpoint manager = server.local_endpoints().at(0);
    endpoint manager_unix = server.local_endpoints().at(1);

    {
        tls_env env(certs.ca, certs.client_cert, certs.client_key);
        server_agent_config cfg;
        cfg.manager = manager;
        cfg.sign = [](std::string_view method, std::string_view body) {
            return sign_request(secret, method, body);
        };
        cfg.registration = mgmt::test::server("gpu-tls", {gpu(0, "GPU-t0", 16 * GiB)}, "127.0.0.1:7301");
        cfg.load = [] {
            heartbeat hb;
            hb.gpus.push_back({"GPU-t0", 5, 0, 0});
            return hb;
        };
        server_agent agent(std::move(cfg));
        REQUIRE(agent.wait_registered(5s));
        auto gpus = signed_call(manager, "gpus.list");
        REQUIRE(gpus);
        CHECK(contains(*gpus, "GPU-t0"));
    }
    // Plain: the manager says it wants TLS.
    auto plain = signed_call(manager, "gpus.list");
    REQUIRE_FALSE(plain);
    INFO(describe(plain.error(), manager));
    CHECK(contains(plain.error().message, "accepts TLS only"));
    // TLS without a client certificate: refused, and told why.
    {
        tls_env env(certs.ca);
        auto anonymous = signed_call(manager, "gpus.list");
        REQUIRE_FALSE(anonymous);
        INFO(describe(anonymous.error(), manager));
        CHECK(contains(anonymous.error().message, "requires a client certificate"));
    }
    // A CA that did not sign the manager's certificate.
    {
        tls_env env(certs.other_ca, certs.client_cert, certs.client_key);
        auto untrusted = signed_call(manager, "gpus.list");
        REQUIRE_FALSE(untrusted);
        CHECK(contains(describe(untrusted.error(), manager), "certificate is not trusted"));
    }
    // The Unix socket never leaves the host: plain, as before.
    auto local = signed_call(manager_unix, "gpus.list");
    REQUIRE(local);
    server.stop();
}
