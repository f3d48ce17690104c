#include "mgmt/wire/units.hpp"

#include <cctype>
#include <cmath>
#include <cstdio>

namespace vcuda::mgmt {

namespace {

std::string lower(std::string_view s) {
    std::string out(s);
    for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return out;
}

// Splits "1.5GiB" into 1.5 and "gib"; false when the number part is missing or malformed.
bool split_number(std::string_view text, double& number, std::string& unit) {
    while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) text.remove_prefix(1);
    while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.remove_suffix(1);
    size_t i = 0;
    bool digits = false, dot = false;
    for (; i < text.size(); ++i) {
        char c = text[i];
        if (std::isdigit(static_cast<unsigned char>(c)))
            digits = true;
        else if (c == '.' && !dot)
            dot = true;
        else
            break;
    }
    if (!digits) return false;
    std::string num(text.substr(0, i));
    char* end = nullptr;
    number = std::strtod(num.c_str(), &end);
    if (end != num.c_str() + num.size() || !std::isfinite(number) || number < 0) return false;
    std::string_view rest = text.substr(i);
    while (!rest.empty() && std::isspace(static_cast<unsigned char>(rest.front()))) rest.remove_prefix(1);
    unit = lower(rest);
    return true;
}

}  // namespace

std::optional<uint64_t> parse_size(std::string_view text) {
    double n = 0;
    std::string unit;
    if (!split_number(text, n, unit)) return std::nullopt;
    double mult = 1;
    if (unit.empty() || unit == "b")
        mult = 1;
    else if (unit == "k" || unit == "kb" || unit == "kib")
        mult = 1024.0;
    else if (unit == "m" || unit == "mb" || unit == "mib")
        mult = 1024.0 * 1024;
    else if (unit == "g" || unit == "gb" || unit == "gib")
        mult = 1024.0 * 1024 * 1024;
    else if (unit == "t" || unit == "tb" || unit == "tib")
        mult = 1024.0 * 1024 * 1024 * 1024;
    else
        return std::nullopt;
    double bytes = n * mult;
    if (bytes >= 18446744073709551615.0) return std::nullopt;
    return static_cast<uint64_t>(std::llround(bytes));
}

std::string format_size(uint64_t bytes) {
    char buf[64];
    constexpr double kib = 1024.0, mib = kib * 1024, gib = mib * 1024, tib = gib * 1024;
    double b = static_cast<double>(bytes);
    if (b >= tib)
        std::snprintf(buf, sizeof buf, "%.1f TiB", b / tib);
    else if (b >= gib)
        std::snprintf(buf, sizeof buf, "%.1f GiB", b / gib);
    else if (b >= mib)
        std::snprintf(buf, sizeof buf, "%.0f MiB", b / mib);
    else if (b >= kib)
        std::snprintf(buf, sizeof buf, "%.0f KiB", b / kib);
    else
        std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
    return buf;
}

std::optional<std::chrono::milliseconds> parse_duration(std::string_view text) {
    double n = 0;
    std::string unit;
    if (!split_number(text, n, unit)) return std::nullopt;
    double ms = 0;
    if (unit.empty() || unit == "s" || unit == "sec")
        ms = n * 1000;
    else if (unit == "ms")
        ms = n;
    else if (unit == "m" || unit == "min")
        ms = n * 60'000;
    else if (unit == "h")
        ms = n * 3'600'000;
    else
        return std::nullopt;
    if (ms > 1e15) return std::nullopt;
    return std::chrono::milliseconds(static_cast<long long>(std::llround(ms)));
}

}  // namespace vcuda::mgmt
