#include "tests/tls/test_certs.hpp"

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <cstdio>
#include <memory>

namespace vcuda::test {

namespace {

struct key_free {
    void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
struct cert_free {
    void operator()(X509* x) const { X509_free(x); }
};
using key_ptr = std::unique_ptr<EVP_PKEY, key_free>;
using cert_ptr = std::unique_ptr<X509, cert_free>;

bool add_ext(X509* cert, X509* issuer, int nid, const char* value) {
    X509V3_CTX ctx;
    X509V3_set_ctx_nodb(&ctx);
    X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
    X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
    if (!ext) return false;
    bool ok = X509_add_ext(cert, ext, -1) == 1;
    X509_EXTENSION_free(ext);
    return ok;
}

// A certificate for `key` named `cn`, signed by issuer/issuer_key (itself when issuer is null: a CA).
cert_ptr make_cert(EVP_PKEY* key, const char* cn, X509* issuer, EVP_PKEY* issuer_key, long serial,
                   const char* san, const char* usage) {
    cert_ptr x(X509_new());
    if (!x) return nullptr;
    X509_set_version(x.get(), 2);
    ASN1_INTEGER_set(X509_get_serialNumber(x.get()), serial);
    X509_gmtime_adj(X509_getm_notBefore(x.get()), -3600);
    X509_gmtime_adj(X509_getm_notAfter(x.get()), 7L * 24 * 3600);
    X509_set_pubkey(x.get(), key);
    X509_NAME_add_entry_by_txt(X509_get_subject_name(x.get()), "CN", MBSTRING_ASC,
                               reinterpret_cast<const unsigned char*>(cn), -1, -1, 0);
    const bool ca = issuer == nullptr;
    X509* signer = ca ? x.get() : issuer;
    X509_set_issuer_name(x.get(), X509_get_subject_name(signer));
    bool ok =
        add_ext(x.get(), signer, NID_basic_constraints, ca ? "critical,CA:TRUE" : "critical,CA:FALSE") &&
        add_ext(x.get(), signer, NID_key_usage,
                ca ? "critical,keyCertSign,cRLSign" : "critical,digitalSignature") &&
        add_ext(x.get(), signer, NID_subject_key_identifier, "hash") &&
        (ca || add_ext(x.get(), signer, NID_authority_key_identifier, "keyid")) &&
        (!san || add_ext(x.get(), signer, NID_subject_alt_name, san)) &&
        (!usage || add_ext(x.get(), signer, NID_ext_key_usage, usage));
    if (!ok || X509_sign(x.get(), ca ? key : issuer_key, EVP_sha256()) == 0) return nullptr;
    return x;
}

bool write_cert(const std::string& path, X509* x) {
    std::FILE* f = std::fopen(path.c_str(), "w");
    if (!f) return false;
    bool ok = PEM_write_X509(f, x) == 1;
    return std::fclose(f) == 0 && ok;
}

bool write_key(const std::string& path, EVP_PKEY* k) {
    std::FILE* f = std::fopen(path.c_str(), "w");
    if (!f) return false;
    bool ok = PEM_write_PrivateKey(f, k, nullptr, nullptr, 0, nullptr, nullptr) == 1;
    return std::fclose(f) == 0 && ok;
}

}  // namespace

std::string write_test_certs(const std::string& dir, test_cert_files& out) {
    key_ptr ca_key(EVP_EC_gen("P-256")), server_key(EVP_EC_gen("P-256")), client_key(EVP_EC_gen("P-256")),
        other_ca_key(EVP_EC_gen("P-256")), other_key(EVP_EC_gen("P-256"));
    if (!ca_key || !server_key || !client_key || !other_ca_key || !other_key) return "cannot make EC keys";
    cert_ptr ca = make_cert(ca_key.get(), "vcuda test CA", nullptr, nullptr, 1, nullptr, nullptr);
    cert_ptr other_ca = make_cert(other_ca_key.get(), "another CA", nullptr, nullptr, 2, nullptr, nullptr);
    if (!ca || !other_ca) return "cannot make the CAs";
    cert_ptr server = make_cert(server_key.get(), "localhost", ca.get(), ca_key.get(), 3,
                                "DNS:localhost,IP:127.0.0.1,IP:::1", "serverAuth");
    cert_ptr client =
        make_cert(client_key.get(), "vcuda test client", ca.get(), ca_key.get(), 4, nullptr, "clientAuth");
    cert_ptr other = make_cert(other_key.get(), "a client of another CA", other_ca.get(), other_ca_key.get(),
                               5, nullptr, "clientAuth");
    if (!server || !client || !other) return "cannot make the certificates";
    out.ca = dir + "/ca.pem";
    out.server_cert = dir + "/server.pem";
    out.server_key = dir + "/server.key";
    out.client_cert = dir + "/client.pem";
    out.client_key = dir + "/client.key";
    out.other_ca = dir + "/other-ca.pem";
    out.other_cert = dir + "/other-client.pem";
    out.other_key = dir + "/other-client.key";
    bool ok = write_cert(out.ca, ca.get()) && write_cert(out.server_cert, server.get()) &&
              write_key(out.server_key, server_key.get()) && write_cert(out.client_cert, client.get()) &&
              write_key(out.client_key, client_key.get()) && write_cert(out.other_ca, other_ca.get()) &&
              write_cert(out.other_cert, other.get()) && write_key(out.other_key, other_key.get());
    return ok ? std::string() : "cannot write the files in " + dir;
}

}  // namespace vcuda::test
