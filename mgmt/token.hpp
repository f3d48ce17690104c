// Lease tokens: the manager signs one per leased GPU; a vcuda-server attached to a manager opens a session
// only for a valid, unexpired token naming one of its GPUs, and uses the token's memory quota as the
// session's quota. A standalone server started with --secret-file takes tokens made with `vcuda token create`
// (any_gpu). Format: "vct1.<base64url(claims)>.<base64url(HMAC-SHA256(secret, "vct1.<base64url(claims)>"))>",
// claims being "lease_id\ngpu_uuid\nmemory_quota\nexpires_at_unix_ms" and, when the token names one,
// "\ntenant". The secret is shared by the manager and its servers
// (--secret-file); anyone without it cannot mint or alter a token.
// runs on: any thread (no shared state).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/result.hpp"

namespace vcuda::mgmt {

// gpu_uuid of a token made with `vcuda token create` for a standalone server (one started with --secret-file
// and no --manager): it opens a session on any of the server's GPUs; lease_id is empty. Servers attached to a
// manager refuse it.
inline constexpr std::string_view any_gpu = "*";

struct token_claims {
    std::string lease_id;
    std::string gpu_uuid;
    uint64_t memory_quota = 0;                         // bytes the session may allocate
    std::chrono::system_clock::time_point expires_at;  // the server refuses new sessions with it after this
    // The lease's tenant (lease tokens the manager signs): sessions of one tenant may open each other's IPC
    // handles (server/ipc.hpp). Empty in tokens of `vcuda token create` and of managers before it was added.
    std::string tenant;
};

// The least a lease token the manager signs for a move lives (`active_lease.move_token`, for the target GPU):
// it is checked when the moved state arrives, after the old server saved it (seconds for a large session).
inline constexpr std::chrono::minutes move_token_life{2};

// Signs the claims. lease_id, gpu_uuid and tenant must not contain '\n' (the manager's ids, GPU UUIDs and
// tenant names never do).
std::string sign_token(std::string_view secret, const token_claims& claims);
// A digest of a token that names it without revealing it (hex, 32 digits): the tenant of sessions opened with
// a shared token of `vcuda token create`.
std::string token_fingerprint(std::string_view token);

// Checks the format, the signature (constant-time) and the expiry. The error says what is wrong, for the log
// and for the refused client ("token expired at ...: the lease was not renewed", "bad signature: ...").
result<token_claims, std::string> verify_token(std::string_view secret, std::string_view token,
                                               std::chrono::system_clock::time_point now);

// ---- Manager requests signed with the shared secret (vcuda-server's registration and heartbeats; operators
// on a host that holds the secret file). The MgmtRequest's auth field is
//   "vcs1.<unix_ms>.<nonce: 32 hex digits>.<base64url(HMAC-SHA256(secret,
//   "vcs1.<unix_ms>.<nonce>\n<method>\n<body>"))>"
// so a signature covers the method and the exact body bytes; the manager accepts it within
// request_window of its own clock and each nonce once (mgmt/daemon/service.cpp keeps the nonces it saw).
inline constexpr std::chrono::milliseconds request_window = std::chrono::seconds(60);

std::string sign_request(std::string_view secret, std::string_view method, std::string_view body,
                         std::chrono::system_clock::time_point now = std::chrono::system_clock::now());

struct signed_request {
    int64_t at_ms = 0;  // when it was signed (Unix ms)
    std::string nonce;
};
// Checks the format, the signature (constant-time) and that it was signed within `window` of `now`.
// The caller refuses a nonce it has seen before.
result<signed_request, std::string> verify_request(std::string_view secret, std::string_view auth,
                                                   std::string_view method, std::string_view body,
                                                   std::chrono::system_clock::time_point now,
                                                   std::chrono::milliseconds window = request_window);
inline bool is_signed_request(std::string_view auth) { return auth.starts_with("vcs1."); }

// ---- Tenant credentials, issued by the manager (`vcuda tokens create`): "vcc1.<id>.<secret>", the id public
// ("cred-" + 16 hex digits), the secret 32 bytes from the CSPRNG in base64url. The manager stores only
// SHA-256(secret) (the secret is random, so a fast hash is enough: there is nothing to guess).
struct new_credential {
    std::string id;
    std::string text;  // the whole credential: shown once, never stored
    std::string hash;  // hex SHA-256 of its secret part
};
new_credential make_credential();
struct credential_parts {
    std::string id;
    std::string hash;  // hex SHA-256 of the presented secret
};
// Splits a presented credential; an error for anything not shaped like one.
result<credential_parts, std::string> parse_credential(std::string_view text);
// Constant-time comparison of two hex hashes.
bool same_hash(std::string_view a, std::string_view b);

// Reads a shared secret from a file (surrounding whitespace trimmed). Refuses an empty or short (< 16 bytes)
// secret, and a file that others than its owner can read.
result<std::string, std::string> read_secret_file(const std::string& path);

}  // namespace vcuda::mgmt
