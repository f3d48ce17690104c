#include "common/log.hpp"

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_sinks.h>

#include <cstdlib>
#include <mutex>
#include <string>

namespace vcuda::log {

namespace {
std::mutex init_mutex;
}

bool parse_level(std::string_view text, spdlog::level::level_enum& out) {
    static constexpr std::pair<std::string_view, spdlog::level::level_enum> names[] = {
        {"trace", spdlog::level::trace},       {"debug", spdlog::level::debug},
        {"info", spdlog::level::info},         {"warn", spdlog::level::warn},
        {"warning", spdlog::level::warn},      {"error", spdlog::level::err},
        {"critical", spdlog::level::critical}, {"off", spdlog::level::off}};
    for (auto& [n, l] : names) {
        if (n == text) {
            out = l;
            return true;
        }
    }
    return false;
}

std::shared_ptr<spdlog::logger>& get() {
    // Never destroyed: libraries' exit handlers (cudart unloading its modules) may still log.
    static auto* logger = new std::shared_ptr<spdlog::logger>([] {
        auto l = std::make_shared<spdlog::logger>("vcuda", std::make_shared<spdlog::sinks::stderr_sink_mt>());
        l->set_level(spdlog::level::warn);
        l->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%n] [%l] %v");
        return l;
    }());
    return *logger;
}

void init(std::string_view name, std::string_view level, std::string_view fallback) {
    std::lock_guard lock(init_mutex);
    std::shared_ptr<spdlog::sinks::sink> sink;
    if (const char* file = std::getenv("VCUDA_LOG_FILE"); file && *file) {
        try {
            sink = std::make_shared<spdlog::sinks::basic_file_sink_mt>(file);
        } catch (const spdlog::spdlog_ex&) {
            sink = nullptr;  // fall back to stderr below; an unwritable log file must not stop the program
        }
    }
    if (!sink) sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
    auto logger = std::make_shared<spdlog::logger>(std::string(name), sink);
    logger->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%n] [%l] %v");
    spdlog::level::level_enum lvl = spdlog::level::info;
    std::string_view wanted = level;
    if (wanted.empty()) {
        if (const char* env = std::getenv("VCUDA_LOG_LEVEL"); env && *env) wanted = env;
    }
    if (wanted.empty()) wanted = fallback;
    if (!parse_level(wanted, lvl)) lvl = spdlog::level::info;
    logger->set_level(lvl);
    logger->flush_on(spdlog::level::warn);
    get() = logger;
}

}  // namespace vcuda::log
