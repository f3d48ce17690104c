#include "raw_client.hpp"

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include "common/wire.hpp"

namespace vcuda::test {

std::unique_ptr<raw_client> raw_client::open(const std::string& address, uint64_t session_id,
                                             const std::string& key, std::string* why, uint32_t bulk_set,
                                             const std::string& token) {
    auto ep = endpoint::parse(address);
    if (!ep) return nullptr;
    auto s = stream::connect(*ep, std::chrono::seconds(5));
    if (!s) {
        if (why) *why = s.error().message;
        return nullptr;
    }
    std::unique_ptr<raw_client> c(new raw_client(frame_stream(std::move(*s))));
    flatbuffers::FlatBufferBuilder b;
    auto k = key.empty() ? 0 : b.CreateVector(reinterpret_cast<const uint8_t*>(key.data()), key.size());
    auto t = b.CreateString(token);
    auto host = b.CreateString("test");
    wire::HelloBuilder hb(b);
    hb.add_protocol_version(protocol_version);
    hb.add_features(features::all | features::bulk);
    hb.add_token(t);
    hb.add_session_id(session_id);
    hb.add_client_pid(static_cast<uint32_t>(getpid()));
    hb.add_client_host(host);
    hb.add_bulk_set(bulk_set);
    hb.add_session_key(k);
    // A key of 8 bytes is an older server's 64-bit secret (key() below): it goes in the retired field 4 too,
    // so that tests can run against a server built before the key (VCUDA_TEST_SERVER_BIN) and fail for what
    // they test, not for the join. Today's servers ignore that field and refuse a key that short.
    if (key.size() == sizeof(uint64_t)) {
        uint64_t legacy;
        std::memcpy(&legacy, key.data(), sizeof legacy);
        hb.fbb_.AddElement<uint64_t>(4 + 2 * 4, legacy, 0);
    }
    b.Finish(hb.Finish());
    if (!c->fs_.send(make_frame(frame_kind::hello, b))) return nullptr;
    auto in = c->fs_.receive(after(std::chrono::seconds(5)));
    if (!in) {
        if (why) *why = in.error().message;
        return nullptr;
    }
    if (in->kind() == frame_kind::error) {
        if (why) *why = root_of<wire::Error>(*in)->message()->str();
        return nullptr;
    }
    auto* r = root_of<wire::HelloReply>(*in);
    c->session_ = r->session_id();
    if (r->session_key())
        c->key_.assign(reinterpret_cast<const char*>(r->session_key()->data()), r->session_key()->size());
    c->memory_quota_ = r->memory_quota();
    c->legacy_secret_ = reinterpret_cast<const flatbuffers::Table*>(r)->GetField<uint64_t>(4 + 2 * 3, 0);
    if (c->key_.empty() && c->legacy_secret_)
        c->key_.assign(reinterpret_cast<const char*>(&c->legacy_secret_), 8);
    c->features_ = r->features();
    c->bulk_streams_ = r->bulk_streams();
    return c;
}

raw_reply raw_client::call(op o, std::vector<uint64_t> args, std::vector<std::vector<std::byte>> blobs,
                           std::vector<std::byte> payload, int device) {
    flatbuffers::FlatBufferBuilder b;
    std::vector<flatbuffers::Offset<wire::Blob>> bo;
    for (auto& x : blobs)
        bo.push_back(
            wire::CreateBlob(b, b.CreateVector(reinterpret_cast<const uint8_t*>(x.data()), x.size())));
    auto a = b.CreateVector(args);
    auto bv = b.CreateVector(bo);
    b.Finish(wire::CreateCall(b, static_cast<uint32_t>(o), device, a, bv));
    if (!send_frame(make_frame(frame_kind::call, b, ++sequence_, 0, 0, payload))) {
        raw_reply r;
        r.connection_ok = false;
        return r;
    }
    return receive_reply();
}

raw_reply raw_client::call_with_fd(op o, std::vector<uint64_t> args, int fd, int device) {
    flatbuffers::FlatBufferBuilder b;
    auto a = b.CreateVector(args);
    b.Finish(wire::CreateCall(b, static_cast<uint32_t>(o), device, a));
    if (!fs_.send(make_frame(frame_kind::call, b, ++sequence_, 0, 0), never, fd)) {
        raw_reply r;
        r.connection_ok = false;
        return r;
    }
    return receive_reply();
}

bool raw_client::send_call(op o, std::vector<uint64_t> args, int device) {
    return send_args(o, args, device, 0);
}

bool raw_client::send_queued(op o, std::vector<uint64_t> args, int device) {
    return send_args(o, args, device, frame_flags::no_reply);
}

bool raw_client::send_args(op o, const std::vector<uint64_t>& args, int device, uint32_t flags) {
    flatbuffers::FlatBufferBuilder b;
    auto a = b.CreateVector(args);
    b.Finish(wire::CreateCall(b, static_cast<uint32_t>(o), device, a));
    return send_frame(make_frame(frame_kind::call, b, ++sequence_, 0, flags));
}
bool raw_client::send_frame(const outgoing_frame& f) {
    if (record_) {
        std::vector<std::byte> bytes(frame_header_size + f.meta.size() + f.payload.size());
        frame_header h = f.header;
        h.meta_len = static_cast<uint32_t>(f.meta.size());
        h.payload_len = f.payload.size();
        encode_header(h, bytes.data());
        std::memcpy(bytes.data() + frame_header_size, f.meta.data(), f.meta.size());
        if (!f.payload.empty())
            std::memcpy(bytes.data() + frame_header_size + f.meta.size(), f.payload.data(), f.payload.size());
        record_->push_back(std::move(bytes));
    }
    return fs_.send(f).has_value();
}

raw_reply raw_client::receive_reply() {
    raw_reply r;
    auto in = fs_.receive(after(std::chrono::seconds(20)));
    if (!in || in->kind() != frame_kind::reply) {
        r.connection_ok = false;
        r.detail =
            !in ? "no reply: " + in.error().message
                : "a frame of kind " + std::to_string(static_cast<int>(in->kind())) + " instead of a reply";
        return r;
    }
    auto* rep = root_of<wire::Reply>(*in);
    r.result = rep->result();
    if (rep->outs()) r.outs.assign(rep->outs()->begin(), rep->outs()->end());
    if (rep->blobs())
        for (const auto* b : *rep->blobs()) {
            auto* bytes = b && b->bytes() ? reinterpret_cast<const std::byte*>(b->bytes()->data()) : nullptr;
            r.blobs.emplace_back(bytes, bytes ? bytes + b->bytes()->size() : bytes);
        }
    if (rep->detail()) r.detail = rep->detail()->str();
    r.payload = std::move(in->payload);
    return r;
}

bool raw_client::send_chunk(uint64_t transfer, uint64_t offset, const std::vector<std::byte>& bytes) {
    flatbuffers::FlatBufferBuilder b;
    auto a = b.CreateVector(std::vector<uint64_t>{transfer, offset});
    b.Finish(wire::CreateCall(b, static_cast<uint32_t>(op::bulk_chunk), -1, a));
    return fs_.send(make_frame(frame_kind::call, b, ++sequence_, 0, frame_flags::no_reply, bytes))
        .has_value();
}

bool raw_client::receive_chunk(uint64_t& transfer, uint64_t& offset, std::vector<std::byte>& bytes) {
    auto in = fs_.receive(after(std::chrono::seconds(20)));
    if (!in || in->kind() != frame_kind::call) return false;
    auto* c = root_of<wire::Call>(*in);
    if (c->op() != static_cast<uint32_t>(op::bulk_chunk) || !c->args() || c->args()->size() != 2)
        return false;
    transfer = c->args()->Get(0);
    offset = c->args()->Get(1);
    bytes = std::move(in->payload);
    return true;
}

raw_reply raw_client::call(uint32_t raw_op, std::vector<uint64_t> args, int device) {
    return call(static_cast<op>(raw_op), std::move(args), {}, {}, device);
}

bool raw_client::send_raw(const std::vector<std::byte>& bytes) {
    iovec iov{const_cast<std::byte*>(bytes.data()), bytes.size()};
    return fs_.raw().write_all({&iov, 1}).has_value();
}

bool raw_client::closed_by_peer() {
    // Whatever the server said last (an ERROR frame) is drained; then the connection must end.
    auto until = after(std::chrono::seconds(5));
    for (int i = 0; i < (1 << 16); ++i) {
        std::byte b;
        auto r = fs_.raw().read_exact(&b, 1, until);
        if (!r)
            return r.error().code == transport_errc::peer_lost || r.error().code == transport_errc::closed;
    }
    return false;
}

server_process::server_process(std::vector<std::string> extra, transport t, int max_fds, std::string listen) {
    char tmpl[] = "/tmp/vcuda-it-XXXXXX";
    dir_ = mkdtemp(tmpl);
    address_ = !listen.empty() ? listen : t == transport::tcp ? "127.0.0.1:0" : "unix:" + dir_ + "/s.sock";
    // VCUDA_TEST_SERVER_BIN: another server binary (an older build, to see a test fail on the code it fixes).
    const char* bin = std::getenv("VCUDA_TEST_SERVER_BIN");
    // VCUDA_TEST_DRIVER: the driver the server loads instead of the software one (measurements on a GPU).
    const char* drv = std::getenv("VCUDA_TEST_DRIVER");
    std::vector<std::string> args = {
        bin && *bin ? bin : VCUDA_SERVER_BIN, "--listen",    address_, "--driver",
        drv && *drv ? drv : VCUDA_SOFTDRIVER, "--log-level", "debug"};
    args.insert(args.end(), extra.begin(), extra.end());
    pid_ = fork();
    if (pid_ == 0) {
        std::string log = dir_ + "/server.log";
        freopen(log.c_str(), "w", stderr);
        if (max_fds > 0) {
            rlimit rl{rlim_t(max_fds), rlim_t(max_fds)};
            setrlimit(RLIMIT_NOFILE, &rl);
        }
        std::vector<char*> argv;
        for (auto& a : args) argv.push_back(a.data());
        argv.push_back(nullptr);
        execv(argv[0], argv.data());
        _exit(127);
    }
    if (t == transport::tcp) {
        // The port the system chose, from the line the server logs when it listens.
        std::smatch m;
        static const std::regex serving(R"(serving \d+ GPU\(s\) on ([0-9.]+:\d+))");
        for (int i = 0; i < 500; ++i) {
            if (int st = 0; waitpid(pid_, &st, WNOHANG) == pid_) {  // it refused to start
                exit_status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
                pid_ = -1;
                break;
            }
            std::string text = log();
            if (std::regex_search(text, m, serving)) {
                address_ = m[1];
                break;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        return;
    }
    // Until the server says it serves there: its socket file exists from the bind on, but connections are
    // refused until it listens, after loading the driver (a loaded machine took seconds in between).
    for (int i = 0; i < 500; ++i) {
        if (int st = 0; waitpid(pid_, &st, WNOHANG) == pid_) {  // it refused to start
            exit_status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
            pid_ = -1;
            return;
        }
        if (log().find(" on " + address_ + " (") != std::string::npos) return;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
}

bool server_process::wait_for_log(const std::string& text, int seconds) const {
    for (int i = 0; i < seconds * 50; ++i) {
        if (log().find(text) != std::string::npos) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
}

int server_process::wait_exit(int seconds) {
    if (pid_ < 0) return exit_status_;
    for (int i = 0; i < seconds * 50; ++i) {
        int status = 0;
        if (waitpid(pid_, &status, WNOHANG) == pid_) {
            pid_ = -1;
            return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return -1;
}

server_process::~server_process() {
    if (pid_ > 0) {
        kill(pid_, SIGTERM);
        waitpid(pid_, nullptr, 0);
    }
}

std::string server_process::log() const {
    std::ifstream in(dir_ + "/server.log");
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

}  // namespace vcuda::test
