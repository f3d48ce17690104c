// Device printf: the driver writes what kernels printed to the process's `stdout` FILE. Measured with driver
// 580 on an H200 (tests/gpu/probes/printf_threads.cu): on the thread of a synchronize that comes within about
// 20 ms of the kernel's end, else on a thread of the driver's own. The server replaces its `stdout` at start
// with a stream that gives those bytes to the lane whose thread wrote them; the lane sends them with its next
// reply and the client writes them to its own stdout, where CUDA would have. What the driver's own thread
// writes names no session: it goes to the process's one claimant when there is exactly one (a worker of
// --isolation process, or a server with one session), else to the real standard output.
// runs on: install() once at start; capture on a lane's thread for the lane's life; claimant per session.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

namespace vcuda::server::device_output {

// Replaces `stdout` (idempotent). Call before the driver is loaded.
void install();

// While alive, what this thread writes to stdout is appended to `into`, at most `limit` bytes pending (the
// driver's own printf buffer is 1 MiB by default); past that it is dropped and the loss noted once. Nested
// captures (a lane's thread that suspends its session) end into the outer one's string again.
class capture {
  public:
    static constexpr size_t limit = size_t{4} << 20;
    explicit capture(std::string& into);
    ~capture();
    capture(const capture&) = delete;
    capture& operator=(const capture&) = delete;

  private:
    std::string* outer_;
};

// While alive, a session that may have kernels' output no capture claims: `take` gets it when this is the
// process's only claimant (so it cannot be another session's). Alive from before the session's first context
// until after its last is gone, so that a session's late lines never reach another one.
class claimant {
  public:
    explicit claimant(std::function<void(std::string_view)> take);
    ~claimant();
    claimant(const claimant&) = delete;
    claimant& operator=(const claimant&) = delete;

  private:
    std::function<void(std::string_view)> take_;
};

}  // namespace vcuda::server::device_output
