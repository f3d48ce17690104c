// A session moved to another vcuda-server process: the gate closed and the state saved as for a suspend
// (server/session_image.cpp), then sent — handle table, memory layout and contents, modules' images, globals,
// functions, streams, events, context settings, each lane's progress — to a server that rebuilds it under the
// same id, key, handle ids and device addresses. The protocol is in protocol/vcuda.fbs (SessionState). The
// client learns where its session went from the next reply of each lane (Reply.moved_to) and joins it there.
//
// What does not move yet: what a suspend does not rebuild (shareable or size-limited pools the application
// made, links in progress, green contexts).
// CUDA graphs move as a suspend keeps them, unless --no-suspend-graphs (server/graph_image.cpp). Shared
// pinned host memory moves only to a server on the same host (its pages' memfds are passed over the Unix
// socket and mapped at the same addresses there).
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <filesystem>
#include <thread>

#include "common/log.hpp"
#include "common/wire.hpp"
#include "server/session.hpp"
#include "server/session_image.hpp"

namespace vcuda::server {

namespace {

constexpr uint64_t piece_bytes = 64u << 20;  // also the grain at which pre-copied memory is found changed
constexpr uint64_t max_image_words = uint64_t{1} << 29;  // 4 GiB of module images

std::string mib(uint64_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }

// --test-precopy-hold-until: a test's program creates the file once it has changed its memory.
void hold_until_exists(const std::string& path) {
    auto until = std::chrono::steady_clock::now() + std::chrono::minutes(1);
    std::error_code ec;
    while (!std::filesystem::exists(path, ec))
        if (std::chrono::steady_clock::now() > until) {
            VCUDA_LOG_WARN("--test-precopy-hold-until: {} did not appear in 60 s: the move goes on", path);
            return;
        } else {
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
}

template <class T>
std::span<const std::byte> bytes_of(const std::vector<T>& v) {
    return {reinterpret_cast<const std::byte*>(v.data()), v.size() * sizeof(T)};
}

}  // namespace

// Reads a session's device memory piece by piece into pinned host buffers (two slots, so that one piece can
// be read while the one before is digested and sent), through a stream of its own in each context
// (non-blocking: the application's work on the legacy stream does not hold it up). The owner holds the
// session's `mu` around read() while the application runs, so that no mapping goes while it is read, and when
// it destroys the reader.
class session::piece_reader {
  public:
    piece_reader(session& s, size_t piece) : s_(s), piece_(piece) {
        void* p = ::mmap(nullptr, 2 * piece_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p != MAP_FAILED) buf_ = static_cast<std::byte*>(p);
    }
    ~piece_reader() {  // with the session's `mu` held
        auto& d = s_.api();
        for (auto& [device, st] : streams_) {
            if (device >= s_.devices_.size() || s_.devices_[device].ctx != st.first)
                continue;  // gone with it
            d.cuCtxSetCurrent(st.first);
            d.cuStreamSynchronize(st.second);
            d.cuStreamDestroy_v2(st.second);
        }
        if (pinned_ctx_) {
            for (auto& dev : s_.devices_)
                if (dev.ctx == pinned_ctx_) {
                    d.cuCtxSetCurrent(pinned_ctx_);
                    d.cuMemHostUnregister(buf_);
                }
        }
        d.cuCtxSetCurrent(nullptr);
        if (buf_) ::munmap(buf_, 2 * piece_);
    }
    piece_reader(const piece_reader&) = delete;
    piece_reader& operator=(const piece_reader&) = delete;

    // Starts reading `n` bytes at `va` of device `device` into slot `slot` (0 or 1).
    CUresult issue(int slot, size_t device, CUdeviceptr va, size_t n) {
        auto& d = s_.api();
        if (!buf_ || n > piece_) return CUDA_ERROR_OUT_OF_MEMORY;
        CUcontext ctx = device < s_.devices_.size() ? s_.devices_[device].ctx : nullptr;
        if (!ctx) return CUDA_ERROR_INVALID_CONTEXT;
        d.cuCtxSetCurrent(ctx);
        if (!pinned_ctx_ && !pin_failed_) {
            // Portable, so that every context of the session copies into it at the bus's speed.
            if (d.cuMemHostRegister_v2 &&
                d.cuMemHostRegister_v2(buf_, 2 * piece_, CU_MEMHOSTREGISTER_PORTABLE) == CUDA_SUCCESS)
                pinned_ctx_ = ctx;
            else
                pin_failed_ = true;
        }
        auto& st = streams_[device];
        if (st.first != ctx) {
            st = {ctx, nullptr};
            if (CUresult rc = d.cuStreamCreate(&st.second, CU_STREAM_NON_BLOCKING); rc != CUDA_SUCCESS)
                return rc;
        }
        slot_stream_[slot] = st.second;
        return d.cuMemcpyDtoHAsync_v2(buf_ + slot * piece_, va, n, st.second);
    }
    // Waits for slot `slot`'s read; its bytes.
    CUresult wait(int slot, const std::byte*& out) {
        if (CUresult rc = s_.api().cuStreamSynchronize(slot_stream_[slot]); rc != CUDA_SUCCESS) return rc;
        out = buf_ + slot * piece_;
        return CUDA_SUCCESS;
    }
    CUresult read(size_t device, CUdeviceptr va, size_t n, const std::byte*& out) {
        if (CUresult rc = issue(0, device, va, n); rc != CUDA_SUCCESS) return rc;
        return wait(0, out);
    }

