// Byte sizes and durations as operators write them ("8G", "512MiB", "30s"), for flags, environment and
// tables.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace vcuda::mgmt {

// "1073741824", "8G", "8GB", "8GiB", "1.5g", "512M", "64k": binary units (K = 1024). nullopt if not a size.
std::optional<uint64_t> parse_size(std::string_view text);
// 8589934592 -> "8.0 GiB"; small values in MiB/KiB/B.
std::string format_size(uint64_t bytes);

// "30s", "500ms", "2m", "1h", "10" (seconds). nullopt if not a duration.
std::optional<std::chrono::milliseconds> parse_duration(std::string_view text);

}  // namespace vcuda::mgmt
