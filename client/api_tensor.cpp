// Tensor maps: the server encodes the descriptor with the real driver over memory the session owns and
// answers its 128 bytes (server/handlers_tensor.cpp). cuTensorMapReplaceAddress encodes again with the new
// address, from the arguments this process remembers for each descriptor it was given, so that the server
// checks that address too.
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "client/entry_point.hpp"
#include "client/plain_call.hpp"
#include "client/state.hpp"
#include "client/trace.hpp"
#include "client_ops.hpp"
#include "common/log.hpp"

using namespace vcuda;
using namespace vcuda::client;

namespace {

// One encoding's arguments as op tensor_map_encode takes them (protocol/OPS.md): args[3] is the address.
struct encoding {
    std::vector<uint64_t> args;
    std::vector<std::vector<std::byte>> blobs;
};

// The descriptors this process was given, by their bytes (at most `max_kept`, the oldest forgotten first).
class known_maps {
  public:
    void keep(const CUtensorMap& m, encoding e) {
        std::lock_guard lock(mu_);
        auto [it, fresh] = maps_.insert_or_assign(key(m), std::move(e));
        if (fresh) order_.push_back(it->first);
        while (order_.size() > max_kept) {
            maps_.erase(order_.front());
            order_.pop_front();
        }
    }
    bool find(const CUtensorMap& m, encoding& e) {
        std::lock_guard lock(mu_);
        auto it = maps_.find(key(m));
        if (it == maps_.end()) return false;
        e = it->second;
        return true;
    }

  private:
    static constexpr size_t max_kept = 1 << 16;
    static std::string key(const CUtensorMap& m) { return {reinterpret_cast<const char*>(&m), sizeof m}; }
    std::mutex mu_;
    std::map<std::string, encoding> maps_;
    std::deque<std::string> order_;
};

known_maps& maps() {
    static auto* m = new known_maps;  // never destroyed: used until the process ends
    return *m;
}

template <class T>
std::vector<std::byte> bytes_of(const T* p, size_t n) {
    std::vector<std::byte> b(n * sizeof(T));
    if (n) std::memcpy(b.data(), p, b.size());
    return b;
}

const char* const encoder_names[] = {"cuTensorMapEncodeTiled", "cuTensorMapEncodeIm2col",
                                     "cuTensorMapEncodeIm2colWide"};

// Sends one encoding; on success writes the descriptor and remembers how it was made.
CUresult encode(CUtensorMap* map, encoding e) {
    VCUDA_REQUIRE_INIT();
    if (current_device() < 0) return CUDA_ERROR_INVALID_CONTEXT;
    e.args.resize(13);  // what the kind does not take: 0 or empty
    e.blobs.resize(4);
    const auto& x = e.args;
    auto u = [&](size_t i) { return static_cast<unsigned>(x[i]); };
    tensor_map_encode_call c(encoder_names[x[0]], u(0), u(1), u(2), x[3], u(4), u(5), u(6), u(7), u(8), u(9),
                             from_wire<int>(x[10]), from_wire<int>(x[11]), u(12), e.blobs[0], e.blobs[1],
                             e.blobs[2], e.blobs[3]);
    if (CUresult rc = c.send_sync(); rc != CUDA_SUCCESS) return rc;
    if (c.descriptor().size() != sizeof(CUtensorMap)) return CUDA_ERROR_UNKNOWN;
    std::memcpy(map, c.descriptor().data(), sizeof(CUtensorMap));
    maps().keep(*map, std::move(e));
    return CUDA_SUCCESS;
}

// The arguments every encoder shares; false when an array the rank asks for is missing.
bool common(encoding& e, uint64_t kind, CUtensorMapDataType type, cuuint32_t rank, void* address,
            const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* element_strides,
            CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle, CUtensorMapL2promotion promotion,
            CUtensorMapFloatOOBfill fill) {
    if (rank == 0 || rank > 5 || !dims || !element_strides || (rank > 1 && !strides)) return false;
    e.args = {kind,
              static_cast<uint64_t>(type),
              rank,
              reinterpret_cast<uint64_t>(address),
              static_cast<uint64_t>(interleave),
              static_cast<uint64_t>(swizzle),
              static_cast<uint64_t>(promotion),
              static_cast<uint64_t>(fill)};
    e.blobs = {bytes_of(dims, rank), bytes_of(strides, rank - 1), bytes_of(element_strides, rank)};
    return true;
}

}  // namespace

VCUDA_API cuTensorMapEncodeTiled(CUtensorMap* tensorMap, CUtensorMapDataType tensorDataType,
                                 cuuint32_t tensorRank, void* globalAddress, const cuuint64_t* globalDim,
                                 const cuuint64_t* globalStrides, const cuuint32_t* boxDim,
                                 const cuuint32_t* elementStrides, CUtensorMapInterleave interleave,
                                 CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2Promotion,
                                 CUtensorMapFloatOOBfill oobFill) noexcept {
    VCUDA_TRACE_HOOK(cuTensorMapEncodeTiled, tensorMap, tensorDataType, tensorRank, globalAddress, globalDim,
                     globalStrides, boxDim, elementStrides, interleave, swizzle, l2Promotion, oobFill);
    encoding e;
    if (!tensorMap || !boxDim ||
        !common(e, 0, tensorDataType, tensorRank, globalAddress, globalDim, globalStrides, elementStrides,
                interleave, swizzle, l2Promotion, oobFill))
        return CUDA_ERROR_INVALID_VALUE;
    e.blobs.push_back(bytes_of(boxDim, tensorRank));
    return encode(tensorMap, std::move(e));
}

