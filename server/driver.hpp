// The real driver (or the software test driver), loaded with dlopen and reached only through the generated
// function table. The server never links libcuda or cudart.
#pragma once

#include <string>
#include <vector>

#include "driver_table.hpp"

namespace vcuda::server {

struct gpu_info {
    CUdevice device = 0;
    std::string name;
    CUuuid uuid{};
    size_t total_memory = 0;
    std::vector<int> attributes;  // indexed by CUdevice_attribute
};

class driver {
  public:
    // Loads `path` (default libcuda.so.1), initializes it and describes its GPUs. `why` says what failed.
    bool load(const std::string& path, std::string& why);
    const driver_table& api() const { return table_; }
    const std::vector<gpu_info>& gpus() const { return gpus_; }
    const std::string& path() const { return path_; }
    int version() const { return version_; }

  private:
    driver_table table_;
    std::vector<gpu_info> gpus_;
    std::string path_;
    int version_ = 0;
    void* handle_ = nullptr;
};

// Whether `s` captures (cuStreamIsCapturing): NONE also when the driver lacks the call or it fails.
inline CUstreamCaptureStatus capture_status(const driver_table& d, CUstream s) {
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    if (!d.cuStreamIsCapturing || d.cuStreamIsCapturing(s, &st) != CUDA_SUCCESS)
        return CU_STREAM_CAPTURE_STATUS_NONE;
    return st;
}

// For the server's own calls that a stream capture in GLOBAL or THREAD_LOCAL mode refuses and is invalidated
// by (measured on the H200: cuMemHostRegister, cuMemHostAlloc): this thread is RELAXED while the scope lives,
// then back in its mode.
class relaxed_capture_scope {
  public:
    explicit relaxed_capture_scope(const driver_table& d) : d_(d) {
        if (d_.cuThreadExchangeStreamCaptureMode) d_.cuThreadExchangeStreamCaptureMode(&mode_);
    }
    ~relaxed_capture_scope() {
        if (d_.cuThreadExchangeStreamCaptureMode) d_.cuThreadExchangeStreamCaptureMode(&mode_);
    }
    relaxed_capture_scope(const relaxed_capture_scope&) = delete;
    relaxed_capture_scope& operator=(const relaxed_capture_scope&) = delete;

  private:
    const driver_table& d_;
    CUstreamCaptureMode mode_ = CU_STREAM_CAPTURE_MODE_RELAXED;
};

}  // namespace vcuda::server
