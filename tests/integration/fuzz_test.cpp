// Issue 17, point 10: a socket-level fuzzer against a vcuda-server on the software driver. For a bounded time
// it sends malformed traffic over a Unix socket or TCP (random bytes, headers that lie about lengths, kinds
// and versions, truncated frames, mutated replays of a recorded legitimate session, moved sessions' states as
// another server sends them, mutated) while a legitimate
// session beside it runs a fixed workload that must see no error. At the end the server must be alive, serve
// a new session, and hold about the threads, descriptors and memory it held at the start.
//
// VCUDA_FUZZ_SECONDS: how long each transport is fuzzed (default 30: about a minute in CI).
// VCUDA_FUZZ_SEED: the seed (default: drawn, and printed at the start, so that a failure can be replayed).
#include <catch2/catch.hpp>

#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>

#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <random>
#include <string>
#include <thread>

#include "common/handle_kind.hpp"
#include "common/wire.hpp"
#include "raw_client.hpp"

using namespace vcuda;
using namespace vcuda::test;
using namespace std::chrono_literals;

namespace {

using bytes = std::vector<std::byte>;

long proc_status(int pid, const std::string& key) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/status");
    for (std::string line; std::getline(in, line);)
        if (line.rfind(key, 0) == 0) return std::strtol(line.c_str() + key.size(), nullptr, 10);
    return -1;
}

long fd_count(int pid) {
    DIR* d = opendir(("/proc/" + std::to_string(pid) + "/fd").c_str());
    if (!d) return -1;
    long n = 0;
    while (dirent* e = readdir(d))
        if (e->d_name[0] != '.') ++n;
    closedir(d);
    return n;
}

bool alive(int pid) {
    int st = 0;
    return waitpid(pid, &st, WNOHANG) == 0;
}

uint64_t env_number(const char* name, uint64_t fallback) {
    const char* v = std::getenv(name);
    return v && *v ? std::strtoull(v, nullptr, 0) : fallback;
}

