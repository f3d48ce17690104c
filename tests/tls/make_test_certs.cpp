// vcuda_test_certs DIR: writes throw-away TLS certificates for tests and benchmarks into DIR (made if
// missing): ca.pem, server.pem/.key (localhost, 127.0.0.1, ::1), client.pem/.key, other-ca.pem,
// other-client.pem/.key (tests/tls/test_certs.hpp). Never for production: keys are written unprotected.
#include <sys/stat.h>

#include <cstdio>
#include <string_view>

#include "tests/tls/test_certs.hpp"

int main(int argc, char** argv) {
    // An option is never a directory (a `--help` once left a folder of that name in the repository).
    if (argc != 2 || argv[1][0] == '-') {
        std::fprintf(
            stderr,
            "usage: vcuda_test_certs DIR\n  writes throw-away TLS certificates and keys for tests into "
            "DIR (made if missing); never for production\n");
        return argc == 2 && std::string_view(argv[1]) == "--help" ? 0 : 2;
    }
    ::mkdir(argv[1], 0700);
    vcuda::test::test_cert_files files;
    if (auto why = vcuda::test::write_test_certs(argv[1], files); !why.empty()) {
        std::fprintf(stderr, "vcuda_test_certs: %s\n", why.c_str());
        return 1;
    }
    return 0;
}
