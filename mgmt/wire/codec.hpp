// JSON encodings of the manager protocol's messages (mgmt/wire/types.hpp), with nlohmann-json.
// Decoding is lenient about missing fields (they keep their defaults) and strict about types: a field of the
// wrong type throws nlohmann::json::exception, so callers decode inside decode() below, which never throws.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "common/result.hpp"
#include "mgmt/wire/types.hpp"

namespace vcuda::mgmt {

NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(lease_hints, same_host, model, exclusive)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(lease_request, client_host, pid, gpus, memory_per_gpu, hints)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(device_grant, server_endpoints, host, gpu_index, uuid, name,
                                                memory_quota, token)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(lease_grant, lease_id, expires_at, ttl_ms, devices)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(gpu_description, index, uuid, name, memory, sms,
                                                driver_version)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(server_registration, host, endpoints, gpus, address_window,
                                                address_window_auto)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(gpu_load, uuid, utilization, memory_used, sessions)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(session_report, session_id, lease_id, gpu_uuid, client,
                                                memory_used, suspended, idle_ms, suspend_seq, resume_seq,
                                                note, move_seq, moved_to)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(heartbeat, server_id, gpus, sessions, address_window)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(active_lease, lease_id, uuid, memory_quota, expires_at,
                                                suspend_seq, resume_seq, suspend_asked_at, resume_asked_at,
                                                move_seq, move_asked_at, move_to_uuid, move_to_endpoints,
                                                move_token)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(heartbeat_reply, leases, heartbeat_interval_ms)

// Parses `text` as a JSON object and decodes it into T; the error says which field was wrong.
template <class T>
result<T, std::string> decode(std::string_view text) {
    auto j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded()) return unexpected{std::string("body is not valid JSON")};
    if (!j.is_object()) return unexpected{std::string("body is not a JSON object")};
    try {
        return j.get<T>();
    } catch (const nlohmann::json::exception& e) {
        return unexpected{std::string("body has a field of the wrong type: ") + e.what()};
    }
}

template <class T>
std::string encode(const T& value) {
    return nlohmann::json(value).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace vcuda::mgmt
