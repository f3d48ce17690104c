// `vcuda token create`: mints a token for a standalone vcuda-server (one started with --secret-file and no
// --manager), signed with that server's secret (mgmt/token.hpp, gpu_uuid any_gpu). The operator hands it to
// the users who may use the server; it opens sessions until it expires.
#pragma once

#include <string>

namespace vcuda::cli {

// Prints the token on stdout; returns the exit code (2 with a message on stderr when an argument is wrong).
int create_token(const std::string& secret_file, const std::string& ttl, const std::string& memory);

}  // namespace vcuda::cli
