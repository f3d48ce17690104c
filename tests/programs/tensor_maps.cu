// tensor_maps: Hopper tensor memory access (TMA). The host encodes a 2D tiled tensor map over a float matrix
// with cuTensorMapEncodeTiled (found through cudaGetDriverEntryPointByVersion, as CUTLASS, Triton and XLA
// do); a kernel takes the map by value (__grid_constant__), loads one 16 x 16 tile per block into shared
// memory with cp.async.bulk.tensor (out-of-bounds elements read as zero) and writes every element * 2 + 1
// out. Then cuTensorMapReplaceAddress points the same map at a second matrix and the kernel runs again; an
// im2col map is encoded; bad arguments are refused. Everything is compared with the CPU.
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstring>
#include <vector>

#include "common.cuh"

constexpr int box = 16;  // the tile: box x box floats

// One block per tile, box * box threads. out is [tiles y][tiles x][box][box].
extern "C" __global__ void tm_tile_copy(const __grid_constant__ CUtensorMap map, float* out, float scale,
                                        float bias) {
    __shared__ alignas(128) float tile[box][box];
    __shared__ alignas(8) unsigned long long bar;
    const unsigned bar_addr = static_cast<unsigned>(__cvta_generic_to_shared(&bar));
    const unsigned tile_addr = static_cast<unsigned>(__cvta_generic_to_shared(&tile[0][0]));
    if (threadIdx.x == 0) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar_addr) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        const unsigned bytes = sizeof tile;
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar_addr), "r"(bytes)
                     : "memory");
        const int x = blockIdx.x * box, y = blockIdx.y * box;
        asm volatile(
            "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, "
            "{%2, %3}], [%4];" ::"r"(tile_addr),
            "l"(reinterpret_cast<unsigned long long>(&map)), "r"(x), "r"(y), "r"(bar_addr)
            : "memory");
    }
    unsigned done = 0;
    do {
        asm volatile(
            "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0;\n selp.u32 %0, 1, 0, "
            "p;\n}\n"
            : "=r"(done)
            : "r"(bar_addr)
            : "memory");
    } while (!done);
    const int r = threadIdx.x / box, c = threadIdx.x % box;
    const size_t t = static_cast<size_t>(blockIdx.y) * gridDim.x + blockIdx.x;
    out[(t * box + r) * box + c] = tile[r][c] * scale + bias;
}

namespace {

decltype(&::cuTensorMapEncodeTiled) encode_tiled;
decltype(&::cuTensorMapEncodeIm2col) encode_im2col;
decltype(&::cuTensorMapReplaceAddress) replace_address;

void* driver_entry(const char* name) {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q{};
    CHECK(cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &q));
    if (q != cudaDriverEntryPointSuccess || !fn)
        fail("%s: no driver entry point (%d)", name, static_cast<int>(q));
    return fn;
}

void check_cu(CUresult rc, const char* what) {
    if (rc != CUDA_SUCCESS) fail("%s: CUresult %d", what, static_cast<int>(rc));
}

// Runs the kernel over the matrix `map` describes (rows x cols) and compares with host[] * 2 + 1 per tile.
void run_and_check(const CUtensorMap& map, const std::vector<float>& host, int rows, int cols,
                   const char* what) {
    const int tiles_x = (cols + box - 1) / box, tiles_y = (rows + box - 1) / box;
    const size_t n_out = size_t(tiles_x) * tiles_y * box * box;
    float* d_out = nullptr;
    CHECK(cudaMalloc(&d_out, n_out * sizeof(float)));
    CHECK(cudaMemset(d_out, 0xff, n_out * sizeof(float)));
    tm_tile_copy<<<dim3(tiles_x, tiles_y), box * box>>>(map, d_out, 2.0f, 1.0f);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    std::vector<float> out(n_out);
    CHECK(cudaMemcpy(out.data(), d_out, n_out * sizeof(float), cudaMemcpyDeviceToHost));
    CHECK(cudaFree(d_out));
    double sum = 0;
    for (int ty = 0; ty < tiles_y; ++ty)
        for (int tx = 0; tx < tiles_x; ++tx)
            for (int r = 0; r < box; ++r)
                for (int c = 0; c < box; ++c) {
                    const int y = ty * box + r, x = tx * box + c;
                    const float v =
                        (y < rows && x < cols) ? host[size_t(y) * cols + x] : 0.0f;  // OOB reads zero
                    const float want = v * 2.0f + 1.0f;
                    const float got = out[((size_t(ty) * tiles_x + tx) * box + r) * box + c];
                    if (got != want)
                        fail("%s: tile (%d, %d) element (%d, %d) = %g, want %g", what, tx, ty, r, c, got,
                             want);
                    sum += got;
                }
    std::printf("%s: %d x %d tiles of %d x %d ok, checksum %.0f\n", what, tiles_x, tiles_y, box, box, sum);
}

}  // namespace

