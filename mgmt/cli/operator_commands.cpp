#include "mgmt/cli/operator_commands.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "mgmt/cli/table.hpp"
#include "mgmt/token.hpp"
#include "mgmt/wire/lease.hpp"
#include "mgmt/wire/rpc.hpp"
#include "mgmt/wire/units.hpp"

namespace vcuda::cli {

namespace {

using mgmt::format_size;
using nlohmann::json;
constexpr auto call_timeout = std::chrono::seconds(10);

std::string str(const json& j, const char* key, std::string fallback = "") {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return fallback;
    if (it->is_string()) return it->get<std::string>();
    return it->dump();
}
uint64_t num(const json& j, const char* key) {
    auto it = j.find(key);
    if (it == j.end() || !it->is_number()) return 0;
    return it->is_number_float() ? static_cast<uint64_t>(it->get<double>()) : it->get<uint64_t>();
}
bool flag(const json& j, const char* key) {
    auto it = j.find(key);
    return it != j.end() && it->is_boolean() && it->get<bool>();
}
const json& list(const json& j, const char* key) {
    static const json empty = json::array();
    auto it = j.find(key);
    return it != j.end() && it->is_array() ? *it : empty;
}

int64_t now_ms() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
}
// "in 25s", "3m ago"
std::string relative(int64_t at_ms) {
    if (at_ms == 0) return "-";
    int64_t d = at_ms - now_ms();
    bool future = d >= 0;
    int64_t s = (future ? d : -d) / 1000;
    std::string t = s < 120    ? std::to_string(s) + "s"
                    : s < 7200 ? std::to_string(s / 60) + "m"
                               : std::to_string(s / 3600) + "h";
    return future ? "in " + t : t + " ago";
}

std::string gpu_state(const json& g) {
    std::string s = str(g, "state", "up");
    return s;
}

void print_gpus(const json& body) {
    table t(
        {"HOST", "GPU>", "MODEL", "MEMORY LEASED/TOTAL>", "UTIL>", "SESSIONS>", "LEASES>", "STATE", "UUID"});
    for (auto& g : list(body, "gpus")) {
        std::string mem = format_size(num(g, "leased_memory")) + " / " + format_size(num(g, "memory"));
        std::string util = g.contains("utilization") ? std::to_string(num(g, "utilization")) + "%" : "-";
        std::string leases = std::to_string(num(g, "leases")) + (flag(g, "exclusive") ? " (excl)" : "");
        t.add({str(g, "host"), std::to_string(num(g, "index")), str(g, "name"), mem, util,
               std::to_string(num(g, "sessions")), leases, gpu_state(g), str(g, "uuid")});
    }
    if (t.empty()) {
        std::printf(
            "no GPUs registered: start `vcuda-server --manager ADDR` on each GPU host so it registers "
            "here.\n");
        return;
    }
    std::fputs(t.render().c_str(), stdout);
}

void print_servers(const json& body) {
    table t({"SERVER", "HOST", "ENDPOINTS", "WINDOW>", "GPUS>", "LEASES>", "STATE", "LAST HEARTBEAT"});
    for (auto& s : list(body, "servers")) {
        std::string eps;
        for (auto& e : list(s, "endpoints"))
            eps += (eps.empty() ? "" : ",") + (e.is_string() ? e.get<std::string>() : e.dump());
        const bool windowed = s.contains("address_window") && s["address_window"].is_number_integer();
        t.add({str(s, "server_id"), str(s, "host"), eps,
               windowed ? std::to_string(s["address_window"].get<int64_t>()) : "-",
               std::to_string(num(s, "gpus")), std::to_string(num(s, "leases")), str(s, "state"),
               relative(static_cast<int64_t>(num(s, "last_heartbeat")))});
    }
    if (t.empty()) {
        std::printf("no servers registered: start `vcuda-server --manager ADDR` on each GPU host.\n");
        return;
    }
    std::fputs(t.render().c_str(), stdout);
}

void print_leases(const json& body) {
    table t({"LEASE", "TENANT", "CLIENT", "PID>", "HOST", "GPU>", "MEMORY>", "MODE", "EXPIRES"});
    for (auto& l : list(body, "leases")) {
        std::string client = str(l, "client_host"), mode = flag(l, "exclusive") ? "exclusive" : "shared";
        bool first = true;
        for (auto& d : list(l, "devices")) {
            t.add({first ? str(l, "lease_id") : "", first ? str(l, "tenant", "-") : "", first ? client : "",
                   first ? std::to_string(num(l, "pid")) : "", str(d, "host"),
                   std::to_string(num(d, "gpu_index")), format_size(num(d, "memory_quota")),
                   first ? mode : "", first ? relative(static_cast<int64_t>(num(l, "expires_at"))) : ""});
            first = false;
        }
    }
    if (t.empty()) {
        std::printf("no leases: no client holds a GPU right now.\n");
        return;
    }
    std::fputs(t.render().c_str(), stdout);
}

void print_sessions(const json& body) {
    table t({"HOST", "SERVER", "GPU", "SESSION", "LEASE", "CLIENT", "MEMORY USED>", "STATE", "IDLE>"});
    for (auto& s : list(body, "sessions")) {
        std::string state = flag(s, "suspended") ? "suspended" : "running";
        if (s.contains("moving_to")) state += ", moving to " + str(s, "moving_to");
        if (s.contains("arriving_from")) state = "arriving from " + str(s, "arriving_from");
        t.add({str(s, "host"), str(s, "server_id"), str(s, "gpu_uuid"), str(s, "session_id"),
               str(s, "lease_id", "-"), str(s, "client", "-"), format_size(num(s, "memory_used")), state,
               std::to_string(static_cast<uint64_t>(num(s, "idle_ms")) / 1000) + " s"});
    }
    if (t.empty()) {
        std::printf("no sessions: no client is connected to a vcuda-server that reports to this manager.\n");
        return;
    }
    std::fputs(t.render().c_str(), stdout);
}

void print_events(const json& body) {
    table t({"WHEN", "WHAT", "LEASE", "DETAIL"});
    for (auto& e : list(body, "events"))
        t.add({relative(static_cast<int64_t>(num(e, "at"))), str(e, "kind"), str(e, "lease_id", "-"),
               str(e, "detail")});
    if (t.empty()) {
        std::printf(
            "no events: the manager has not suspended, resumed, reclaimed or moved anything, nor given a "
            "server another address window, since it started.\n");
        return;
    }
    std::fputs(t.render().c_str(), stdout);
}

void print_credentials(const json& body) {
    table t({"ID", "TENANT", "ROLE", "CREATED", "EXPIRES", "STATE", "CREATED BY"});
    for (auto& c : list(body, "credentials")) {
        int64_t exp = static_cast<int64_t>(num(c, "expires_at"));
        std::string state = flag(c, "revoked")            ? "revoked"
                            : exp != 0 && exp <= now_ms() ? "expired"
                                                          : "valid";
        t.add({str(c, "id"), str(c, "tenant"), flag(c, "operator") ? "operator" : "tenant",
               relative(static_cast<int64_t>(num(c, "created_at"))), exp ? relative(exp) : "never", state,
               str(c, "created_by")});
    }
    if (t.empty()) {
        std::printf(
            "no credentials: make the first operator's on a host with the manager's secret file:\n"
            "  vcuda tokens create --tenant admin --operator --secret-file /etc/vcuda/secret -o "
            "admin.cred\n");
        return;
    }
    std::fputs(t.render().c_str(), stdout);
}

// "30d", "12h", "90s"; empty: never.
std::optional<int64_t> ttl_ms(const std::string& text) {
    if (text.empty() || text == "never") return 0;
    std::optional<std::chrono::milliseconds> life;
    if (text.back() == 'd') {
        if (auto days = mgmt::parse_duration(text.substr(0, text.size() - 1))) life = *days * 86400;
    } else {
        life = mgmt::parse_duration(text);
    }
    if (!life || life->count() <= 0) return std::nullopt;
    return life->count();
}

}  // namespace