  private:
    session& s_;
    size_t piece_;
    std::byte* buf_ = nullptr;
    CUcontext pinned_ctx_ = nullptr;
    bool pin_failed_ = false;
    std::map<size_t, std::pair<CUcontext, CUstream>> streams_;  // device -> (its context then, the stream)
    std::array<CUstream, 2> slot_stream_{};
};

CUresult session::move_to(const move_target& to, std::chrono::milliseconds wait, std::string& why) {
    if (moving_.exchange(true)) {
        why = "a move of this session is under way";
        return CUDA_ERROR_NOT_READY;
    }
    struct moving_done {
        std::atomic<bool>& flag;
        ~moving_done() { flag.store(false); }
    } done{moving_};
    std::unique_lock lock(gate_mu_);
    if (moved_.load()) {
        why = "the session has moved already";
        return CUDA_ERROR_NOT_READY;
    }
    CUresult rc = CUDA_SUCCESS;
    {
        std::lock_guard l(mu);
        if (!host.regions_.empty() && to.where.type != endpoint::kind::unix_socket) {
            why =
                "the session shares pinned host memory with its client on this host, so it moves only to "
                "a server on this host (a Unix socket address)";
            rc = CUDA_ERROR_NOT_SUPPORTED;
        }
        for (auto& [addr, r] : host.regions_)
            if (r.fd < 0 && rc == CUDA_SUCCESS) {
                why = r.file
                          ? "the client registered pages of a shared file of its own (e.g. NCCL's /dev/shm "
                            "segments), which a move does not carry yet (a suspend keeps them)"
                          : "a shared pinned host region lost its pages' descriptor";
                rc = CUDA_ERROR_NOT_SUPPORTED;
            }
        // Graphs move as a suspend keeps them (server/graph_image.cpp), unless the server was told not to.
        handles.for_each([&](uint64_t, handle_entry& e) {
            if ((e.kind == handle_kind::graph || e.kind == handle_kind::graph_exec) && rc == CUDA_SUCCESS &&
                !keeps_graphs()) {
                why =
                    "the session holds CUDA graphs, which a move does not carry: vcuda-server runs with "
                    "--no-suspend-graphs";
                rc = CUDA_ERROR_NOT_SUPPORTED;
            }
        });
        {
            // Driver objects of this process, whose destructors the client runs: nothing to make them again
            // from.
            std::lock_guard objects(user_objects_mu);
            if (!user_objects.empty() && rc == CUDA_SUCCESS) {
                why =
                    "the session holds CUDA user objects, which a move does not carry (a suspend keeps them)";
                rc = CUDA_ERROR_NOT_SUPPORTED;
            }
        }
        // The program's own VMM reservations move only from the address window: the driver's addresses may
        // be taken in the other server.
        for (auto& [va, r] : vmm.reserved_)
            if (!r.windowed && rc == CUDA_SUCCESS) {
                why = "the program reserved " + mib(r.size) +
                      " of addresses (cuMemAddressReserve) outside the server's address window (it had no "
                      "room, "
                      "or the server has none), which another server may not have free";
                rc = CUDA_ERROR_NOT_SUPPORTED;
            }
    }
    if (rc != CUDA_SUCCESS) {
        VCUDA_LOG_WARN("session {} not moved to {}: {}", id_, to.address, why);
        return rc;
    }
    // To a server on this host the physical memory itself is handed over when it is on the same GPU (the
    // target checks, and refuses with CUDA_ERROR_PEER_ACCESS_UNSUPPORTED when not: then it is copied).
    // Elsewhere it is pre-copied: sent while the application runs, then only what changed while paused.
    using mode = server_options::move_memory_mode;
    const bool unix_target = to.where.type == endpoint::kind::unix_socket;
    const bool by_descriptor = opts_.move_memory == mode::share && unix_target;
    const bool precopy =
        opts_.move_memory == mode::precopy || (opts_.move_memory == mode::share && !unix_target);
    // What the pause would copy: the program's VMM allocations (not pre-copied) unless handed over, and with
    // stop-and-copy the device memory. Past --move-copy-limit the session stays: its client waits only so
    // long for a lane it opens meanwhile.
    uint64_t paused_copy = 0;
    {
        std::lock_guard l(mu);
        for (auto& [id, a] : vmm.allocations_)
            if (!a.foreign && !(by_descriptor && a.exportable)) paused_copy += a.size;
        if (opts_.move_memory == mode::copy)
            for (auto& s : devices_) paused_copy += s.memory->mapped();
    }
    if (paused_copy > opts_.move_copy_limit) {
        why =
            "it would copy " + mib(paused_copy) + " while paused (" +
            (opts_.move_memory == mode::copy ? "stop-and-copy" : "its own VMM allocations, not pre-copied") +
            "), more than --move-copy-limit " + mib(opts_.move_copy_limit);
        VCUDA_LOG_WARN("session {} not moved to {}: {}", id_, to.address, why);
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    auto link = open_move_link(to, why);
    if (!link) {
        VCUDA_LOG_WARN("session {} not moved to {}: {}", id_, to.address, why);
        return CUDA_ERROR_NOT_READY;
    }
    precopy_record record;
    const bool precopied = precopy && !suspended_.load();
    if (precopied) {
        lock.unlock();  // the gate stays open: the application runs meanwhile
        auto p0 = std::chrono::steady_clock::now();
        if (rc = precopy_memory(*link, to, record, why); rc != CUDA_SUCCESS) {
            VCUDA_LOG_WARN("session {} not moved to {}: {}", id_, to.address, why);
            return rc;
        }
        VCUDA_LOG_INFO(
            "session {}: {} pre-copied to {} in {} ms while it ran", id_, mib(record.bytes), to.address,
            std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - p0)
                .count());
        if (opts_.test_precopy_hold.count()) std::this_thread::sleep_for(opts_.test_precopy_hold);
        if (!opts_.test_precopy_hold_until.empty()) hold_until_exists(opts_.test_precopy_hold_until);
        lock.lock();
    }
    if (rc = close_gate(lock, wait, why); rc != CUDA_SUCCESS) return rc;
    lock.unlock();
    auto t0 = std::chrono::steady_clock::now();
    // Pre-copied, the memory stays on the GPU until the target has it all: send_state reads it there.
    const bool streamed = precopied && !suspended_.load();
    if (!suspended_.load())
        rc = save_and_release(why, streamed        ? device_memory::save_mode::none
                                   : by_descriptor ? device_memory::save_mode::descriptor
                                                   : device_memory::save_mode::copy);
    if (rc == CUDA_SUCCESS) rc = send_state(std::move(link), to, precopied ? &record : nullptr, why);
    if (rc == CUDA_ERROR_PEER_ACCESS_UNSUPPORTED && image_->handed_over) {
        VCUDA_LOG_INFO("session {}: {}; its memory is copied instead", id_, why);
        why.clear();
        rc = rebuild(why);
        if (rc == CUDA_SUCCESS) rc = save_and_release(why, device_memory::save_mode::copy);
        if (rc == CUDA_SUCCESS) {
            link = open_move_link(to, why);
            rc = link ? send_state(std::move(link), to, nullptr, why) : CUDA_ERROR_NOT_READY;
        }
    }
    if (streamed) {
        std::lock_guard l(mu);
        if (rc == CUDA_SUCCESS) {  // the target has it all: the GPU state goes here, as after a suspend
            release_gpu_state();
            suspended_.store(true);
            epoch_.fetch_add(1);
        } else {
            image_.reset();  // nothing was released: the session goes on here as it was
        }
    }
    const uint64_t bytes = rc == CUDA_SUCCESS ? image_->bytes : 0;
    const uint64_t handed_over = rc == CUDA_SUCCESS ? image_->handed_over : 0;
    const auto paused = std::chrono::steady_clock::now() - t0;
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(paused).count();
    lock.lock();
    if (rc == CUDA_SUCCESS) {
        counters.migrations.add(paused);
        moved_to_ = to.address;
        moved_.store(true);
        std::string how;
        if (handed_over) how = " (" + mib(handed_over) + " of it handed over on the same GPU)";
        if (precopied)
            how = " (" + mib(record.bytes) + " pre-copied while it ran, " + mib(unchanged_bytes_) +
                  " of it unchanged when paused)";
        size_t graphs = 0;  // the application's graphs and executable graphs (not children)
        for (auto& g : image_->graphs) graphs += g.id || g.exec ? 1 : 0;
        if (graphs) how += " with " + std::to_string(graphs) + " CUDA graphs";
        note_ = "moved to " + to.address + ": " + mib(bytes) + " of GPU state" + how + ", paused " +
                std::to_string(ms) + " ms";
        std::lock_guard l(mu);
        image_.reset();
        for (auto& d : devices_) d.memory->keep_addresses();
        for (auto& [va, r] : vmm.reserved_)
            if (r.windowed) window()->keep(va, r.size);
        VCUDA_LOG_INFO("session {} {}", id_, note_);
    } else {
        note_ = "not moved: " + why;
        VCUDA_LOG_WARN("session {} not moved to {}: {}{}", id_, to.address, why,
                       suspended_.load() ? " (it stays suspended here: its next call rebuilds it)" : "");
    }
    closed_.store(false);
    gate_cv_.notify_all();
    lock.unlock();
    if (rc == CUDA_SUCCESS) {
        // Nothing runs here any more: striped copies and host-function waits end, and their lanes learn
        // where the session went at their next call.
        bulk_->close("the session moved to " + to.address);
        stop_host_funcs();
    }
    return rc;
}

std::unique_ptr<frame_stream> session::open_move_link(const move_target& to, std::string& why) {
    auto s = stream::connect(to.where, std::chrono::seconds(10));
    if (!s) {
        why = "cannot connect to " + to.address + ": " + s.error().message;
        return nullptr;
    }
    auto fs = std::make_unique<frame_stream>(std::move(*s));
    flatbuffers::FlatBufferBuilder hb(256);
    char host_name[256] = {};
    gethostname(host_name, sizeof host_name - 1);
    hb.Finish(wire::CreateHello(hb, protocol_version, features::all, hb.CreateString(to.token), 0, 0,
                                static_cast<uint32_t>(getpid()), hb.CreateString(host_name), 0, handles.tag(),
                                0, 0, true));
    if (auto r = fs->send(make_frame(frame_kind::hello, hb), after(std::chrono::seconds(10))); !r) {
        why = "cannot send the session to " + to.address + ": " + r.error().message;
        return nullptr;
    }
    return fs;
}

CUresult session::precopy_memory(frame_stream& fs, const move_target& to, precopy_record& record,
                                 std::string& why) {
    output_for_client printed(*this);  // its copies may flush what the application's kernels printed
    record.piece_bytes = piece_bytes;
    struct piece {
        size_t device;
        CUdeviceptr va;
        size_t size;
    };
    std::vector<piece> maps;
    {
        std::lock_guard lock(mu);
        for (size_t i = 0; i < devices_.size(); ++i)
            if (devices_[i].ctx)
                for (auto& m : devices_[i].memory->mappings_to_move()) maps.push_back({i, m.va, m.size});
    }
    auto reader = std::make_unique<piece_reader>(*this, piece_bytes);
    struct drop_reader {
        session& s;
        std::unique_ptr<piece_reader>& r;
        ~drop_reader() {
            std::lock_guard lock(s.mu);
            r.reset();
        }
    } drop{*this, reader};
    for (auto& m : maps) {
        auto& rec = record.mappings[m.va];
        rec.size = m.size;
        rec.pieces.resize((m.size + piece_bytes - 1) / piece_bytes);
        for (uint64_t off = 0; off < m.size; off += piece_bytes) {
            const size_t n = std::min<uint64_t>(piece_bytes, m.size - off);
            const std::byte* bytes = nullptr;
            {
                // The mapping must stay while it is read: allocations and frees wait for `mu`.
                std::lock_guard lock(mu);
                if (suspended_.load() || !devices_[m.device].memory->has_mapping(m.va, m.size)) break;
                if (reader->read(m.device, m.va + off, n, bytes) != CUDA_SUCCESS) break;  // sent when paused
            }
            const piece_digest digest = digest_piece(bytes, n, off);
            flatbuffers::FlatBufferBuilder pb(96);
            pb.Finish(wire::CreateStatePiece(pb, 0, true, m.va, m.size, off));
            if (auto r = fs.send(make_frame(frame_kind::state_piece, pb, 0, 0, 0, {bytes, n}), never); !r) {
                why = "pre-copying to " + to.address + " failed: " + r.error().message;
                return CUDA_ERROR_NOT_READY;
            }
            rec.pieces[off / piece_bytes] = std::make_unique<piece_digest>(digest);
            record.bytes += n;
        }
    }
    return CUDA_SUCCESS;
}

CUresult session::send_state(std::unique_ptr<frame_stream> link, const move_target& to,
                             const precopy_record* record, std::string& why) {
    output_for_client printed(*this);  // reading memory left on the GPU may flush kernels' printf
    std::lock_guard lock(mu);
    unchanged_bytes_ = 0;
    auto& img = *image_;
    flatbuffers::FlatBufferBuilder b(1u << 16);
    // Handle slots, each as it is: ids keep their values there.
    std::vector<flatbuffers::Offset<wire::MovedSlot>> slots;
    for (auto& x : handles.export_slots()) {
        std::vector<uint32_t> layout;
        if (x.entry.layout)
            for (auto [off, size] : x.entry.layout->params) {
                layout.push_back(off);
                layout.push_back(size);
            }
        slots.push_back(
            wire::CreateMovedSlot(b, x.index, x.generation, x.live, static_cast<uint32_t>(x.entry.kind),
                                  x.entry.device, x.entry.owner, x.entry.owned, x.entry.made_by,
                                  b.CreateVector(x.entry.made_with.data(), x.entry.made_with.size()),
                                  x.entry.layout ? b.CreateVector(layout) : 0));
    }
    auto free_slots = b.CreateVector(handles.free_slots());
    // Modules' images: their parts follow as pieces, in this order.
    std::vector<const std::vector<uint64_t>*> pieces_words;
    std::vector<flatbuffers::Offset<wire::MovedOrigin>> origins_out;
    origins.for_each([&](uint64_t handle, const module_origins::origin& o) {
        std::vector<uint64_t> words;
        for (auto& part : *o.parts) {
            words.push_back(part.size());
            pieces_words.push_back(&part);
        }
        origins_out.push_back(wire::CreateMovedOrigin(
            b, handle, o.library, o.format,
            b.CreateVector(reinterpret_cast<const uint8_t*>(o.jit_options.data()), o.jit_options.size()),
            b.CreateVector(words), o.charge, o.device));
    });
    // Memory: the layout here, the contents as pieces after the images.
    std::vector<flatbuffers::Offset<wire::MovedDevice>> devices_out;
    for (size_t i = 0; i < devices_.size(); ++i) {
        auto& mem = *devices_[i].memory;
        const auto& ds = img.devices[i];
        std::vector<flatbuffers::Offset<wire::MovedMapping>> maps;
        auto moved = mem.mappings_to_move();
        if (moved.size() != ds.memory.size()) {
            why = "its memory changed while it was saved";
            return CUDA_ERROR_ILLEGAL_STATE;
        }
        for (size_t k = 0; k < moved.size(); ++k) {
            auto& m = moved[k];
            std::vector<uint64_t> runs;
            for (auto [off, len] : m.free_runs) {
                runs.push_back(off);
                runs.push_back(len);
            }
            maps.push_back(wire::CreateMovedMapping(b, m.va, m.size, m.shared, m.live, b.CreateVector(runs),
                                                    ds.memory[k].fd() >= 0));
        }
        CUuuid uuid{};
        api().cuDeviceGetUuid_v2(&uuid, devices_[i].device);
        std::vector<flatbuffers::Offset<wire::MovedAllocation>> allocs;
        for (auto& [start, a] : mem.allocations())
            allocs.push_back(wire::CreateMovedAllocation(b, start, a.first, a.second));
        std::vector<uint64_t> limits;
        for (auto [l, v] : ds.limits) {
            limits.push_back(static_cast<uint64_t>(l));
            limits.push_back(v);
        }
        devices_out.push_back(wire::CreateMovedDevice(
            b, ds.had_context, b.CreateVector(limits), static_cast<int32_t>(ds.cache_config),
            b.CreateVector(maps), b.CreateVector(allocs), mem.heap_charge(),
            b.CreateVector(reinterpret_cast<const uint8_t*>(uuid.bytes), sizeof uuid.bytes)));
    }
    std::vector<flatbuffers::Offset<wire::MovedEntry>> entries;
    for (auto& es : img.entries) {
        std::vector<int32_t> attrs;
        for (auto [a, v] : es.attributes) {
            attrs.push_back(a);
            attrs.push_back(v);
        }
        std::vector<flatbuffers::Offset<wire::MovedStreamAttribute>> stream_attrs;
        for (auto& [a, v] : es.stream_attributes)
            stream_attrs.push_back(wire::CreateMovedStreamAttribute(b, a, struct_vector(b, v)));
        entries.push_back(wire::CreateMovedEntry(b, es.id, b.CreateString(es.name), b.CreateVector(attrs),
                                                 es.flags, es.priority, es.recorded, es.age_ms,
                                                 b.CreateVector(stream_attrs), es.release_threshold));
    }
    std::vector<flatbuffers::Offset<wire::MovedGlobal>> globals_out;
    for (auto& g : img.globals)
        globals_out.push_back(wire::CreateMovedGlobal(
            b, g.address, g.size, g.device, g.owner, b.CreateString(g.name),
            b.CreateVector(reinterpret_cast<const uint8_t*>(g.bytes.data()), g.bytes.size()), g.managed));
    std::vector<uint64_t> progress;
    std::vector<uint32_t> gone;
    {
        std::lock_guard p(progress_mu_);
        for (auto [lane, seq] : progress_) {
            progress.push_back(lane);
            progress.push_back(seq);
        }
        gone.assign(gone_lanes_.begin(), gone_lanes_.end());
    }
    std::vector<uint64_t> regions;
    std::vector<int> region_fds;
    for (auto& [addr, r] : host.regions_) {
        regions.push_back(addr);
        regions.push_back(r.size);
        region_fds.push_back(r.fd);
    }
    std::vector<uint64_t> relocated;
    for (auto& [from, r] : globals.relocations())
        relocated.insert(relocated.end(), {from, r.to, r.size, r.owner});
    // The program's own VMM use; device locations as the session's indices (a move keeps them).
    auto session_index = [&](int real) {
        const int i = session_device(real);
        return i < 0 ? real : i;
    };
    std::vector<uint64_t> vmm_reservations, vmm_mappings;
    for (auto& [va, r] : vmm.reserved_) vmm_reservations.insert(vmm_reservations.end(), {va, r.size});
    for (auto& [va, m] : vmm.mapped_)
        vmm_mappings.insert(vmm_mappings.end(), {va, m.size, m.handle, m.offset});
    std::vector<flatbuffers::Offset<wire::MovedVmmAllocation>> vmm_allocations;
    for (auto& a : img.vmm_allocations) {
        CUmemAllocationProp prop = a.prop;
        if (prop.location.type == CU_MEM_LOCATION_TYPE_DEVICE) prop.location.id = static_cast<int>(a.device);
        vmm_allocations.push_back(
            wire::CreateMovedVmmAllocation(b, a.id, a.size, static_cast<uint32_t>(a.device),
                                           struct_vector(b, prop), a.released, a.refs, a.fd() >= 0));
    }
    std::vector<flatbuffers::Offset<wire::MovedVmmAccess>> vmm_access;
    for (auto& x : img.vmm_access) {
        auto desc = x.access;
        for (auto& dsc : desc) dsc.location.id = session_index(dsc.location.id);
        vmm_access.push_back(
            wire::CreateMovedVmmAccess(b, x.va,
                                       b.CreateVector(reinterpret_cast<const uint8_t*>(desc.data()),
                                                      desc.size() * sizeof(CUmemAccessDesc))));
    }
    std::vector<flatbuffers::Offset<wire::MovedArray>> arrays_out;
    for (auto& a : img.arrays) {
        const auto& t = arrays.arrays.at(a.id);
        arrays_out.push_back(wire::CreateMovedArray(
            b, a.id, static_cast<uint32_t>(t.device), t.bytes, struct_vector(b, t.desc),
            b.CreateVector(a.levels),
            b.CreateVector(reinterpret_cast<const uint8_t*>(a.bytes.data()), a.bytes.size())));
    }
    const flatbuffers::Offset<flatbuffers::Vector<uint8_t>> absent;
    std::vector<flatbuffers::Offset<wire::MovedObject>> objects_out;
    for (auto& [key, o] : arrays.objects)
        objects_out.push_back(wire::CreateMovedObject(
            b, static_cast<uint32_t>(key.first), key.second, o.surface, struct_vector(b, o.res),
            struct_vector(b, o.made), o.surface ? absent : struct_vector(b, o.tex),
            o.has_view ? struct_vector(b, o.view) : absent));
    std::vector<flatbuffers::Offset<wire::MovedDeferredCopy>> deferred_out;
    for (auto& c : deferred.landed_copies())
        deferred_out.push_back(wire::CreateMovedDeferredCopy(
            b, c.ticket, static_cast<int32_t>(c.status),
            b.CreateVector(reinterpret_cast<const uint8_t*>(c.bytes.data()), c.bytes.size())));
    std::vector<uint64_t> pool_allocs, pool_alloc_pools;
    for (auto& [p, a] : pools.allocations_)
        if (a.windowed) {
            pool_allocs.insert(pool_allocs.end(), {p, a.size, a.device});
            pool_alloc_pools.push_back(a.made_pool);
        }
    std::vector<uint32_t> gpus;
    for (size_t i = 0; i < devices_.size(); ++i)
        if (devices_[i].allowed) gpus.push_back(static_cast<uint32_t>(i));
    auto key = b.CreateVector(reinterpret_cast<const uint8_t*>(key_.data()), key_.size());
    b.Finish(wire::CreateSessionState(
        b, id_, key, handles.tag(), b.CreateString(peer_), b.CreateVector(slots), free_slots,
        b.CreateVector(devices_out), b.CreateVector(entries), b.CreateVector(globals_out),
        b.CreateVector(origins_out), b.CreateVector(progress), img.bytes, piece_bytes,
        b.CreateVector(regions), b.CreateVector(gone), b.CreateVector(relocated),
        b.CreateVector(vmm_reservations), b.CreateVector(vmm_allocations), b.CreateVector(vmm_mappings),
        b.CreateVector(vmm_access), b.CreateVector(gpus), b.CreateVector(arrays_out),
        b.CreateVector(deferred_out), b.CreateVector(objects_out), moved_graphs(b, img),
        b.CreateVector(pool_allocs), b.CreateVector(pool_alloc_pools)));
    if (b.GetSize() > max_moved_state_bytes) {
        why = "its description (" + mib(b.GetSize()) + ") is larger than a server accepts";
        return CUDA_ERROR_NOT_SUPPORTED;
    }

    frame_stream& fs = *link;
    // A receiver that refuses the session answers and closes while pieces are still coming: its answer says
    // why, better than the broken write.
    auto failed_send = [&](const transport_error& e) {
        why = "sending the session to " + to.address + " failed: " + e.message;
        if (auto answer = fs.receive(after(std::chrono::seconds(2)), std::chrono::seconds(2));
            answer && answer->kind() == frame_kind::reply) {
            auto* r = root_of<wire::Reply>(*answer);
            if (r->result() != CUDA_SUCCESS)
                why = to.address + " could not take the session: " + (r->detail() ? r->detail()->str() : "?");
        }
        return CUDA_ERROR_NOT_READY;
    };
    if (auto r = fs.send(make_frame(frame_kind::session_state, b)); !r) return failed_send(r.error());
    // The receiver's answer to the state (below), then, when it takes it, to the pieces.
    auto answer_to = [&](const char* what, std::chrono::seconds wait) -> CUresult {
        auto answer = fs.receive(after(wait), wait);
        if (!answer) {
            why = to.address + " did not answer the " + what + ": " + answer.error().message;
            return CUDA_ERROR_NOT_READY;
        }
        if (answer->kind() == frame_kind::error) {
            auto* e = root_of<wire::Error>(*answer);
            why = to.address + " refused the session: " + (e->message() ? e->message()->str() : "?");
            return CUDA_ERROR_NOT_READY;
        }
        if (answer->kind() != frame_kind::reply) {
            why = to.address + " answered the " + what + " with a " + std::string(to_string(answer->kind())) +
                  " frame";
            return CUDA_ERROR_NOT_READY;
        }
        auto* r = root_of<wire::Reply>(*answer);
        if (r->result() != CUDA_SUCCESS) {
            why = to.address + " could not take the session: " + (r->detail() ? r->detail()->str() : "?");
            return static_cast<CUresult>(r->result());
        }
        return CUDA_SUCCESS;
    };
    if (CUresult rc = answer_to("session's state", std::chrono::seconds(60)); rc != CUDA_SUCCESS) return rc;
    uint64_t index = 0;
    auto send_piece = [&](std::span<const std::byte> bytes, int fd = -1, bool unchanged = false) {
        flatbuffers::FlatBufferBuilder pb(64);
        pb.Finish(wire::CreateStatePiece(pb, index++, false, 0, 0, 0, unchanged));
        return fs.send(make_frame(frame_kind::state_piece, pb, 0, 0, 0, bytes), never, fd);
    };
    // Memory still on the GPU (a pre-copied move) is read piece by piece; the GPU is idle, the gate closed.
    std::unique_ptr<piece_reader> reader;
    for (auto* words : pieces_words)
        if (auto r = send_piece(bytes_of(*words)); !r) return failed_send(r.error());
    for (int fd : region_fds)
        if (auto r = send_piece({}, fd); !r) return failed_send(r.error());
    // The memory pieces in order: a mapping handed over is one piece with its descriptor.
    struct memory_piece {
        size_t device;
        const device_memory::saved_mapping* m;
        size_t off, n;
    };
    std::vector<memory_piece> memory_pieces;
    for (size_t i = 0; i < img.devices.size(); ++i)
        for (auto& m : img.devices[i].memory) {
            if (m.fd() >= 0) {
                memory_pieces.push_back({i, &m, 0, 0});
                continue;
            }
            for (size_t off = 0; off < m.size; off += piece_bytes)
                memory_pieces.push_back({i, &m, off, std::min<size_t>(piece_bytes, m.size - off)});
        }
    auto on_gpu = [&](size_t k) {
        return k < memory_pieces.size() && memory_pieces[k].n && !memory_pieces[k].m->bytes;
    };
    auto read_failed = [&](CUresult rc) {
        why = "its memory could not be read (" + error_text(rc) + ")";
        return rc;
    };
    size_t issued = memory_pieces.size();  // the piece read ahead into the reader's other slot
    for (size_t k = 0; k < memory_pieces.size(); ++k) {
        const auto& p = memory_pieces[k];
        if (!p.n) {
            if (auto r = send_piece({}, p.m->fd()); !r) return failed_send(r.error());
            continue;
        }
        const std::byte* bytes = p.m->bytes ? p.m->bytes.get() + p.off : nullptr;
        if (!bytes) {  // read from the GPU: this piece was started before (or is now), the next one starts
            const int slot = static_cast<int>(k % 2);
            if (!reader) reader = std::make_unique<piece_reader>(*this, piece_bytes);
            if (issued != k)
                if (CUresult rc = reader->issue(slot, p.device, p.m->va + p.off, p.n); rc != CUDA_SUCCESS)
                    return read_failed(rc);
            if (CUresult rc = reader->wait(slot, bytes); rc != CUDA_SUCCESS) return read_failed(rc);
            if (on_gpu(k + 1)) {
                const auto& next = memory_pieces[k + 1];
                if (CUresult rc = reader->issue(1 - slot, next.device, next.m->va + next.off, next.n);
                    rc != CUDA_SUCCESS)
                    return read_failed(rc);
                issued = k + 1;
            }
        }
        // What the receiver has from the pre-copy, unchanged since, goes without its bytes.
        const piece_digest* before = record ? record->find(p.m->va, p.m->size, p.off) : nullptr;
        const bool unchanged = before && *before == digest_piece(bytes, p.n, p.off);
        if (auto r = unchanged ? send_piece({}, -1, true) : send_piece({bytes, p.n}); !r)
            return failed_send(r.error());
        if (unchanged) unchanged_bytes_ += p.n;
    }
    reader.reset();  // `mu` held, as it wants
    // The program's physical allocations (VMM), copied out by the save, or handed over as one piece with its
    // descriptor.
    for (auto& a : img.vmm_allocations)
        if (a.fd() >= 0) {
            if (auto r = send_piece({}, a.fd()); !r) return failed_send(r.error());
        } else
            for (size_t off = 0; off < a.size; off += piece_bytes)
                if (auto r = send_piece({a.bytes.get() + off, std::min<size_t>(piece_bytes, a.size - off)});
                    !r)
                    return failed_send(r.error());
    // The receiver rebuilds before it answers: a minute, and a second for every GiB it copies back.
    if (CUresult rc = answer_to("move", std::chrono::seconds(60 + (img.bytes >> 30))); rc != CUDA_SUCCESS)
        return rc;
    moved_link_ = std::move(link);
    return CUDA_SUCCESS;
}

CUresult session::check_handed_over_gpu(const wire::SessionState& st, size_t i, const char* what,
                                        std::string& why) {
    const auto* devs = st.devices();
    const auto* uuid =
        devs && i < devs->size() ? devs->Get(static_cast<flatbuffers::uoffset_t>(i))->gpu_uuid() : nullptr;
    CUuuid here{};
    api().cuDeviceGetUuid_v2(&here, devices_[i].device);
    if (uuid && uuid->size() == sizeof here.bytes &&
        std::memcmp(uuid->data(), here.bytes, sizeof here.bytes) == 0)
        return CUDA_SUCCESS;
    why = std::string("its ") + what + " was offered on GPU " + std::to_string(i) +
          " as the physical memory of another GPU than this server's";
    return CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
}

CUresult session::take_moved_state(const wire::SessionState& st, frame_stream& fs, precopy_store& pre,
                                   std::string& why) {
    auto img = std::make_unique<session_image>();
    std::vector<std::shared_ptr<std::vector<std::vector<uint64_t>>>> origin_parts;
    std::map<uint64_t, std::vector<uint64_t>> precopied;  // mapping -> offsets of its pieces pre-copied here
    {
        std::lock_guard lock(mu);
        auto bad = [&](const std::string& what) {
            why = "the moved session's state is malformed: " + what;
            return CUDA_ERROR_INVALID_VALUE;
        };
        std::vector<handle_table::exported_slot> slots;
        if (st.slots())
            for (const auto* x : *st.slots()) {
                handle_table::exported_slot e;
                e.index = x->index();
                e.generation = x->generation();
                e.live = x->live();
                if (x->kind() >= handle_kind_count)
                    return bad("a handle of kind " + std::to_string(x->kind()));
                e.entry.kind = static_cast<handle_kind>(x->kind());
                e.entry.device = x->device();
                e.entry.owner = x->owner();
                e.entry.owned = x->owned();
                e.entry.made_by = x->made_by();
                if (x->made_with())
                    for (size_t i = 0; i < std::min<size_t>(x->made_with()->size(), 2); ++i)
                        e.entry.made_with[i] = x->made_with()->Get(static_cast<flatbuffers::uoffset_t>(i));
                if (const auto* l = x->layout()) {
                    if (l->size() % 2) return bad("a parameter layout");
                    auto layout = std::make_shared<param_layout>();
                    for (flatbuffers::uoffset_t i = 0; i < l->size(); i += 2)
                        layout->params.emplace_back(l->Get(i), l->Get(i + 1));
                    e.entry.layout = std::move(layout);
                }
                if (e.live && (e.entry.device < 0 || static_cast<size_t>(e.entry.device) >= devices_.size()))
                    return bad("a handle on GPU " + std::to_string(e.entry.device));
                slots.push_back(std::move(e));
            }
        std::vector<uint32_t> free;
        if (st.free_slots()) free.assign(st.free_slots()->begin(), st.free_slots()->end());
        handles.set_tag(st.handle_tag());
        if (!handles.import(std::move(slots), std::move(free))) return bad("its handle table");

        const size_t moved_devices = st.devices() ? st.devices()->size() : 0;
        if (moved_devices > devices_.size()) {
            why = "it uses " + std::to_string(moved_devices) + " GPUs; this server has " +
                  std::to_string(devices_.size());
            return CUDA_ERROR_INVALID_DEVICE;
        }
        img->devices.resize(devices_.size());
        for (size_t i = 0; i < moved_devices; ++i) {
            const auto* d = st.devices()->Get(static_cast<flatbuffers::uoffset_t>(i));
            auto& ds = img->devices[i];
            ds.had_context = d->had_context();
            const bool holds = d->mappings() && d->mappings()->size();
            if ((ds.had_context || holds) && !allowed(i)) {
                why = "its GPU " + std::to_string(i) + " is not one its token grants here";
                return CUDA_ERROR_INVALID_DEVICE;
            }
            if (const auto* l = d->limits(); l && l->size() % 2 == 0)
                for (flatbuffers::uoffset_t k = 0; k < l->size(); k += 2)
                    ds.limits.emplace_back(static_cast<CUlimit>(l->Get(k)), l->Get(k + 1));
            ds.cache_config = static_cast<CUfunc_cache>(d->cache_config());
            std::vector<device_memory::moved_mapping> maps;
            std::vector<bool> by_descriptor;
            if (d->mappings())
                for (const auto* m : *d->mappings()) {
                    by_descriptor.push_back(m->by_descriptor());
                    device_memory::moved_mapping mm{m->va(), m->size(), m->shared(), m->live(), {}};
                    if (const auto* r = m->free_runs(); r && r->size() % 2 == 0)
                        for (flatbuffers::uoffset_t k = 0; k < r->size(); k += 2)
                            mm.free_runs[r->Get(k)] = r->Get(k + 1);
                    maps.push_back(std::move(mm));
                }
            device_memory::allocation_map allocs;
            if (d->allocations())
                for (const auto* a : *d->allocations()) allocs[a->start()] = {a->size(), a->mapping()};
            if (CUresult rc = devices_[i].memory->adopt(maps, std::move(allocs), d->heap_charge(), why);
                rc != CUDA_SUCCESS)
                return rc;
            // Memory handed over must be the same physical GPU's: otherwise the sender copies it instead.
            if (std::find(by_descriptor.begin(), by_descriptor.end(), true) != by_descriptor.end())
                if (CUresult rc = check_handed_over_gpu(st, i, "memory", why); rc != CUDA_SUCCESS) return rc;
            // Room for the contents, registered with the driver when it is copied back (restore); memory
            // handed over comes as a descriptor instead; memory pre-copied is where it came.
            for (size_t k = 0; k < maps.size(); ++k) {
                auto& m = maps[k];
                if (by_descriptor[k]) {
                    device_memory::saved_mapping handed;
                    handed.va = m.va;
                    handed.size = m.size;
                    ds.memory.push_back(std::move(handed));
                    continue;
                }
                if (auto t = pre.take(m.va, m.size); t.bytes) {
                    ds.memory.push_back({m.va, m.size, std::move(t.bytes)});
                    precopied[m.va] = std::move(t.have);
                    continue;
                }
                void* p = ::mmap(nullptr, m.size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
                if (p == MAP_FAILED) {
                    why = "no host memory for its " + mib(m.size) + " mapping";
                    return CUDA_ERROR_OUT_OF_MEMORY;
                }
                ds.memory.push_back(
                    {m.va, m.size, {static_cast<std::byte*>(p), device_memory::unmap_bytes{m.size}}});
            }
        }
        uint64_t image_words = 0;
        if (st.origins())
            for (const auto* o : *st.origins()) {
                auto parts = std::make_shared<std::vector<std::vector<uint64_t>>>();
                if (o->part_words())
                    for (uint64_t w : *o->part_words()) {
                        if ((image_words += w) > max_image_words) return bad("module images over 4 GiB");
                        parts->emplace_back(w);
                    }
                module_origins::origin origin;
                origin.library = o->library();
                origin.format = o->format();
                if (o->jit_options())
                    origin.jit_options.assign(reinterpret_cast<const std::byte*>(o->jit_options()->data()),
                                              reinterpret_cast<const std::byte*>(o->jit_options()->data()) +
                                                  o->jit_options()->size());
                origin.parts = parts;
                // Charged here as its load was there: its device's quota, or every device's for a library.
                origin.charge = o->charge();
                origin.device = o->device();
                if (!origin.library && origin.device >= devices_.size()) return bad("a module's device");
                const size_t end = origin.library ? devices_.size() : origin.device + 1;
                for (size_t i = origin.library ? 0 : origin.device; i < end; ++i)
                    if (!devices_[i].memory->charge(origin.charge)) {
                        why = "its modules' memory exceeds the quota here";
                        return CUDA_ERROR_OUT_OF_MEMORY;
                    }
                origins.add(o->handle(), std::move(origin));
                origin_parts.push_back(std::move(parts));
            }
        if (st.entries())
            for (const auto* e : *st.entries()) {
                session_image::entry_state es;
                es.id = e->id();
                es.name = e->name() ? e->name()->str() : std::string();
                if (const auto* a = e->attributes(); a && a->size() % 2 == 0)
                    for (flatbuffers::uoffset_t k = 0; k < a->size(); k += 2)
                        es.attributes.emplace_back(a->Get(k), a->Get(k + 1));
                es.flags = e->flags();
                es.priority = e->priority();
                es.recorded = e->recorded();
                es.age_ms = e->age_ms();
                es.release_threshold = e->release_threshold();
                if (e->stream_attributes())
                    for (const auto* a : *e->stream_attributes()) {
                        const auto id = static_cast<CUstreamAttrID>(a->id());
                        CUstreamAttrValue v{};
                        if (std::find(settable_stream_attributes.begin(), settable_stream_attributes.end(),
                                      id) == settable_stream_attributes.end() ||
                            !vector_as(a->value(), v))
                            return bad("a stream attribute");
                        es.stream_attributes.emplace_back(id, v);
                    }
                img->entries.push_back(std::move(es));
            }
        if (st.globals())
            for (const auto* g : *st.globals()) {
                session_image::global_state gs;
                gs.address = g->address();
                gs.size = g->size();
                gs.device = g->device();
                gs.owner = g->owner();
                gs.name = g->name() ? g->name()->str() : std::string();
                gs.managed = g->managed();
                if (!g->bytes() || g->bytes()->size() != gs.size || gs.device >= devices_.size())
                    return bad("global " + gs.name);
                gs.bytes.assign(reinterpret_cast<const std::byte*>(g->bytes()->data()),
                                reinterpret_cast<const std::byte*>(g->bytes()->data()) + gs.size);
                globals.add(gs.address, gs.size, gs.owner, gs.device, gs.name, gs.managed);
                img->globals.push_back(std::move(gs));
            }
        if (const auto* r = st.relocated_globals(); r && r->size() % 4 == 0)
            for (flatbuffers::uoffset_t k = 0; k < r->size(); k += 4)
                globals.relocate(r->Get(k), r->Get(k + 1), r->Get(k + 2), r->Get(k + 3));
        // The served pools' allocations: each the start of device memory adopted above, no larger; one of a
        // pool the application made names that pool, served, of the same device.
        if (const auto* pa = st.pool_allocations()) {
            const auto* from = st.pool_allocation_pools();
            if (pa->size() % 3 || (from && from->size() * 3 != pa->size()))
                return bad("its stream-ordered allocations");
            for (flatbuffers::uoffset_t k = 0; k < pa->size(); k += 3) {
                const uint64_t p = pa->Get(k), size = pa->Get(k + 1), device = pa->Get(k + 2);
                const uint64_t made = from ? from->Get(k / 3) : 0;
                if (device >= devices_.size()) return bad("a stream-ordered allocation");
                const auto& held = devices_[device].memory->allocations();
                auto it = held.find(p);
                if (size == 0 || it == held.end() || size > it->second.first || pools.find(p))
                    return bad("a stream-ordered allocation");
                if (const handle_entry* e = made ? handles.find(made, handle_kind::mem_pool) : nullptr;
                    made && made != pool_allocations::destroyed_pool &&
                    (!e || e->owned || !(e->made_with[0] & pool_allocations::served_by_session) ||
                     static_cast<uint64_t>(e->device) != device))
                    return bad("a stream-ordered allocation of a pool");
                pools.add(p, size, device, nullptr, /*imported=*/false, /*windowed=*/true, made);
            }
        }
        if (CUresult rc = take_moved_vmm(st, *img, why); rc != CUDA_SUCCESS) return rc;
        if (CUresult rc = take_moved_arrays(st, *img, why); rc != CUDA_SUCCESS) return rc;
        if (CUresult rc = take_moved_objects(st, why); rc != CUDA_SUCCESS) return rc;
        if (CUresult rc = take_moved_graphs(st, *img, why); rc != CUDA_SUCCESS) return rc;
        if (const auto* dc = st.deferred_copies()) {
            std::vector<deferred_copies::landed> landed;
            for (const auto* c : *dc) {
                if (!c->bytes() || c->bytes()->size() > deferred_copy::max_copy)
                    return bad("a deferred copy");
                deferred_copies::landed l{c->ticket(), static_cast<CUresult>(c->status()), {}};
                l.bytes.assign(reinterpret_cast<const std::byte*>(c->bytes()->data()),
                               reinterpret_cast<const std::byte*>(c->bytes()->data()) + c->bytes()->size());
                landed.push_back(std::move(l));
            }
            deferred.add_landed(std::move(landed));
        }
        img->bytes = st.bytes();
        img->moved_in = true;
        if (const auto* p = st.lane_progress(); p && p->size() % 2 == 0) {
            std::lock_guard l(progress_mu_);
            for (flatbuffers::uoffset_t k = 0; k < p->size(); k += 2)
                progress_[static_cast<uint32_t>(p->Get(k))] = p->Get(k + 1);
        }
        if (const auto* g = st.gone_lanes()) {
            std::lock_guard l(progress_mu_);
            gone_lanes_.insert(g->begin(), g->end());
        }
    }

    // The pieces, in the order the state announced them: images' parts, then memory.
    const uint64_t piece = st.piece_bytes();
    if (piece == 0 || piece > (uint64_t{1} << 30)) {
        why = "the moved session's pieces are of " + std::to_string(piece) + " bytes";
        return CUDA_ERROR_INVALID_VALUE;
    }
    // The state is acceptable: the sender may send the pieces (a refusal before this is the only answer, so
    // that it reaches a sender still writing rather than a broken pipe).
    {
        flatbuffers::FlatBufferBuilder go(64);
        go.Finish(wire::CreateReply(go, CUDA_SUCCESS));
        if (auto r = fs.send(make_frame(frame_kind::reply, go), after(std::chrono::seconds(10))); !r) {
            why = "the sender did not take the answer to the state: " + r.error().message;
            return CUDA_ERROR_NOT_READY;
        }
    }
    frame_limits limits;
    limits.max_meta = 1024;
    limits.max_payload = piece;
    fs.set_limits(limits);
    uint64_t index = 0;
    frame f;
    std::vector<std::pair<uintptr_t, size_t>> image_regions;
    // `can_be_unchanged`: the piece may come without its bytes, as the same as the pre-copied one at `dst`.
    auto receive_piece = [&](std::byte* dst, size_t n, bool can_be_unchanged = false) -> bool {
        payload_sink sink = [&](const frame_header& h, const std::vector<std::byte>&) -> std::byte* {
            return h.payload_len == n ? dst : nullptr;
        };
        auto r = fs.receive_into(f, after(std::chrono::seconds(60)), std::chrono::seconds(60), sink);
        if (!r) {
            why = "the moved session's state stopped coming: " + r.error().message;
            return false;
        }
        const auto* p = f.kind() == frame_kind::state_piece ? root_of<wire::StatePiece>(f) : nullptr;
        const bool unchanged = p && p->unchanged() && can_be_unchanged && f.header.payload_len == 0;
        if (!p || p->index() != index || p->precopy() || (f.header.payload_len != n && !unchanged)) {
            why = "the moved session's piece " + std::to_string(index) + " is not what was announced";
            return false;
        }
        ++index;
        return true;
    };
    for (auto& parts : origin_parts)
        for (auto& part : *parts)
            if (!receive_piece(reinterpret_cast<std::byte*>(part.data()), part.size() * sizeof(uint64_t)))
                return CUDA_ERROR_INVALID_VALUE;
    // Shared pinned host memory: the client's pages, mapped at the addresses the client knows them by here.
    if (const auto* r = st.host_regions(); r && r->size()) {
        if (r->size() % 2 || !fs.raw().is_local()) {
            why = "the moved session's shared host memory can come only over a Unix socket";
            return CUDA_ERROR_INVALID_VALUE;
        }
        for (flatbuffers::uoffset_t k = 0; k < r->size(); k += 2) {
            const uintptr_t addr = r->Get(k);
            const size_t size = r->Get(k + 1);
            if (!receive_piece(nullptr, 0)) return CUDA_ERROR_INVALID_VALUE;
            int fd = fs.raw().take_fd();
            if (fd < 0 || !map_host_pages_at(addr, fd, size)) {
                if (fd >= 0) ::close(fd);
                why = "its shared host memory cannot be mapped at " + std::to_string(addr) + " here";
                return CUDA_ERROR_ALREADY_MAPPED;
            }
            std::lock_guard lock(mu);
            if (!host.reserve(size, host_quota())) {
                unmap_host_pages(addr, size);
                ::close(fd);
                why = "its shared host memory exceeds the host memory quota here";
                return CUDA_ERROR_OUT_OF_MEMORY;
            }
            host.add(addr, size, fd);
            image_regions.emplace_back(addr, size);
        }
    }
    // Physical memory handed over: a piece of no bytes with its descriptor, which only a Unix socket carries.
    auto take_handed_over = [&](std::unique_ptr<int, device_memory::close_descriptor>& into, size_t size,
                                const std::string& what) {
        if (!fs.raw().is_local()) {
            why = "the moved session's memory can be handed over only over a Unix socket";
            return false;
        }
        if (!receive_piece(nullptr, 0)) return false;
        into = device_memory::own_descriptor(fs.raw().take_fd());
        if (!into) {
            why = "the moved session's " + what + " came without its descriptor";
            return false;
        }
        img->handed_over += size;
        return true;
    };
    for (auto& ds : img->devices)
        for (auto& m : ds.memory) {
            if (!m.bytes) {
                if (!take_handed_over(m.descriptor, m.size, "memory at " + std::to_string(m.va)))
                    return CUDA_ERROR_INVALID_VALUE;
                continue;
            }
            const auto have = precopied.find(m.va);
            for (size_t off = 0; off < m.size; off += piece) {
                const bool came = have != precopied.end() &&
                                  std::binary_search(have->second.begin(), have->second.end(), off);
                if (!receive_piece(m.bytes.get() + off, std::min<size_t>(piece, m.size - off), came))
                    return CUDA_ERROR_INVALID_VALUE;
            }
        }
    for (auto& a : img->vmm_allocations) {
        if (a.by_descriptor) {
            if (!take_handed_over(a.descriptor, a.size, "VMM allocation " + std::to_string(a.id)))
                return CUDA_ERROR_INVALID_VALUE;
            continue;
        }
        for (size_t off = 0; off < a.size; off += piece)
            if (!receive_piece(a.bytes.get() + off, std::min<size_t>(piece, a.size - off)))
                return CUDA_ERROR_INVALID_VALUE;
    }
    {
        std::lock_guard lock(mu);
        img->host_regions = std::move(image_regions);
        image_ = std::move(img);
    }
    suspended_.store(true);
    return resume(why);
}

}  // namespace vcuda::server
