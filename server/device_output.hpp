// Device printf: the driver writes what kernels printed to the process's `stdout` FILE, on the thread whose
// call flushed it (a synchronize, a blocking copy, a launch), as measured with driver 580 on an H200. The
// server replaces its `stdout` at start with a stream that gives those bytes to the lane whose thread wrote
// them; the lane sends them with its next reply and the client writes them to its own stdout, where CUDA
// would have. Writes from any other thread go to the real standard output.
// runs on: install() once at start; capture on a lane's thread for the lane's life.
#pragma once

#include <cstddef>
#include <string>

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

}  // namespace vcuda::server::device_output
