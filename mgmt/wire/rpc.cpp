#include "mgmt/wire/rpc.hpp"

#include <flatbuffers/flatbuffers.h>

#include <nlohmann/json.hpp>

#include "common/wire.hpp"

namespace vcuda::mgmt {

namespace {

rpc_error from_transport(const transport_error& e, rpc_errc kind) {
    return rpc_error{kind, std::string(to_string(e.code)), e.message};
}

}  // namespace

mgmt_connection::~mgmt_connection() {
    if (stream_) stream_->shutdown();
}

result<mgmt_connection, rpc_error> mgmt_connection::connect(const endpoint& manager,
                                                            std::chrono::milliseconds timeout) {
    auto s = stream::connect(manager, timeout);
    if (!s) return unexpected{from_transport(s.error(), rpc_errc::unreachable)};
    mgmt_connection c;
    c.peer_ = manager;
    c.stream_ = std::make_unique<frame_stream>(std::move(*s));
    return c;
}

result<std::string, rpc_error> mgmt_connection::call(std::string_view method, std::string_view body,
                                                     std::chrono::milliseconds timeout,
                                                     std::string_view auth) {
    if (!stream_) return unexpected{rpc_error{rpc_errc::transport, "closed", "not connected"}};
    flatbuffers::FlatBufferBuilder b(256 + body.size() + auth.size());
    auto m = b.CreateString(method.data(), method.size());
    auto bd = b.CreateString(body.data(), body.size());
    auto au =
        auth.empty() ? flatbuffers::Offset<flatbuffers::String>() : b.CreateString(auth.data(), auth.size());
    b.Finish(wire::CreateMgmtRequest(b, m, bd, au));
    uint64_t seq = next_sequence_++;
    auto until = after(timeout);
    if (auto r = stream_->send(make_frame(frame_kind::mgmt_request, b, seq), until); !r) {
        stream_->shutdown();
        return unexpected{from_transport(r.error(), rpc_errc::transport)};
    }
    auto f = stream_->receive(until, timeout);
    if (!f) {
        stream_->shutdown();
        return unexpected{from_transport(f.error(), rpc_errc::transport)};
    }
    if (f->kind() == frame_kind::error) {
        auto* e = root_of<wire::Error>(*f);
        stream_->shutdown();
        return unexpected{rpc_error{rpc_errc::bad_reply, "wire_error",
                                    e && e->message() ? e->message()->str() : std::string("protocol error")}};
    }
    if (f->kind() != frame_kind::mgmt_reply || f->header.sequence != seq) {
        stream_->shutdown();
        return unexpected{rpc_error{rpc_errc::bad_reply, "bad_reply",
                                    "the peer answered with a " + std::string(to_string(f->kind())) +
                                        " frame; is this address a vcuda-mgmt (not a vcuda-server)?"}};
    }
    auto* reply = root_of<wire::MgmtReply>(*f);
    if (!reply->ok()) {
        rpc_error e{rpc_errc::remote, "error",
                    reply->error() ? reply->error()->str() : std::string("request refused")};
        if (reply->body()) {
            auto j = nlohmann::json::parse(reply->body()->str(), nullptr, false);
            if (j.is_object() && j.contains("code") && j["code"].is_string())
                e.code = j["code"].get<std::string>();
        }
        return unexpected{std::move(e)};
    }
    return reply->body() ? reply->body()->str() : std::string("{}");
}

result<std::string, rpc_error> mgmt_call(const endpoint& manager, std::string_view method,
                                         std::string_view body, std::chrono::milliseconds timeout,
                                         std::string_view auth) {
    auto c = mgmt_connection::connect(manager, timeout);
    if (!c) return unexpected{c.error()};
    return c->call(method, body, timeout, auth);
}

std::string describe(const rpc_error& e, const endpoint& manager) {
    std::string at = manager.to_string();
    switch (e.kind) {
        case rpc_errc::unreachable:
            if (e.code ==
                to_string(transport_errc::protocol))  // it answered, but TLS failed: the message says why
                return "cannot open a connection to the manager at " + at + ": " + e.message;
            return "cannot reach the manager at " + at + " (" + e.message +
                   "): is vcuda-mgmt running there? Start it with `vcuda-mgmt --listen " + at +
                   " --db /var/lib/vcuda/mgmt.db --secret-file /etc/vcuda/secret`, or point --manager / "
                   "VCUDA_MANAGER at the right address.";
        case rpc_errc::transport:
            return "lost the connection to the manager at " + at + " (" + e.message +
                   "); check that vcuda-mgmt is still running and try again.";
        case rpc_errc::bad_reply:
            return "the program at " + at + " did not answer as a vcuda manager: " + e.message;
        case rpc_errc::remote:
            return e.message;
    }
    return e.message;
}

}  // namespace vcuda::mgmt
