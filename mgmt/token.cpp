#include "mgmt/token.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <openssl/sha.h>
#include <sys/stat.h>

#include <charconv>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <vector>

namespace vcuda::mgmt {

namespace {

constexpr std::string_view prefix = "vct1.";
constexpr char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

std::string b64url_encode(std::string_view in) {
    std::string out;
    out.reserve((in.size() + 2) / 3 * 4);
    size_t i = 0;
    for (; i + 2 < in.size(); i += 3) {
        uint32_t v = uint32_t(uint8_t(in[i])) << 16 | uint32_t(uint8_t(in[i + 1])) << 8 | uint8_t(in[i + 2]);
        out += {b64[v >> 18], b64[(v >> 12) & 63], b64[(v >> 6) & 63], b64[v & 63]};
    }
    if (i + 1 == in.size()) {
        uint32_t v = uint32_t(uint8_t(in[i])) << 16;
        out += {b64[v >> 18], b64[(v >> 12) & 63]};
    } else if (i + 2 == in.size()) {
        uint32_t v = uint32_t(uint8_t(in[i])) << 16 | uint32_t(uint8_t(in[i + 1])) << 8;
        out += {b64[v >> 18], b64[(v >> 12) & 63], b64[(v >> 6) & 63]};
    }
    return out;
}

bool b64url_decode(std::string_view in, std::string& out) {
    if (in.size() % 4 == 1) return false;
    uint32_t acc = 0;
    int bits = 0;
    for (char c : in) {
        const char* p = c ? std::char_traits<char>::find(b64, 64, c) : nullptr;
        if (!p) return false;
        acc = acc << 6 | uint32_t(p - b64);
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out.push_back(char((acc >> bits) & 0xff));
        }
    }
    return (acc & ((1u << bits) - 1)) == 0;  // leftover bits must be zero (canonical encoding)
}

std::string mac(std::string_view secret, std::string_view data) {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
         reinterpret_cast<const unsigned char*>(data.data()), data.size(), md, &len);
    return std::string(reinterpret_cast<char*>(md), len);
}

int64_t unix_ms(std::chrono::system_clock::time_point t) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
}

std::string hex(std::string_view bytes) {
    static constexpr char digits[] = "0123456789abcdef";
    std::string out;
    out.reserve(bytes.size() * 2);
    for (char c : bytes) {
        out += digits[uint8_t(c) >> 4];
        out += digits[uint8_t(c) & 15];
    }
    return out;
}

// Bytes from the OS CSPRNG (through OpenSSL's DRBG, seeded from getrandom). Aborts rather than hand out a
// guessable secret.
std::string random_bytes(size_t n) {
    std::string out(n, '\0');
    if (RAND_bytes(reinterpret_cast<unsigned char*>(out.data()), static_cast<int>(n)) != 1) std::abort();
    return out;
}

std::string sha256_hex(std::string_view data) {
    unsigned char md[SHA256_DIGEST_LENGTH];
    SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(), md);
    return hex(std::string_view(reinterpret_cast<char*>(md), sizeof md));
}

constexpr std::string_view request_prefix = "vcs1.";
constexpr std::string_view credential_prefix = "vcc1.";

std::string request_mac(std::string_view secret, std::string_view signed_part, std::string_view method,
                        std::string_view body) {
    std::string data;
    data.reserve(signed_part.size() + method.size() + body.size() + 2);
    data.append(signed_part).append("\n").append(method).append("\n").append(body);
    return mac(secret, data);
}

}  // namespace

std::string sign_token(std::string_view secret, const token_claims& c) {
    std::string claims = c.lease_id + "\n" + c.gpu_uuid + "\n" + std::to_string(c.memory_quota) + "\n" +
                         std::to_string(unix_ms(c.expires_at));
    if (!c.tenant.empty()) claims += "\n" + c.tenant;
    std::string signed_part = std::string(prefix) + b64url_encode(claims);
    return signed_part + "." + b64url_encode(mac(secret, signed_part));
}

result<token_claims, std::string> verify_token(std::string_view secret, std::string_view token,
                                               std::chrono::system_clock::time_point now) {
    if (token.empty())
        return unexpected{
            std::string("no token: this server only serves clients with a lease from its manager (run with "
                        "VCUDA_MANAGER or `vcuda run --manager`)")};
    if (token.size() > 4096 || !token.starts_with(prefix))
        return unexpected{std::string("malformed token: not a vcuda lease token")};
    auto dot = token.rfind('.');
    if (dot < prefix.size()) return unexpected{std::string("malformed token: no signature")};
    std::string_view signed_part = token.substr(0, dot), sig_text = token.substr(dot + 1);
    std::string sig;
    if (!b64url_decode(sig_text, sig) || sig.size() != 32)
        return unexpected{std::string("malformed token: bad signature encoding")};
    std::string expected = mac(secret, signed_part);
    if (CRYPTO_memcmp(expected.data(), sig.data(), 32) != 0)
        return unexpected{
            std::string("bad token signature: forged, altered, or signed with another secret "
                        "(the manager and this server must use the same --secret-file)")};
    std::string claims;
    if (!b64url_decode(signed_part.substr(prefix.size()), claims))
        return unexpected{std::string("malformed token: bad claims encoding")};
    std::vector<std::string> f;
    std::istringstream in(claims);
    for (std::string line; std::getline(in, line, '\n');) f.push_back(line);
    if (f.size() != 4 && f.size() != 5)
        return unexpected{std::string("malformed token: wrong number of claims")};
    token_claims c;
    c.lease_id = f[0];
    c.gpu_uuid = f[1];
    if (f.size() == 5) c.tenant = f[4];
    int64_t exp = 0;
    auto r1 = std::from_chars(f[2].data(), f[2].data() + f[2].size(), c.memory_quota);
    auto r2 = std::from_chars(f[3].data(), f[3].data() + f[3].size(), exp);
    if (r1.ec != std::errc() || r1.ptr != f[2].data() + f[2].size() || r2.ec != std::errc() ||
        r2.ptr != f[3].data() + f[3].size())
        return unexpected{std::string("malformed token: bad numbers in claims")};
    c.expires_at = std::chrono::system_clock::time_point(std::chrono::milliseconds(exp));
    if (now >= c.expires_at)
        return unexpected{
            "token for lease " + c.lease_id + " expired " + std::to_string((unix_ms(now) - exp) / 1000) +
            " s ago: the lease was not renewed; the client must get a fresh lease from the manager"};
    return c;
}

