// Lease tokens: round trip, forgery, tampering, expiry, secrets.
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <vector>

#include "mgmt/tests/helpers.hpp"
#include "mgmt/token.hpp"

using namespace vcuda::mgmt;
using namespace std::chrono_literals;
using sys_clock = std::chrono::system_clock;

namespace {
const std::string secret = "0123456789abcdef-shared-secret";
token_claims claims(sys_clock::time_point exp) { return {"lease-1", "GPU-1234-abcd", 8ull << 30, exp}; }
}  // namespace

TEST_CASE("a signed token verifies and carries its claims", "[unit][mgmt][token]") {
    auto now = sys_clock::time_point(std::chrono::milliseconds(1'700'000'000'123));
    auto t = sign_token(secret, claims(now + 30s));
    CHECK(t.starts_with("vct1."));
    auto c = verify_token(secret, t, now);
    REQUIRE(c);
    CHECK(c->lease_id == "lease-1");
    CHECK(c->gpu_uuid == "GPU-1234-abcd");
    CHECK(c->memory_quota == 8ull << 30);
    CHECK(c->expires_at == now + 30s);
}

TEST_CASE("a lease token carries its tenant; one without a tenant still verifies", "[unit][mgmt][token]") {
    auto now = sys_clock::now();
    token_claims with = claims(now + 30s);
    with.tenant = "alice";
    auto c = verify_token(secret, sign_token(secret, with), now);
    REQUIRE(c);
    CHECK(c->tenant == "alice");
    CHECK(c->lease_id == "lease-1");
    auto old = verify_token(secret, sign_token(secret, claims(now + 30s)), now);  // the four claims of before
    REQUIRE(old);
    CHECK(old->tenant.empty());
    // The tenant is signed: a token of bob's cannot be made from alice's.
    token_claims bob = with;
    bob.tenant = "bob";
    auto a = sign_token(secret, with), b = sign_token(secret, bob);
    CHECK_FALSE(verify_token(secret, b.substr(0, b.rfind('.')) + a.substr(a.rfind('.')), now));
    CHECK(token_fingerprint(a) != token_fingerprint(b));
    CHECK(token_fingerprint(a).size() == 32);
}

TEST_CASE("forged, altered and expired tokens are refused", "[unit][mgmt][token]") {
    auto now = sys_clock::now();
    auto t = sign_token(secret, claims(now + 30s));

    SECTION("another secret") {
        auto forged = sign_token("someone-elses-secret-0000", claims(now + 30s));
        auto r = verify_token(secret, forged, now);
        REQUIRE_FALSE(r);
        CHECK(r.error().find("signature") != std::string::npos);
    }
    SECTION("claims changed after signing (more memory)") {
        auto bigger = sign_token(secret, {"lease-1", "GPU-1234-abcd", 80ull << 30, now + 30s});
        std::string altered = bigger.substr(0, bigger.rfind('.')) + t.substr(t.rfind('.'));
        CHECK_FALSE(verify_token(secret, altered, now));
    }
    SECTION("every single flipped character") {
        for (size_t i = 0; i < t.size(); ++i) {
            std::string bad = t;
            bad[i] = bad[i] == 'A' ? 'B' : 'A';
            if (bad == t) continue;
            INFO("position " << i);
            CHECK_FALSE(verify_token(secret, bad, now));
        }
    }
    SECTION("expired") {
        auto r = verify_token(secret, t, now + 31s);
        REQUIRE_FALSE(r);
        CHECK(r.error().find("expired") != std::string::npos);
        CHECK_FALSE(verify_token(secret, t, now + 30s));  // at the instant of expiry
        CHECK(verify_token(secret, t, now + 29s));
    }
    SECTION("garbage") {
        for (const std::string& g :
             std::vector<std::string>{"", "vct1.", "vct1..", "vct1.abc.def", "vct2." + t.substr(5), t + "x",
                                      std::string(10000, 'a')})
            CHECK_FALSE(verify_token(secret, g, now));
    }
}

TEST_CASE("secret files: trimmed, long enough, private", "[unit][mgmt][token]") {
    vcuda::mgmt::test::temp_dir dir;
    auto path = dir / "secret";
    { std::ofstream(path) << "  c2VjcmV0LXNlY3JldC1zZWNyZXQ=\n"; }
    ::chmod(path.c_str(), 0600);
    auto s = read_secret_file(path);
    REQUIRE(s);
    CHECK(*s == "c2VjcmV0LXNlY3JldC1zZWNyZXQ=");
    ::chmod(path.c_str(), 0644);
    auto open = read_secret_file(path);
    REQUIRE_FALSE(open);
    CHECK(open.error().find("chmod 600") != std::string::npos);
    { std::ofstream(path) << "short\n"; }
    ::chmod(path.c_str(), 0600);
    CHECK_FALSE(read_secret_file(path));
    auto missing = read_secret_file(dir / "none");
    REQUIRE_FALSE(missing);
    CHECK(missing.error().find("/dev/urandom") != std::string::npos);
}
