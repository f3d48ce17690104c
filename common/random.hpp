// Secrets from the operating system's CSPRNG (getrandom(2), /dev/urandom where that is missing): session ids
// and join secrets, anything a peer must not be able to guess. Never a seeded library generator. runs on: any
// thread (no shared state).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace vcuda {

// Fills `buf` with `n` random bytes; false (buf unspecified) only when the system has no randomness to give.
bool os_random(void* buf, size_t n);
// `n` random bytes as a string; aborts the process if the system has none (nothing safe can be done then).
std::string os_random_bytes(size_t n);
uint64_t os_random_u64();

// Compares two byte strings in time that depends on their lengths only, not on where they differ.
bool equal_constant_time(std::string_view a, std::string_view b);

}  // namespace vcuda