result<std::string, std::string> operator_commands::auth(const std::string& method,
                                                         const std::string& body) const {
    if (!secret_file_.empty()) {
        auto secret = mgmt::read_secret_file(secret_file_);
        if (!secret) return unexpected{secret.error()};
        return mgmt::sign_request(*secret, method, body);
    }
    if (!credential_file_.empty()) return mgmt::read_credential_file(credential_file_);
    std::string error;
    std::string c = mgmt::credential_from_env(&error);
    if (!error.empty()) return unexpected{error};
    return c;  // empty: the manager answers what is missing
}

operator_commands::command operator_commands::add(CLI::App& app, const std::string& name,
                                                  const std::string& help, const char* target_help) {
    command c;
    c.app = app.add_subcommand(name, help);
    c.app->add_option("--manager,-m", manager_,
                      "vcuda-mgmt address HOST:PORT or unix:/path (default: $VCUDA_MANAGER)");
    c.app->add_flag("--json", json_, "print the manager's answer as JSON instead of a table");
    c.app->add_option("--credential", credential_file_,
                      "file holding your credential from `vcuda tokens create` (default: $VCUDA_CREDENTIAL, "
                      "else the file $VCUDA_CREDENTIAL_FILE)");
    c.app->add_option("--secret-file", secret_file_,
                      "sign the request with the manager's shared secret instead (a host that holds it, e.g. "
                      "the manager's: acts as an operator; how the first operator credential is made)");
    return c;
}

