// MD2 (RFC 1319) and HMAC-MD2 (RFC 2104 over MD2's 16-byte block): the digest cudart's integrity check
// expects from the driver (../shared/reference/driver-interface.md, table d4082055).
#pragma once

#include <array>
#include <cstdint>
#include <span>

namespace vcuda::client {

std::array<uint8_t, 16> md2(std::span<const uint8_t> message);
std::array<uint8_t, 16> hmac_md2(std::span<const uint8_t, 16> key, std::span<const uint8_t> message);

}  // namespace vcuda::client
