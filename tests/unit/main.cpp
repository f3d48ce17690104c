// Catch2's main for vcuda_unit_tests; the tests are in the other files of this folder.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
