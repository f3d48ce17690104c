// Throw-away certificates for the TLS tests, made at test time with OpenSSL (nothing secret is committed): a
// CA, a server certificate it signs for localhost, 127.0.0.1 and ::1, a client certificate it signs, and a
// second, unrelated CA with a client certificate of its own (the "wrong CA" cases). EC P-256 keys: made in
// milliseconds.
#pragma once

#include <string>

namespace vcuda::test {

// The files write_test_certs makes in its folder (PEM).
struct test_cert_files {
    std::string ca;                       // ca.pem: the CA clients and servers trust
    std::string server_cert, server_key;  // server.pem, server.key: for localhost, 127.0.0.1, ::1
    std::string client_cert, client_key;  // client.pem, client.key: a client certificate the CA signed
    std::string other_ca;                 // other-ca.pem: a CA that signed neither
    std::string other_cert, other_key;    // other-client.pem, other-client.key: signed by the other CA
};

// Writes the files into `dir` (which must exist); "" on success, else what failed.
std::string write_test_certs(const std::string& dir, test_cert_files& out);

}  // namespace vcuda::test