operator_commands::operator_commands(CLI::App& app) {
    gpus_ =
        add(app, "gpus", "List GPUs: host, index, model, memory leased/total, utilization, sessions, state.");
    servers_ = add(app, "servers", "List vcuda-servers registered with the manager and whether they are up.");
    leases_ = add(app, "leases", "List leases: which client holds which GPUs, how much memory, until when.");
    sessions_ = add(app, "sessions", "List client sessions that the servers report.");
    cordon_ = add(app, "cordon",
                  "Stop new leases on a GPU (by UUID) or on every GPU of a server (by host); existing leases "
                  "keep running.");
    cordon_.app->add_option("target", cordon_.target, "GPU UUID, server host or server id")->required();
    uncordon_ = add(app, "uncordon", "Allow new leases again on a GPU or server (also ends a drain).");
    uncordon_.app->add_option("target", uncordon_.target, "GPU UUID, server host or server id")->required();
    drain_ =
        add(app, "drain",
            "Drain a server: no new leases on it, and each of its leases moves live to another GPU (as "
            "`vcuda migrate` does: same GPU index, room for its memory, not cordoned or draining). Leases "
            "that cannot move run out there; `vcuda events` says why. With --wait nothing moves: the "
            "leases run out. `vcuda servers` shows 'drained' when it is empty.");
    drain_.app->add_option("host", drain_.target, "server host or server id")->required();
    drain_.app->add_flag("--wait", drain_wait_,
                         "only stop new leases and wait for the running ones to end (move nothing)");
    migrate_ =
        add(app, "migrate",
            "Move a lease's session live to another GPU (operators). Its server saves the session's GPU "
            "state and sends it to the target's server at its next heartbeat; the program pauses and "
            "goes on there, its pointers and handles unchanged. The target: the GPU named, or the "
            "best-fitting GPU of the host or server named, or of any host without --to; it must be up "
            "(not cordoned or draining) and have room for the lease's memory; it may be another GPU of the "
            "same server. `vcuda events` shows the request and the outcome "
            "('moved' with the pause, or 'not-moved' with the reason: then it stays where it was); "
            "`vcuda sessions` shows where the session is.");
    migrate_.app
        ->add_option("lease", migrate_.target,
                     "lease id (a lease of one GPU), or a session id, as `vcuda sessions` shows them")
        ->required();
    migrate_.app->add_option("--to", migrate_to_, "GPU UUID, server host or server id (default: any)");
    migrate_.app->footer(
        "Limits: sessions holding what a move does not carry yet (CUDA graphs unless the servers run with "
        "--suspend-graphs, memory pools and stream-ordered allocations, CUDA user objects, memory or events "
        "shared through IPC, VMM reservations outside "
        "the server's address window), and sessions sharing pinned host memory with a client on another "
        "host than the target, stay where they are, with the reason in `vcuda events`. A move to a GPU of "
        "another model leaves the program with the old GPU's attributes.");
    release_ =
        add(app, "release",
            "Release a lease now (the client loses its GPUs). Your own leases, or any with an operator "
            "credential.");
    release_.app->add_option("lease", release_.target, "lease id, as `vcuda leases` shows it")->required();
    suspend_ =
        add(app, "suspend",
            "Suspend a lease's sessions: each server saves their GPU state to its host memory and gives "
            "the GPU back; the program's next call resumes them. Your own leases, or any with an "
            "operator credential.");
    suspend_.app->add_option("lease", suspend_.target, "lease id, as `vcuda leases` shows it")->required();
    suspend_.app->footer(
        "Limits: sessions holding what a suspend does not rebuild yet (CUDA graphs, arrays, memory pools and "
        "stream-ordered allocations, memory shared by another session) go on running, with the reason in "
        "`vcuda events`. The program's own VMM use and --isolation process sessions are suspended.");
    resume_ = add(app, "resume", "Resume a suspended lease's sessions now, rather than at their next call.");
    resume_.app->add_option("lease", resume_.target, "lease id, as `vcuda leases` shows it")->required();
    events_ = add(app, "events",
                  "What the manager did and why (operators): suspends and resumes asked for, idle reclaims, "
                  "moves asked for (migrate: by an operator; drain; rebalance: the policy's decisions, also "
                  "those that moved nothing), and what the servers answered (session: a suspend's or "
                  "resume's outcome; moved: where a session went and how long it paused; not-moved: why "
                  "it stayed).");

    auto* tokens = app.add_subcommand(
        "tokens",
        "Credentials for the manager: who may lease GPUs (tenants) and manage the cluster (operators)");
    tokens->require_subcommand(1);
    tokens->footer(
        "Every call to the manager presents a credential: --credential FILE or VCUDA_CREDENTIAL.\n"
        "The first operator credential is made on a host that holds the manager's secret file:\n"
        "  vcuda tokens create --tenant admin --operator --secret-file /etc/vcuda/secret -o admin.cred\n"
        "(`vcuda token create`, singular, makes session tokens for a standalone vcuda-server.)");
    tokens_create_ =
        add(*tokens, "create",
            "Make a credential for a tenant (needs an operator credential). It is printed once; the "
            "manager keeps only its hash.");
    tokens_create_.app->add_option("--tenant", tokens_create_.target, "the tenant it identifies, e.g. alice")
        ->required();
    tokens_create_.app->add_flag(
        "--operator", token_operator_,
        "an operator credential: cordon, drain, release any lease, manage credentials");
    tokens_create_.app->add_option("--ttl", token_ttl_,
                                   "how long it is valid, e.g. 12h, 90d (default: until revoked)");
    tokens_create_.app->add_option("--output,-o", token_output_,
                                   "write it to this new file (mode 600) instead of printing it");
    tokens_list_ = add(*tokens, "list", "List credentials (ids, tenants, roles, expiry; never the secrets)");
    tokens_revoke_ =
        add(*tokens, "revoke",
            "Revoke a credential at once: the manager refuses it from now on, and its holder's lease "
            "renewals fail");
    tokens_revoke_.app
        ->add_option("id", tokens_revoke_.target, "credential id, as `vcuda tokens list` shows it")
        ->required();
}