std::string token_fingerprint(std::string_view token) { return sha256_hex(token).substr(0, 32); }

std::string sign_request(std::string_view secret, std::string_view method, std::string_view body,
                         std::chrono::system_clock::time_point now) {
    std::string signed_part =
        std::string(request_prefix) + std::to_string(unix_ms(now)) + "." + hex(random_bytes(16));
    return signed_part + "." + b64url_encode(request_mac(secret, signed_part, method, body));
}

result<signed_request, std::string> verify_request(std::string_view secret, std::string_view auth,
                                                   std::string_view method, std::string_view body,
                                                   std::chrono::system_clock::time_point now,
                                                   std::chrono::milliseconds window) {
    if (auth.size() > 256 || !auth.starts_with(request_prefix))
        return unexpected{std::string("not a request signed with the shared secret")};
    auto dot1 = auth.find('.', request_prefix.size());
    auto dot2 = dot1 == std::string_view::npos ? dot1 : auth.find('.', dot1 + 1);
    if (dot2 == std::string_view::npos) return unexpected{std::string("malformed request signature")};
    std::string_view at_text = auth.substr(request_prefix.size(), dot1 - request_prefix.size());
    std::string_view nonce = auth.substr(dot1 + 1, dot2 - dot1 - 1);
    std::string sig;
    if (nonce.size() != 32 || !b64url_decode(auth.substr(dot2 + 1), sig) || sig.size() != 32)
        return unexpected{std::string("malformed request signature")};
    std::string expected = request_mac(secret, auth.substr(0, dot2), method, body);
    if (CRYPTO_memcmp(expected.data(), sig.data(), 32) != 0)
        return unexpected{
            std::string("bad request signature: signed with another secret (vcuda-mgmt and every "
                        "vcuda-server must use the "
                        "same --secret-file), or altered on the way")};
    signed_request r;
    auto rc = std::from_chars(at_text.data(), at_text.data() + at_text.size(), r.at_ms);
    if (rc.ec != std::errc() || rc.ptr != at_text.data() + at_text.size())
        return unexpected{std::string("malformed request signature")};
    int64_t skew = unix_ms(now) - r.at_ms;
    if (skew > window.count() || -skew > window.count())
        return unexpected{"request signed " + std::to_string(skew / 1000) +
                          " s away from the manager's clock (at most " +
                          std::to_string(window.count() / 1000) +
                          " s): a replay, or this host's clock is wrong (run NTP on every host)"};
    r.nonce = std::string(nonce);
    return r;
}

new_credential make_credential() {
    new_credential c;
    c.id = "cred-" + hex(random_bytes(8));
    std::string secret = b64url_encode(random_bytes(32));
    c.text = std::string(credential_prefix) + c.id + "." + secret;
    c.hash = sha256_hex(secret);
    return c;
}

result<credential_parts, std::string> parse_credential(std::string_view text) {
    if (text.size() > 256 || !text.starts_with(credential_prefix))
        return unexpected{
            std::string("not a vcuda credential (it starts with vcc1.; make one with `vcuda tokens create "
                        "--tenant NAME`)")};
    auto dot = text.find('.', credential_prefix.size());
    if (dot == std::string_view::npos) return unexpected{std::string("malformed credential")};
    credential_parts p;
    p.id = std::string(text.substr(credential_prefix.size(), dot - credential_prefix.size()));
    std::string_view secret = text.substr(dot + 1);
    std::string raw;
    if (p.id.empty() || !b64url_decode(secret, raw) || raw.size() != 32)
        return unexpected{std::string("malformed credential")};
    p.hash = sha256_hex(secret);
    return p;
}

bool same_hash(std::string_view a, std::string_view b) {
    return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

result<std::string, std::string> read_secret_file(const std::string& path) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0)
        return unexpected{"cannot read the secret file " + path +
                          ": it does not exist. Create one with `head -c 32 /dev/urandom | base64 > " + path +
                          " && chmod 600 " + path +
                          "` and give the same file to vcuda-mgmt and every vcuda-server"};
    if (st.st_mode & 077)
        return unexpected{"the secret file " + path + " can be read by other users; run `chmod 600 " + path +
                          "`"};
    std::ifstream f(path, std::ios::binary);
    if (!f) return unexpected{"cannot open the secret file " + path + " (permission denied?)"};
    std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    auto ws = [](char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; };
    while (!s.empty() && ws(s.back())) s.pop_back();
    size_t b = 0;
    while (b < s.size() && ws(s[b])) ++b;
    s.erase(0, b);
    if (s.size() < 16)
        return unexpected{"the secret in " + path + " is too short (" + std::to_string(s.size()) +
                          " bytes; at least 16): create one with `head -c 32 /dev/urandom | base64 > " +
                          path + "`"};
    return s;
}

}  // namespace vcuda::mgmt
