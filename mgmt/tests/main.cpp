// Catch2 main for vcuda_mgmt_tests: the manager's logs stay quiet unless VCUDA_LOG_LEVEL asks for them.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <cstdlib>

#include "common/log.hpp"

int main(int argc, char** argv) {
    if (!std::getenv("VCUDA_LOG_LEVEL"))
        vcuda::log::get()->set_level(spdlog::level::off);
    else
        vcuda::log::init("vcuda-mgmt-tests");
    return Catch::Session().run(argc, argv);
}
