#include "mgmt/daemon/server.hpp"

#include <flatbuffers/flatbuffers.h>

#include "common/log.hpp"
#include "common/wire.hpp"

namespace vcuda::mgmt {

namespace {

constexpr size_t max_connections = 4096;
constexpr auto idle_timeout = std::chrono::minutes(10);  // a connection silent this long is closed

frame_limits mgmt_limits() {
    frame_limits l;
    l.max_meta = 1u << 20;  // JSON bodies are small; a megabyte is generous
    l.max_payload = 0;      // the manager protocol has no bulk payload
    return l;
}

}  // namespace

mgmt_server::mgmt_server(service& svc, std::chrono::milliseconds tick_every)
    : svc_(svc), tick_every_(tick_every) {}

mgmt_server::~mgmt_server() { stop(); }

result<void, std::string> mgmt_server::listen(const std::vector<endpoint>& endpoints,
                                              const std::shared_ptr<const tls_context>& tls) {
    std::vector<std::unique_ptr<listener>> bound;
    for (auto& ep : endpoints) {
        auto l = listener::listen(ep);
        if (!l)
            return unexpected{
                "cannot listen on " + ep.to_string() + ": " + l.error().message +
                " (is another vcuda-mgmt already running there? pick another --listen address)"};
        if (ep.type == endpoint::kind::tcp) l->set_tls(tls);
        bound.push_back(std::make_unique<listener>(std::move(*l)));
    }
    for (auto& l : bound) listeners_.push_back(std::move(l));
    return {};
}

std::vector<endpoint> mgmt_server::local_endpoints() const {
    std::vector<endpoint> out;
    for (auto& l : listeners_) out.push_back(l->local());
    return out;
}

void mgmt_server::start() {
    if (started_) return;
    started_ = true;
    for (auto& l : listeners_) threads_.emplace_back([this, lp = l.get()] { accept_loop(*lp); });
    threads_.emplace_back([this] {
        std::unique_lock lock(stop_mutex_);
        while (!stopping_) {
            lock.unlock();
            svc_.tick();
            reap();
            lock.lock();
            stop_cv_.wait_for(lock, tick_every_, [this] { return stopping_.load(); });
        }
    });
}

void mgmt_server::stop() {
    {
        std::lock_guard lock(stop_mutex_);
        if (stopping_.exchange(true)) return;
    }
    stop_cv_.notify_all();
    for (auto& l : listeners_) l->close();
    for (auto& t : threads_)
        if (t.joinable()) t.join();
    std::lock_guard lock(conns_mutex_);
    for (auto& c : conns_) c.stream->shutdown();
    for (auto& c : conns_)
        if (c.thread.joinable()) c.thread.join();
    conns_.clear();
}

void mgmt_server::reap() {
    std::list<connection> finished;
    {
        std::lock_guard lock(conns_mutex_);
        for (auto it = conns_.begin(); it != conns_.end();) {
            auto next = std::next(it);
            if (it->done) finished.splice(finished.end(), conns_, it);
            it = next;
        }
    }
    for (auto& c : finished)
        if (c.thread.joinable()) c.thread.join();
}

void mgmt_server::accept_loop(listener& l) {
    while (!stopping_) {
        auto s = l.accept();
        if (!s) {
            if (s.error().code == transport_errc::closed) return;
            VCUDA_LOG_WARN("accept on {}: {}", l.local().to_string(), s.error().message);
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
            continue;
        }
        std::lock_guard lock(conns_mutex_);
        if (stopping_) return;
        if (conns_.size() >= max_connections) {
            VCUDA_LOG_WARN("refusing {}: {} connections open", s->peer_description(), conns_.size());
            continue;  // the stream closes as it goes out of scope
        }
        auto& c = conns_.emplace_back();
        c.stream = std::make_unique<frame_stream>(std::move(*s), mgmt_limits());
        c.tls = l.tls();
        c.thread = std::thread([this, &c] {
            serve(c);
            c.done = true;
        });
    }
}

void mgmt_server::serve(connection& c) {
    auto& fs = *c.stream;
    std::string peer = fs.raw().peer_description();
    VCUDA_LOG_DEBUG("connection from {}", peer);
    if (c.tls)
        if (auto t = accept_tls(fs, *c.tls, after(std::chrono::seconds(10))); !t) {
            VCUDA_LOG_WARN("{}: connection refused: {}", peer, t.error().message);
            fs.shutdown();
            return;
        }
    while (!stopping_) {
        auto f = fs.receive(after(std::chrono::duration_cast<std::chrono::milliseconds>(idle_timeout)),
                            std::chrono::seconds(10));
        if (!f) {
            if (f.error().code == transport_errc::protocol) {
                VCUDA_LOG_WARN("{}: bad frame: {}", peer, f.error().message);
                send_wire_error(fs, wire_errc::verify_failed, f.error().message);
            }
            break;
        }
        if (f->kind() != frame_kind::mgmt_request) {
            send_wire_error(
                fs, wire_errc::unexpected_kind,
                "this is vcuda-mgmt, the manager: it only answers mgmt_request frames (clients connect "
                "to a vcuda-server for CUDA calls)",
                f->header.sequence);
            break;
        }
        auto* req = root_of<wire::MgmtRequest>(*f);
        std::string method = req->method() ? req->method()->str() : std::string();
        std::string_view body = req->body() ? req->body()->string_view() : std::string_view("{}");
        std::string_view auth = req->auth() ? req->auth()->string_view() : std::string_view();
        VCUDA_LOG_DEBUG("{}: {} {}", peer, method, body);  // (never the auth field: it is a secret)
        service_reply r = svc_.handle(method, body, auth);

        flatbuffers::FlatBufferBuilder b(256 + r.body.size() + r.error.size());
        auto body_off = b.CreateString(r.body);
        auto err_off = r.error.empty() ? flatbuffers::Offset<flatbuffers::String>() : b.CreateString(r.error);
        b.Finish(wire::CreateMgmtReply(b, r.ok, body_off, err_off));
        if (auto s = fs.send(make_frame(frame_kind::mgmt_reply, b, f->header.sequence),
                             after(std::chrono::seconds(10)));
            !s)
            break;
    }
    fs.shutdown();
    VCUDA_LOG_DEBUG("connection from {} closed", peer);
}

}  // namespace vcuda::mgmt