int main() {
    encode_tiled =
        reinterpret_cast<decltype(&::cuTensorMapEncodeTiled)>(driver_entry("cuTensorMapEncodeTiled"));
    encode_im2col =
        reinterpret_cast<decltype(&::cuTensorMapEncodeIm2col)>(driver_entry("cuTensorMapEncodeIm2col"));
    replace_address =
        reinterpret_cast<decltype(&::cuTensorMapReplaceAddress)>(driver_entry("cuTensorMapReplaceAddress"));

    // 90 x 72 floats: rows of 288 bytes (a multiple of 16, as tensor maps need); the last tiles run past the
    // edge.
    const int rows = 90, cols = 72;
    const size_t n = size_t(rows) * cols;
    std::vector<float> a(n), b(n);
    for (size_t i = 0; i < n; ++i) {
        a[i] = static_cast<float>((i * 7) % 1000);
        b[i] = static_cast<float>((i * 13 + 5) % 777);
    }
    float *d_a = nullptr, *d_b = nullptr;
    CHECK(cudaMalloc(&d_a, n * sizeof(float)));
    CHECK(cudaMalloc(&d_b, n * sizeof(float)));
    CHECK(cudaMemcpy(d_a, a.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(d_b, b.data(), n * sizeof(float), cudaMemcpyHostToDevice));

    alignas(64) CUtensorMap map;
    std::memset(&map, 0, sizeof map);
    const cuuint64_t dims[2] = {cuuint64_t(cols), cuuint64_t(rows)};
    const cuuint64_t strides[1] = {cols * sizeof(float)};
    const cuuint32_t box_dims[2] = {box, box};
    const cuuint32_t element_strides[2] = {1, 1};
    check_cu(encode_tiled(&map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, d_a, dims, strides, box_dims,
                          element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                          CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
             "cuTensorMapEncodeTiled");
    run_and_check(map, a, rows, cols, "tiled map over a");

    check_cu(replace_address(&map, d_b), "cuTensorMapReplaceAddress");
    run_and_check(map, b, rows, cols, "the same map moved to b");

    // An im2col map over a 4D NHWC tensor (n 1, h 8, w 8, c 16 floats): encoded (not used by a kernel here).
    {
        alignas(64) CUtensorMap im2col;
        const cuuint64_t d4[4] = {16, 8, 8, 1};
        const cuuint64_t s4[3] = {16 * sizeof(float), 16 * 8 * sizeof(float), 16 * 8 * 8 * sizeof(float)};
        const cuuint32_t e4[4] = {1, 1, 1, 1};
        const int lower[2] = {-1, -1}, upper[2] = {-1, -1};
        check_cu(encode_im2col(&im2col, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, d_a, d4, s4, lower, upper, 16, 32,
                               e4, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                               CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
                 "cuTensorMapEncodeIm2col");
        std::printf("im2col map over a 1 x 8 x 8 x 16 tensor: encoded\n");
    }

    // Refusals: rank 0, a misaligned address, an im2col rank below 3.
    {
        alignas(64) CUtensorMap bad;
        if (encode_tiled(&bad, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 0, d_a, dims, strides, box_dims,
                         element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                         CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS)
            fail("rank 0 accepted");
        // A null address is accepted by driver 580 (measured on the H200): a descriptor can be made before
        // its tensor and given an address with cuTensorMapReplaceAddress.
        if (encode_tiled(&bad, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, nullptr, dims, strides, box_dims,
                         element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                         CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
            fail("a null address refused");
        if (encode_tiled(&bad, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, reinterpret_cast<char*>(d_a) + 4, dims,
                         strides, box_dims, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                         CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                         CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS)
            fail("a misaligned address accepted");
        if (replace_address(&map, reinterpret_cast<char*>(d_b) + 4) == CUDA_SUCCESS)
            fail("cuTensorMapReplaceAddress accepted a misaligned address");
        std::printf("bad tensor map arguments: refused\n");
    }

    CHECK(cudaFree(d_a));
    CHECK(cudaFree(d_b));
    return pass();
}