bytes pattern(size_t n, uint32_t seed) {
    bytes v(n);
    for (size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((i * 131 + seed) & 0xff);
    return v;
}

// The legitimate tenant's fixed workload, one round: alloc, copy in, memset part of it, copy out, compare,
// free. Returns what went wrong, or an empty string.
std::string legitimate_round(raw_client& c, uint32_t round) {
    const size_t n = 64u << 10;
    auto a = c.call(op::mem_alloc, {n});
    if (a.result != CUDA_SUCCESS || a.outs.size() != 1)
        return "mem_alloc: " + std::to_string(a.result) + " " + a.detail;
    uint64_t p = a.outs[0];
    auto data = pattern(n, round);
    if (auto r = c.call(op::copy_htod, {p, 0}, {}, data); r.result != CUDA_SUCCESS)
        return "copy_htod: " + std::to_string(r.result) + " " + r.detail;
    // memset(p + 4096, 0x5a, 1 byte elements, 1024 of them) as in isolation_test: {ptr, value, size, width,
    // height, pitch, stream}.
    if (auto r = c.call(op::memset, {p + 4096, 0x5a, 1, 1024, 1, 1024, 0}); r.result != CUDA_SUCCESS)
        return "memset: " + std::to_string(r.result) + " " + r.detail;
    std::fill(data.begin() + 4096, data.begin() + 4096 + 1024, std::byte{0x5a});
    auto back = c.call(op::copy_dtoh, {p, n, 0});
    if (back.result != CUDA_SUCCESS) return "copy_dtoh: " + std::to_string(back.result) + " " + back.detail;
    if (back.payload != data) return "copy_dtoh returned other bytes than were written";
    if (auto r = c.call(op::mem_free, {p}); r.result != CUDA_SUCCESS)
        return "mem_free: " + std::to_string(r.result) + " " + r.detail;
    return {};
}

// A short legitimate session, recorded frame by frame: what the fuzzer mutates and replays.
std::vector<bytes> record_session(const std::string& address) {
    std::vector<bytes> frames;
    auto c = raw_client::open(address);
    REQUIRE(c);
    c->record(&frames);
    auto a = c->call(op::mem_alloc, {4096});
    REQUIRE(a.result == CUDA_SUCCESS);
    uint64_t p = a.outs.at(0);
    auto s = c->call(op::cuStreamCreate, {0});
    REQUIRE(s.result == CUDA_SUCCESS);
    uint64_t stream = s.outs.at(0);
    CHECK(c->call(op::copy_htod, {p, stream}, {}, pattern(4096, 3)).result == CUDA_SUCCESS);
    CHECK(c->call(op::memset, {p, 7, 1, 256, 1, 256, stream}).result == CUDA_SUCCESS);
    CHECK(c->send_queued(op::memset, {p + 256, 9, 1, 256, 1, 256, stream}));
    CHECK(c->call(op::cuStreamSynchronize, {stream}).result == CUDA_SUCCESS);
    CHECK(c->call(op::copy_dtoh, {p, 4096, stream}).result == CUDA_SUCCESS);
    CHECK(c->call(op::copy_dtod, {p, p + 2048, 1024, 0}).result == CUDA_SUCCESS);
    CHECK(c->call(op::mem_get_info, {}).result == CUDA_SUCCESS);
    CHECK(c->call(op::session_info, {}).result == CUDA_SUCCESS);
    CHECK(c->call(op::cuStreamDestroy_v2, {stream}).result == CUDA_SUCCESS);
    CHECK(c->call(op::mem_free, {p}).result == CUDA_SUCCESS);
    c->record(nullptr);
    REQUIRE(frames.size() >= 10);
    return frames;
}

class fuzzer {
  public:
    fuzzer(std::string address, std::vector<bytes> recorded, uint64_t seed)
        : address_(std::move(address)), recorded_(std::move(recorded)), rng_(seed) {}

    // One connection's worth of malformed traffic.
    void once() {
        switch (pick(9)) {
            case 0:
                return garbage_before_hello();
            case 1:
                return lying_header_before_hello();
            case 2:
                return mutated_hello();
            case 3:
                return mutated_moved_state();
            default:
                return mutated_session();
        }
    }
    uint64_t connections = 0, frames = 0;

  private:
    uint64_t pick(uint64_t n) { return n ? rng_() % n : 0; }
    bool coin() { return rng_() & 1; }

    // An interesting 64-bit value: small, a boundary, or random.
    uint64_t interesting() {
        static const uint64_t values[] = {0,          1,          2,          7,          255,
                                          4096,       65535,      1u << 20,   0x7fffffff, 0xffffffff,
                                          1ull << 32, 1ull << 40, 1ull << 63, ~0ull,      ~0ull - 1};
        if (coin()) return values[pick(std::size(values))];
        return rng_() >> pick(64);
    }

    std::optional<stream> connect() {
        auto ep = endpoint::parse(address_);
        if (!ep) return std::nullopt;
        auto s = stream::connect(*ep, 5s);
        if (!s) return std::nullopt;
        ++connections;
        return std::move(*s);
    }

    static void send(stream& s, const bytes& b) {
        if (b.empty()) return;
        iovec iov{const_cast<std::byte*>(b.data()), b.size()};
        (void)s.write_all({&iov, 1}, after(500ms));
    }

    // Reads whatever the server answers for a short while (so that it gets to process the frames), then
    // the caller closes.
    static void drain(stream& s, std::chrono::milliseconds for_how_long) {
        auto until = after(for_how_long);
        std::byte buf[4096];
        while (clock::now() < *until) {
            size_t n = std::min<size_t>(sizeof buf, s.buffered() ? s.buffered() : 1);
            if (!s.read_exact(buf, n, until)) return;
        }
    }

    bytes random_bytes(size_t n) {
        bytes b(n);
        for (auto& x : b) x = static_cast<std::byte>(rng_());
        return b;
    }

    frame_header random_header() {
        frame_header h{};
        h.magic = pick(8) ? frame_magic : static_cast<uint32_t>(rng_());
        h.version = pick(8) ? protocol_version : static_cast<uint16_t>(rng_());
        h.kind = pick(4) ? static_cast<uint16_t>(pick(frame_kind_max + 2)) : static_cast<uint16_t>(rng_());
        h.flags = pick(4) ? 0 : static_cast<uint32_t>(interesting());
        h.lane = pick(4) ? 0 : static_cast<uint32_t>(interesting());
        h.sequence = interesting();
        h.meta_len = pick(2) ? static_cast<uint32_t>(pick(512)) : static_cast<uint32_t>(interesting());
        h.reserved = pick(8) ? 0 : static_cast<uint32_t>(rng_());
        h.payload_len = pick(2) ? pick(4096) : interesting();
        return h;
    }

    bytes hello_bytes(uint64_t session_id = 0, const std::string& key = {}) {
        flatbuffers::FlatBufferBuilder b;
        auto k = key.empty() ? 0 : b.CreateVector(reinterpret_cast<const uint8_t*>(key.data()), key.size());
        auto t = b.CreateString("");
        auto host = b.CreateString("fuzz");
        wire::HelloBuilder hb(b);
        hb.add_protocol_version(pick(8) ? protocol_version : static_cast<uint16_t>(rng_()));
        hb.add_features(pick(4) ? features::all : interesting());
        hb.add_token(t);
        hb.add_session_id(session_id);
        hb.add_client_pid(static_cast<uint32_t>(getpid()));
        hb.add_client_host(host);
        hb.add_bulk_set(pick(4) ? 0 : static_cast<uint32_t>(interesting()));
        hb.add_session_key(k);
        b.Finish(hb.Finish());
        return frame_bytes(make_frame(frame_kind::hello, b));
    }

    void mutate(bytes& b) {
        if (b.empty()) return;
        switch (pick(6)) {
            case 0:  // flip bits
                for (uint64_t i = 0, n = 1 + pick(8); i < n; ++i)
                    b[pick(b.size())] ^= static_cast<std::byte>(1u << pick(8));
                break;
            case 1:  // overwrite bytes
                for (uint64_t i = 0, n = 1 + pick(16); i < n; ++i)
                    b[pick(b.size())] = static_cast<std::byte>(rng_());
                break;
            case 2:  // a header field lies
                if (b.size() >= frame_header_size) {
                    static const size_t offsets[] = {0, 4, 6, 8, 12, 16, 24, 28, 32};
                    static const size_t widths[] = {4, 2, 2, 4, 4, 8, 4, 4, 8};
                    size_t i = pick(std::size(offsets));
                    uint64_t v = interesting();
                    // A payload length the server accepts (up to 1 GiB) makes it allocate and zero that much
                    // for the frame: kept to 16 MiB here so that the fuzzer does not take a CI machine's
                    // memory.
                    if (offsets[i] == 32 && v > (16u << 20) && v <= (uint64_t{1} << 30)) v &= (16u << 20) - 1;
                    std::memcpy(b.data() + offsets[i], &v, widths[i]);
                }
                break;
            case 3:  // truncated
                b.resize(pick(b.size()));
                break;
            case 4:  // a 64-bit word in the metadata (arguments, handles, pointers, the op) changed
                if (b.size() >= frame_header_size + 8) {
                    size_t at = frame_header_size + pick((b.size() - frame_header_size) / 8) * 8;
                    uint64_t v;
                    std::memcpy(&v, b.data() + at, 8);
                    v = coin() ? v ^ (1ull << pick(64)) : coin() ? v + pick(8192) - 4096 : interesting();
                    std::memcpy(b.data() + at, &v, 8);
                }
                break;
            default:  // bytes appended
                auto extra = random_bytes(pick(64));
                b.insert(b.end(), extra.begin(), extra.end());
        }
    }

    // A structurally valid CALL whose op, arguments, blobs and payload are changed: other arg counts, ops
    // next to real ones, values next to real handles and pointers.
    bytes reshaped_call() {
        static const uint32_t ops[] = {static_cast<uint32_t>(op::mem_alloc),
                                       static_cast<uint32_t>(op::mem_free),
                                       static_cast<uint32_t>(op::copy_htod),
                                       static_cast<uint32_t>(op::copy_dtoh),
                                       static_cast<uint32_t>(op::copy_dtod),
                                       static_cast<uint32_t>(op::memset),
                                       static_cast<uint32_t>(op::mem_get_info),
                                       static_cast<uint32_t>(op::session_info),
                                       static_cast<uint32_t>(op::cuStreamCreate),
                                       static_cast<uint32_t>(op::cuStreamSynchronize),
                                       static_cast<uint32_t>(op::cuStreamDestroy_v2),
                                       static_cast<uint32_t>(op::pool_alloc),
                                       static_cast<uint32_t>(op::pool_free),
                                       static_cast<uint32_t>(op::pool_export_pointer),
                                       static_cast<uint32_t>(op::pool_import_pointer),
                                       static_cast<uint32_t>(op::ipc_export),
                                       static_cast<uint32_t>(op::ipc_open),
                                       static_cast<uint32_t>(op::graph_node_object),
                                       static_cast<uint32_t>(op::graph_kernel_node_params),
                                       static_cast<uint32_t>(op::graph_memset_node_params),
                                       static_cast<uint32_t>(op::graph_find_in_clone),
                                       static_cast<uint32_t>(op::cuGraphNodeSetEnabled),
                                       static_cast<uint32_t>(op::cuGraphNodeGetEnabled),
                                       static_cast<uint32_t>(op::cuGraphExecGetFlags),
                                       static_cast<uint32_t>(op::graph_edge_list),
                                       static_cast<uint32_t>(op::graph_dot_print),
                                       static_cast<uint32_t>(op::mipmapped_array_create),
                                       static_cast<uint32_t>(op::mipmapped_array_destroy),
                                       static_cast<uint32_t>(op::tex_resource_desc),
                                       static_cast<uint32_t>(op::vmm_get_access),
                                       static_cast<uint32_t>(op::vmm_retain),
                                       static_cast<uint32_t>(op::host_register_file),
                                       static_cast<uint32_t>(op::stream_batch_memop),
                                       static_cast<uint32_t>(op::graph_mem_node_params),
                                       static_cast<uint32_t>(op::ctx_event),
                                       static_cast<uint32_t>(op::copy_dtoh_deferred),
                                       static_cast<uint32_t>(op::deferred_collect),
                                       static_cast<uint32_t>(op::deferred_wait),
                                       static_cast<uint32_t>(op::graph_memcpy_node_params),
                                       static_cast<uint32_t>(op::user_object_create),
                                       static_cast<uint32_t>(op::user_object_refs),
                                       static_cast<uint32_t>(op::graph_user_object),
                                       static_cast<uint32_t>(op::device_atomic_caps),
                                       static_cast<uint32_t>(op::peer_access),
                                       static_cast<uint32_t>(op::peer_can_access),
                                       static_cast<uint32_t>(op::occupancy_clusters),
                                       static_cast<uint32_t>(op::launch)};
        uint32_t o =
            pick(3) ? ops[pick(std::size(ops))] : static_cast<uint32_t>(pick(512));  // past the last id
        std::vector<uint64_t> args(pick(9));
        for (auto& a : args) a = pick(3) ? last_out_ + pick(8192) - 4096 : interesting();
        flatbuffers::FlatBufferBuilder b;
        std::vector<flatbuffers::Offset<wire::Blob>> blobs;
        for (uint64_t i = 0, n = pick(4) ? 0 : pick(3); i < n; ++i) {
            auto x = random_bytes(pick(256));
            blobs.push_back(
                wire::CreateBlob(b, b.CreateVector(reinterpret_cast<const uint8_t*>(x.data()), x.size())));
        }
        auto av = b.CreateVector(args);
        auto bv = b.CreateVector(blobs);
        int device = pick(8) ? 0 : static_cast<int>(interesting());
        b.Finish(wire::CreateCall(b, o, device, av, bv, pick(8) ? 0 : static_cast<uint32_t>(pick(4)),
                                  pick(8) ? 0 : interesting()));
        auto payload = pick(2) ? bytes{} : random_bytes(pick(8192));
        auto f =
            make_frame(frame_kind::call, b, ++sequence_, 0, pick(4) ? 0 : frame_flags::no_reply, payload);
        bytes out(frame_header_size + f.meta.size() + payload.size());
        f.header.meta_len = static_cast<uint32_t>(f.meta.size());
        f.header.payload_len = payload.size();
        encode_header(f.header, out.data());
        std::memcpy(out.data() + frame_header_size, f.meta.data(), f.meta.size());
        if (!payload.empty())
            std::memcpy(out.data() + frame_header_size + f.meta.size(), payload.data(), payload.size());
        return out;
    }

    void garbage_before_hello() {
        auto s = connect();
        if (!s) return;
        send(*s, random_bytes(pick(2) ? pick(64) : pick(8192)));
        ++frames;
        drain(*s, 50ms);
    }

    void lying_header_before_hello() {
        auto s = connect();
        if (!s) return;
        bytes b(frame_header_size);
        encode_header(random_header(), b.data());
        auto rest = random_bytes(pick(1024));
        b.insert(b.end(), rest.begin(), rest.end());
        send(*s, b);
        ++frames;
        drain(*s, 50ms);
    }

    void mutated_hello() {
        auto s = connect();
        if (!s) return;
        // Joining a session that does not exist, or opening one with odd fields; sometimes mutated further.
        auto b = hello_bytes(coin() ? 0 : interesting(), coin() ? std::string{} : std::string(pick(64), 'k'));
        if (coin()) mutate(b);
        send(*s, b);
        ++frames;
        drain(*s, 100ms);
    }

    // A real session (a valid HELLO) that then sends recorded frames, some mutated, some reshaped, some cut.
    void mutated_session() {
        auto c = raw_client::open(address_);
        if (!c) return;
        ++connections;
        auto a = c->call(op::mem_alloc, {4096});
        if (a.result == CUDA_SUCCESS && !a.outs.empty()) last_out_ = a.outs[0];
        stream& s = c->stream().raw();
        for (uint64_t i = 0, n = 1 + pick(12); i < n; ++i) {
            bytes b;
            switch (pick(4)) {
                case 0:
                    b = recorded_[pick(recorded_.size())];
                    break;
                case 1:
                    b = reshaped_call();
                    break;
                default:
                    b = recorded_[pick(recorded_.size())];
                    mutate(b);
            }
            // Some frames end the conversation (a cut frame, a lie about the length): the server may close;
            // later sends then fail quietly.
            send(s, b);
            ++frames;
            if (pick(4) == 0) drain(s, 20ms);
        }
        drain(s, 100ms);
    }

    // A frame's bytes: header, then metadata and `payload`.
    static bytes frame_bytes(outgoing_frame f, const bytes& payload = {}) {
        f.header.meta_len = static_cast<uint32_t>(f.meta.size());
        f.header.payload_len = payload.size();
        bytes out(frame_header_size + f.meta.size());
        encode_header(f.header, out.data());
        std::memcpy(out.data() + frame_header_size, f.meta.data(), f.meta.size());
        out.insert(out.end(), payload.begin(), payload.end());
        return out;
    }

    // A moved session's state as another server sends it (server/session_transfer.cpp): handles of several
    // kinds, a 2 MiB mapping in the server's address window (near memory a session was given there) with an
    // allocation in it, a stream and an event, a CUDA array with its contents, and a graph of a memset and an
    // event record node. Its memory follows as two pieces of 1 MiB.
    bytes moved_state(uint64_t id) {
        using namespace vcuda::wire;
        flatbuffers::FlatBufferBuilder b(2048);
        const uint64_t va =
            ((last_out_ ? last_out_ : uint64_t{1} << 40) & ~uint64_t{(2u << 20) - 1}) + (512u << 20);
        const handle_kind kinds[] = {handle_kind::stream, handle_kind::event,      handle_kind::array,
                                     handle_kind::graph,  handle_kind::graph_node, handle_kind::graph_node};
        std::vector<flatbuffers::Offset<MovedSlot>> slots;
        for (uint32_t i = 0; i < std::size(kinds); ++i)
            slots.push_back(CreateMovedSlot(
                b, i, 1, true, static_cast<uint32_t>(kinds[i]), 0,
                kinds[i] == handle_kind::graph_node ? make_handle(handle_kind::graph, 1, 3) : 0,
                kinds[i] == handle_kind::graph_node));
        auto handle = [&](uint32_t i) { return make_handle(kinds[i], 1, i); };
        auto slot_vec = b.CreateVector(slots);
        std::vector<uint64_t> runs{4096, (2u << 20) - 4096};
        auto mapping = CreateMovedMapping(b, va, 2u << 20, false, 4096, b.CreateVector(runs));
        auto allocation = CreateMovedAllocation(b, va, 4096, va);
        auto device =
            CreateMovedDevice(b, true, 0, 0, b.CreateVector(&mapping, 1), b.CreateVector(&allocation, 1));
        auto devices = b.CreateVector(&device, 1);
        std::vector<flatbuffers::Offset<MovedEntry>> entries{
            CreateMovedEntry(b, handle(0), 0, 0, 1, 0),
            CreateMovedEntry(b, handle(1), 0, 0, 0, 0, true, 1.5)};
        auto entry_vec = b.CreateVector(entries);
        CUDA_ARRAY3D_DESCRIPTOR d{};
        d.Width = 16;
        d.Height = 4;
        d.Format = CU_AD_FORMAT_FLOAT;
        d.NumChannels = 1;
        auto contents = pattern(size_t{16} * 4 * 4, 5);
        auto array = CreateMovedArray(
            b, handle(2), 0, 4096, b.CreateVector(reinterpret_cast<const uint8_t*>(&d), sizeof d), 0,
            b.CreateVector(reinterpret_cast<const uint8_t*>(contents.data()), contents.size()));
        auto arrays = b.CreateVector(&array, 1);
        CUDA_MEMSET_NODE_PARAMS m{va, 0, 7, 4, 256, 1};
        std::vector<uint64_t> memset_ids{handle(4)}, record_ids{handle(5)};
        std::vector<flatbuffers::Offset<MovedGraphNode>> nodes{
            CreateMovedGraphNode(b, CU_GRAPH_NODE_TYPE_MEMSET, b.CreateVector(memset_ids), 0, 0, 0,
                                 b.CreateVector(reinterpret_cast<const uint8_t*>(&m), sizeof m)),
            CreateMovedGraphNode(b, CU_GRAPH_NODE_TYPE_EVENT_RECORD, b.CreateVector(record_ids), 0, 0, 0, 0,
                                 0, 0, 0, handle(1))};
        std::vector<uint64_t> edges{0, 1};
        CUgraphEdgeData edge{};
        auto graph = CreateMovedGraph(b, handle(3), 0, 0, 0, b.CreateVector(nodes), b.CreateVector(edges),
                                      b.CreateVector(reinterpret_cast<const uint8_t*>(&edge), sizeof edge));
        auto graphs = b.CreateVector(&graph, 1);
        const std::string key(32, 'f');
        auto k = b.CreateVector(reinterpret_cast<const uint8_t*>(key.data()), key.size());
        SessionStateBuilder sb(b);
        sb.add_session_id(id);
        sb.add_session_key(k);
        sb.add_slots(slot_vec);
        sb.add_devices(devices);
        sb.add_entries(entry_vec);
        sb.add_arrays(arrays);
        sb.add_graphs(graphs);
        sb.add_bytes(2u << 20);
        sb.add_piece_bytes(1u << 20);
        b.Finish(sb.Finish());
        return frame_bytes(make_frame(frame_kind::session_state, b));
    }

  public:
    // As another server moving a session here (HELLO with `adopt`): a state, often mutated, then up to three
    // pieces of its memory, often not what it announced (`valid`: neither, as a real move).
    void mutated_moved_state(bool valid = false) {
        auto s = connect();
        if (!s) return;
        flatbuffers::FlatBufferBuilder hb(256);
        hb.Finish(wire::CreateHello(hb, protocol_version, features::all, hb.CreateString(""), 0, 0,
                                    static_cast<uint32_t>(getpid()), hb.CreateString("fuzz"), 0, 0, 0, 0,
                                    true));
        send(*s, frame_bytes(make_frame(frame_kind::hello, hb)));
        auto state = moved_state(1 + pick(uint64_t{1} << 62));
        if (!valid && coin()) mutate(state);
        send(*s, state);
        frames += 2;
        drain(*s, 20ms);
        // Half the time the two pieces it announced, as announced; else up to three, of other indices and
        // sizes, some mutated.
        const bool as_announced = valid || coin();
        for (uint64_t i = 0, n = as_announced ? 2 : pick(4); i < n; ++i) {
            flatbuffers::FlatBufferBuilder pb(64);
            pb.Finish(wire::CreateStatePiece(pb, as_announced || coin() ? i : interesting()));
            auto piece = frame_bytes(make_frame(frame_kind::state_piece, pb),
                                     as_announced || coin() ? pattern(1u << 20, static_cast<uint32_t>(i))
                                                            : random_bytes(pick(4096)));
            if (!as_announced && pick(4) == 0) mutate(piece);
            send(*s, piece);
            ++frames;
        }
        drain(*s, 100ms);
    }

  private:
    std::string address_;
    std::vector<bytes> recorded_;
    std::mt19937_64 rng_;
    uint64_t last_out_ = 0, sequence_ = 1000;
};

void fuzz_server(server_process::transport t, const char* name) {
    const uint64_t seconds = env_number("VCUDA_FUZZ_SECONDS", 30);
    const uint64_t seed = env_number("VCUDA_FUZZ_SEED", std::random_device{}());
    // Printed before anything else, so that a crash or hang still leaves it in the test's output.
    std::printf("fuzz %s: seed %llu (VCUDA_FUZZ_SEED=%llu replays it), %llu s\n", name,
                static_cast<unsigned long long>(seed), static_cast<unsigned long long>(seed),
                static_cast<unsigned long long>(seconds));
    std::fflush(stdout);
    INFO("seed " << seed << " (" << name << ")");

#if defined(__SANITIZE_ADDRESS__)
    // An ASan build (the asan preset): ASan's quarantine keeps freed memory resident (256 MiB by default),
    // which the RSS check below would read as a leak. A small one, unless the caller chose; the server
    // inherits it.
    setenv("ASAN_OPTIONS", "quarantine_size_mb=4:thread_local_quarantine_size_kb=64", 0);
#endif
    // A quota keeps what a fuzzed mem_alloc may take of the software driver's memory (host RAM) small.
    server_process server({"--memory-quota", "256MiB"}, t);
    REQUIRE(server.pid() > 0);
    auto recorded = record_session(server.address());
    // A session that comes and goes first: what stays after it (the driver's own threads) is the baseline.
    {
        auto warm = raw_client::open(server.address());
        REQUIRE(warm);
        REQUIRE(legitimate_round(*warm, 0).empty());
    }
    std::this_thread::sleep_for(500ms);
    const long threads0 = proc_status(server.pid(), "Threads:"), fds0 = fd_count(server.pid()),
               rss0 = proc_status(server.pid(), "VmRSS:");

    std::atomic<bool> stop{false}, legit_failed{false};
    std::string legit_error;  // written by the legitimate session's thread; read after it is joined
    uint64_t rounds = 0;
    std::thread legit([&] {
        auto c = raw_client::open(server.address());
        if (!c) {
            legit_error = "the legitimate session could not open";
            legit_failed = true;
            return;
        }
        while (!stop.load() && legit_error.empty()) legit_error = legitimate_round(*c, ++rounds);
        legit_failed = !legit_error.empty();
    });

    fuzzer f(server.address(), std::move(recorded), seed);
    f.mutated_moved_state(/*valid=*/true);  // at least one state the server takes, however slow the machine
    auto end = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
    while (std::chrono::steady_clock::now() < end && alive(server.pid()) && !legit_failed) f.once();
    stop = true;
    legit.join();
    std::printf("fuzz %s: %llu connections, %llu frames; legitimate session: %llu rounds\n", name,
                static_cast<unsigned long long>(f.connections), static_cast<unsigned long long>(f.frames),
                static_cast<unsigned long long>(rounds));

    // How far the moved states got: taken (rebuilt) or refused with a reason.
    auto count = [log = server.log()](const std::string& what) {
        size_t n = 0;
        for (size_t at = log.find(what); at != std::string::npos; at = log.find(what, at + 1)) ++n;
        return n;
    };
    const size_t taken = count(") moved here: "), refused = count(" not taken: ");
    std::printf("fuzz %s: moved states taken %zu, refused at or after their rebuild %zu\n", name, taken,
                refused);
    REQUIRE(alive(server.pid()));
    CHECK(taken > 0);  // the state the fuzzer starts from is one a server takes
    INFO("legitimate session: " << legit_error);
    CHECK(legit_error.empty());
    CHECK(rounds > 0);
    // A new session is served.
    auto fresh = raw_client::open(server.address());
    REQUIRE(fresh);
    CHECK(legitimate_round(*fresh, 1).empty());
    fresh.reset();
    // Every fuzzed session ends and gives back what it held (polled: sessions end as their clients go).
    long threads = 0, fds = 0;
    for (int i = 0; i < 150; ++i) {
        threads = proc_status(server.pid(), "Threads:");
        fds = fd_count(server.pid());
        if (threads <= threads0 + 1 && fds <= fds0 + 2) break;
        std::this_thread::sleep_for(100ms);
    }
    long rss = proc_status(server.pid(), "VmRSS:");
    INFO("threads " << threads0 << " -> " << threads << ", fds " << fds0 << " -> " << fds << ", RSS " << rss0
                    << " -> " << rss << " KiB");
    CHECK(threads <= threads0 + 1);
    CHECK(fds <= fds0 + 2);
    CHECK(rss - rss0 < 96L * 1024);
    CHECK(alive(server.pid()));
}

}  // namespace

TEST_CASE("fuzzed traffic on a Unix socket harms neither the server nor a legitimate session beside it",
          "[fuzz]") {
    fuzz_server(server_process::transport::unix_socket, "unix");
}

TEST_CASE("fuzzed traffic over TCP harms neither the server nor a legitimate session beside it", "[fuzz]") {
    fuzz_server(server_process::transport::tcp, "tcp");
}