VCUDA_API cuTensorMapEncodeIm2col(CUtensorMap* tensorMap, CUtensorMapDataType tensorDataType,
                                  cuuint32_t tensorRank, void* globalAddress, const cuuint64_t* globalDim,
                                  const cuuint64_t* globalStrides, const int* pixelBoxLowerCorner,
                                  const int* pixelBoxUpperCorner, cuuint32_t channelsPerPixel,
                                  cuuint32_t pixelsPerColumn, const cuuint32_t* elementStrides,
                                  CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
                                  CUtensorMapL2promotion l2Promotion,
                                  CUtensorMapFloatOOBfill oobFill) noexcept {
    VCUDA_TRACE_HOOK(cuTensorMapEncodeIm2col, tensorMap, tensorDataType, tensorRank, globalAddress, globalDim,
                     globalStrides, pixelBoxLowerCorner, pixelBoxUpperCorner, channelsPerPixel,
                     pixelsPerColumn, elementStrides, interleave, swizzle, l2Promotion, oobFill);
    encoding e;
    if (!tensorMap || tensorRank < 3 || !pixelBoxLowerCorner || !pixelBoxUpperCorner ||
        !common(e, 1, tensorDataType, tensorRank, globalAddress, globalDim, globalStrides, elementStrides,
                interleave, swizzle, l2Promotion, oobFill))
        return CUDA_ERROR_INVALID_VALUE;
    e.args.push_back(channelsPerPixel);
    e.args.push_back(pixelsPerColumn);
    auto corners =
        bytes_of(pixelBoxLowerCorner, tensorRank - 2);  // one blob, lower then upper (4 blobs at most)
    auto upper = bytes_of(pixelBoxUpperCorner, tensorRank - 2);
    corners.insert(corners.end(), upper.begin(), upper.end());
    e.blobs.push_back(std::move(corners));
    return encode(tensorMap, std::move(e));
}

VCUDA_API cuTensorMapEncodeIm2colWide(CUtensorMap* tensorMap, CUtensorMapDataType tensorDataType,
                                      cuuint32_t tensorRank, void* globalAddress, const cuuint64_t* globalDim,
                                      const cuuint64_t* globalStrides, int pixelBoxLowerCornerWidth,
                                      int pixelBoxUpperCornerWidth, cuuint32_t channelsPerPixel,
                                      cuuint32_t pixelsPerColumn, const cuuint32_t* elementStrides,
                                      CUtensorMapInterleave interleave, CUtensorMapIm2ColWideMode mode,
                                      CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2Promotion,
                                      CUtensorMapFloatOOBfill oobFill) noexcept {
    VCUDA_TRACE_HOOK(cuTensorMapEncodeIm2colWide, tensorMap, tensorDataType, tensorRank, globalAddress,
                     globalDim, globalStrides, pixelBoxLowerCornerWidth, pixelBoxUpperCornerWidth,
                     channelsPerPixel, pixelsPerColumn, elementStrides, interleave, mode, swizzle,
                     l2Promotion, oobFill);
    encoding e;
    if (!tensorMap || tensorRank < 3 ||
        !common(e, 2, tensorDataType, tensorRank, globalAddress, globalDim, globalStrides, elementStrides,
                interleave, swizzle, l2Promotion, oobFill))
        return CUDA_ERROR_INVALID_VALUE;
    e.args.push_back(channelsPerPixel);
    e.args.push_back(pixelsPerColumn);
    e.args.push_back(to_wire(pixelBoxLowerCornerWidth));
    e.args.push_back(to_wire(pixelBoxUpperCornerWidth));
    e.args.push_back(static_cast<uint64_t>(mode));
    return encode(tensorMap, std::move(e));
}

VCUDA_API cuTensorMapReplaceAddress(CUtensorMap* tensorMap, void* globalAddress) noexcept {
    VCUDA_TRACE_HOOK(cuTensorMapReplaceAddress, tensorMap, globalAddress);
    if (!tensorMap) return CUDA_ERROR_INVALID_VALUE;
    encoding e;
    if (!maps().find(*tensorMap, e)) {
        VCUDA_LOG_WARN(
            "cuTensorMapReplaceAddress: the descriptor was not made by this process's "
            "cuTensorMapEncode* calls (or was changed since): refused");
        return CUDA_ERROR_INVALID_VALUE;
    }
    e.args[3] = reinterpret_cast<uint64_t>(globalAddress);
    return encode(tensorMap, std::move(e));
}
