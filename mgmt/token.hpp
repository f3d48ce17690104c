// Lease tokens: the manager signs one per leased GPU; a vcuda-server attached to a manager opens a session
// only for a valid, unexpired token naming one of its GPUs, and uses the token's memory quota as the
// session's quota. A standalone server started with --secret-file takes tokens made with `vcuda token create`
// (any_gpu). Format: "vct1.<base64url(claims)>.<base64url(HMAC-SHA256(secret, "vct1.<base64url(claims)>"))>",
// claims being "lease_id\ngpu_uuid\nmemory_quota\nexpires_at_unix_ms". The secret is shared by the manager
// and its servers
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
};

// Signs the claims. lease_id and gpu_uuid must not contain '\n' (the manager's ids and GPU UUIDs never do).
std::string sign_token(std::string_view secret, const token_claims& claims);

// Checks the format, the signature (constant-time) and the expiry. The error says what is wrong, for the log
// and for the refused client ("token expired at ...: the lease was not renewed", "bad signature: ...").
result<token_claims, std::string> verify_token(std::string_view secret, std::string_view token,
                                               std::chrono::system_clock::time_point now);

// Reads a shared secret from a file (surrounding whitespace trimmed). Refuses an empty or short (< 16 bytes)
// secret, and a file that others than its owner can read.
result<std::string, std::string> read_secret_file(const std::string& path);

}  // namespace vcuda::mgmt
