// Logging for every vcuda part: spdlog, one named logger per part, level from VCUDA_LOG_LEVEL or a flag.
// runs on: any thread (spdlog loggers are thread-safe).
#pragma once

#include <spdlog/spdlog.h>

#include <memory>
#include <string_view>

namespace vcuda::log {

// Creates the process logger `name` writing to stderr (or VCUDA_LOG_FILE). Its level is `level` when given,
// else VCUDA_LOG_LEVEL, else `fallback`. Safe to call more than once.
void init(std::string_view name, std::string_view level = {}, std::string_view fallback = "info");

// Parses trace|debug|info|warn|error|critical|off; returns false on an unknown word.
bool parse_level(std::string_view text, spdlog::level::level_enum& out);

std::shared_ptr<spdlog::logger>& get();

}  // namespace vcuda::log

#define VCUDA_LOG_TRACE(...) ::vcuda::log::get()->trace(__VA_ARGS__)
#define VCUDA_LOG_DEBUG(...) ::vcuda::log::get()->debug(__VA_ARGS__)
#define VCUDA_LOG_INFO(...) ::vcuda::log::get()->info(__VA_ARGS__)
#define VCUDA_LOG_WARN(...) ::vcuda::log::get()->warn(__VA_ARGS__)
#define VCUDA_LOG_ERROR(...) ::vcuda::log::get()->error(__VA_ARGS__)
