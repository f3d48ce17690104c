// MD2 against RFC 1319's test suite, and HMAC-MD2's construction.
#include <catch2/catch.hpp>

#include <cstdio>
#include <string>

#include "client/integrity.hpp"

namespace {
std::string hex(const std::array<uint8_t, 16>& d) {
    std::string s;
    char b[3];
    for (auto x : d) {
        std::snprintf(b, sizeof b, "%02x", x);
        s += b;
    }
    return s;
}
std::array<uint8_t, 16> md2_of(const std::string& m) {
    return vcuda::client::md2({reinterpret_cast<const uint8_t*>(m.data()), m.size()});
}
}  // namespace

TEST_CASE("MD2 matches the RFC 1319 test suite", "[unit]") {
    CHECK(hex(md2_of("")) == "8350e5a3e24c153df2275c9f80692773");
    CHECK(hex(md2_of("a")) == "32ec01ec4a6dac72c0ab96fb34c0b5d1");
    CHECK(hex(md2_of("abc")) == "da853b0d3f88d99b30283a69e6ded6bb");
    CHECK(hex(md2_of("message digest")) == "ab4f496bfb2a530b219ff33031fe06b0");
    CHECK(hex(md2_of("abcdefghijklmnopqrstuvwxyz")) == "4e8ddff3650292ab5a4108c3aa47940b");
    CHECK(hex(md2_of("12345678901234567890123456789012345678901234567890123456789012345678901234567890")) ==
          "d5976f79d83d3a0dc9806c3c66f3efd8");
}

TEST_CASE("HMAC-MD2 is MD2(K^opad || MD2(K^ipad || m))", "[unit]") {
    uint8_t key[16];
    for (int i = 0; i < 16; ++i) key[i] = static_cast<uint8_t>(i * 7 + 1);
    std::string msg = "vcuda integrity";
    std::string inner(16, '\0'), outer(16, '\0');
    for (int i = 0; i < 16; ++i) {
        inner[i] = static_cast<char>(key[i] ^ 0x36);
        outer[i] = static_cast<char>(key[i] ^ 0x5c);
    }
    auto h = md2_of(inner + msg);
    auto expected = md2_of(outer + std::string(h.begin(), h.end()));
    auto got = vcuda::client::hmac_md2(std::span<const uint8_t, 16>(key, 16),
                                       {reinterpret_cast<const uint8_t*>(msg.data()), msg.size()});
    CHECK(got == expected);
}
