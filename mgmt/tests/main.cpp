// Catch2 main for vcuda_mgmt_tests.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