int operator_commands::execute() {
    std::string addr = manager_;
    if (addr.empty())
        if (const char* env = std::getenv("VCUDA_MANAGER"); env && *env) addr = env;
    if (addr.empty()) {
        std::fprintf(stderr,
                     "vcuda: which manager? Pass --manager HOST:PORT or set VCUDA_MANAGER=HOST:PORT.\n"
                     "  No manager yet? Start one with `vcuda-mgmt --listen HOST:PORT --db mgmt.db "
                     "--secret-file secret`.\n");
        return 2;
    }
    auto ep = endpoint::parse(addr);
    if (!ep) {
        std::fprintf(stderr, "vcuda: the manager address '%s' is not valid: %s\n", addr.c_str(),
                     ep.error().c_str());
        return 2;
    }

    std::string method;
    json body = json::object();
    void (*print)(const json&) = nullptr;
    const command* cmd = nullptr;
    if (gpus_.app->parsed())
        method = "gpus.list", print = print_gpus;
    else if (servers_.app->parsed())
        method = "servers.list", print = print_servers;
    else if (leases_.app->parsed())
        method = "leases.list", print = print_leases;
    else if (sessions_.app->parsed())
        method = "sessions.list", print = print_sessions;
    else if (cordon_.app->parsed())
        method = "gpu.cordon", cmd = &cordon_, body["target"] = cordon_.target;
    else if (uncordon_.app->parsed())
        method = "gpu.uncordon", cmd = &uncordon_, body["target"] = uncordon_.target;
    else if (drain_.app->parsed()) {
        method = "server.drain", cmd = &drain_, body["host"] = drain_.target;
        if (drain_wait_) body["wait"] = true;
    } else if (migrate_.app->parsed()) {
        method = "lease.migrate", cmd = &migrate_, body["target"] = migrate_.target;
        if (!migrate_to_.empty()) body["to"] = migrate_to_;
    } else if (release_.app->parsed())
        method = "lease.release", cmd = &release_, body["lease_id"] = release_.target;
    else if (suspend_.app->parsed())
        method = "lease.suspend", cmd = &suspend_, body["lease_id"] = suspend_.target;
    else if (resume_.app->parsed())
        method = "lease.resume", cmd = &resume_, body["lease_id"] = resume_.target;
    else if (events_.app->parsed())
        method = "events.list", print = print_events;
    else if (tokens_list_.app->parsed())
        method = "tokens.list", print = print_credentials;
    else if (tokens_revoke_.app->parsed())
        method = "tokens.revoke", cmd = &tokens_revoke_, body["id"] = tokens_revoke_.target;
    else if (tokens_create_.app->parsed()) {
        method = "tokens.create", cmd = &tokens_create_;
        body["tenant"] = tokens_create_.target;
        body["operator"] = token_operator_;
        auto ttl = ttl_ms(token_ttl_);
        if (!ttl) {
            std::fprintf(stderr, "vcuda tokens create: --ttl '%s' is not a duration; write e.g. 12h or 90d\n",
                         token_ttl_.c_str());
            return 2;
        }
        if (*ttl) body["ttl_ms"] = *ttl;
        if (!token_output_.empty() && ::access(token_output_.c_str(), F_OK) == 0) {
            std::fprintf(stderr, "vcuda tokens create: %s exists; give a new file to -o\n",
                         token_output_.c_str());
            return 2;
        }
    } else
        return 2;

    std::string name;
    for (const command* c :
         {&gpus_, &servers_, &leases_, &sessions_, &cordon_, &uncordon_, &drain_, &release_, &suspend_,
          &resume_, &events_, &migrate_, &tokens_create_, &tokens_list_, &tokens_revoke_})
        if (c->app->parsed())
            name = (c == &tokens_create_ || c == &tokens_list_ || c == &tokens_revoke_ ? "tokens " : "") +
                   c->app->get_name();
    std::string body_text = body.dump();
    auto authorization = auth(method, body_text);
    if (!authorization) {
        std::fprintf(stderr, "vcuda %s: %s\n", name.c_str(), authorization.error().c_str());
        return 2;
    }
    auto reply = mgmt::mgmt_call(*ep, method, body_text, call_timeout, *authorization);
    if (!reply) {
        std::fprintf(stderr, "vcuda %s: %s\n", name.c_str(), mgmt::describe(reply.error(), *ep).c_str());
        return reply.error().kind == mgmt::rpc_errc::remote ? 1 : 3;
    }
    json out = json::parse(*reply, nullptr, false);
    if (out.is_discarded()) {
        std::fprintf(
            stderr, "vcuda: the manager at %s sent a reply that is not JSON; is it the same vcuda version?\n",
            addr.c_str());
        return 3;
    }
    if (cmd == &tokens_create_ && !token_output_.empty()) {
        std::string text = str(out, "credential") + "\n";
        int fd = ::open(token_output_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        bool written = fd >= 0 && ::write(fd, text.data(), text.size()) == ssize_t(text.size());
        if (fd >= 0) ::close(fd);
        if (!written) {
            std::fprintf(
                stderr,
                "vcuda tokens create: cannot write %s; credential %s was made: revoke it with `vcuda "
                "tokens revoke %s` and try again\n",
                token_output_.c_str(), str(out, "id").c_str(), str(out, "id").c_str());
            return 1;
        }
        out.erase("credential");
    }
    if (json_) {
        std::printf("%s\n", out.dump(2).c_str());
        return 0;
    }
    if (print) {
        print(out);
        return 0;
    }
    // Changes: one line that says what happened and how to undo it.
    if (cmd == &cordon_ || cmd == &uncordon_) {
        bool on = cmd == &cordon_;
        std::string what;
        for (auto& g : list(out, "gpus"))
            what += (what.empty() ? "" : ", ") + std::string("GPU ") + str(g, "host") + "/" +
                    std::to_string(num(g, "index"));
        for (auto& s : list(out, "servers"))
            what += (what.empty() ? "" : ", ") + std::string("server ") + str(s, "host") + " (" +
                    str(s, "server_id") + ")";
        if (on)
            std::printf(
                "cordoned %s: no new leases there; existing leases keep running. Undo with `vcuda uncordon "
                "%s`.\n",
                what.c_str(), cmd->target.c_str());
        else
            std::printf("uncordoned %s: it takes new leases again.\n", what.c_str());
    } else if (cmd == &drain_) {
        uint64_t left = num(out, "leases_left");
        if (drain_wait_) {
            std::printf(
                "draining %s: no new leases; %llu lease(s) still running will run out. `vcuda servers` shows "
                "'drained' when it is empty; `vcuda uncordon %s` ends the drain.\n",
                drain_.target.c_str(), static_cast<unsigned long long>(left), drain_.target.c_str());
        } else {
            std::printf("draining %s: no new leases; %zu of %llu lease(s) moving to other GPUs",
                        drain_.target.c_str(), list(out, "moving").size(),
                        static_cast<unsigned long long>(left));
            std::printf("%s", list(out, "staying").empty() ? ".\n" : "; staying (they run out there):\n");
            for (auto& st : list(out, "staying"))
                std::printf("  %s: %s\n", str(st, "lease_id").c_str(), str(st, "why").c_str());
            for (auto& m : list(out, "moving"))
                std::printf("  %s: to %s\n", str(m, "lease_id").c_str(), str(m, "to_uuid").c_str());
            std::printf(
                "`vcuda events` shows each outcome, `vcuda servers` 'drained' when it is empty; `vcuda "
                "uncordon %s` ends the drain.\n",
                drain_.target.c_str());
        }
    } else if (cmd == &migrate_) {
        std::printf(
            "move of lease %s asked for: from GPU %s to GPU %s (%s, %s); its server acts at its next "
            "heartbeat. "
            "`vcuda events` shows the outcome, `vcuda sessions` where it runs.\n",
            str(out, "lease_id").c_str(), str(out, "from_uuid").c_str(), str(out, "to_uuid").c_str(),
            str(out, "to_host").c_str(), str(out, "to_server_id").c_str());
    } else if (cmd == &release_) {
        std::printf("released lease %s\n", release_.target.c_str());
    } else if (cmd == &suspend_) {
        std::printf(
            "suspend of lease %s asked for: its servers act at their next heartbeat; `vcuda sessions` shows "
            "'suspended' once done, `vcuda events` what each server answered.\n",
            suspend_.target.c_str());
    } else if (cmd == &resume_) {
        std::printf("resume of lease %s asked for: its servers act at their next heartbeat.\n",
                    resume_.target.c_str());
    } else if (cmd == &tokens_revoke_) {
        std::printf("revoked credential %s of tenant %s: the manager refuses it from now on\n",
                    str(out, "id").c_str(), str(out, "tenant").c_str());
    } else if (cmd == &tokens_create_) {
        std::string what = "credential " + str(out, "id") + " for tenant " + str(out, "tenant") +
                           (flag(out, "operator") ? " (operator)" : "");
        if (!token_output_.empty()) {
            std::printf(
                "%s written to %s (mode 600); use it with --credential %s or VCUDA_CREDENTIAL_FILE=%s\n",
                what.c_str(), token_output_.c_str(), token_output_.c_str(), token_output_.c_str());
        } else {
            std::printf("%s\n", str(out, "credential").c_str());
            std::fprintf(
                stderr,
                "%s: shown only this once (the manager keeps only its hash); store it in a file with "
                "mode 600 and use it with --credential FILE or VCUDA_CREDENTIAL\n",
                what.c_str());
        }
    }
    return 0;
}

}  // namespace vcuda::cli
