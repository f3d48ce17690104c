// memcpy_batch: CUDA 12.8's batched copies, as copy-engine collectives and KV-cache transfers make them.
// cudaMemcpyBatchAsync with host-to-device copies from pinned and pageable memory and from a stack buffer
// read during the call (changed right after it), then device-to-device and device-to-host copies; and
// cudaMemcpy3DBatchAsync between pointers with rows longer than the copy, into a CUDA array at an offset and
// out of it. Every byte is checked. Calls the driver must refuse (the legacy stream, attribute indices not
// starting at 0) print the error they got: the native run is the reference.
#include <cuda_runtime.h>

#include <vector>

#include "common.cuh"

namespace {

cudaMemcpyAttributes attributes(cudaMemcpySrcAccessOrder order) {
    cudaMemcpyAttributes a{};
    a.srcAccessOrder = order;
    return a;
}

cudaMemcpy3DOperand pointer(void* p, size_t row_length = 0, size_t layer_height = 0) {
    cudaMemcpy3DOperand o{};
    o.type = cudaMemcpyOperandTypePointer;
    o.op.ptr.ptr = p;
    o.op.ptr.rowLength = row_length;
    o.op.ptr.layerHeight = layer_height;
    return o;
}

cudaMemcpy3DOperand array_at(cudaArray_t a, size_t x, size_t y) {
    cudaMemcpy3DOperand o{};
    o.type = cudaMemcpyOperandTypeArray;
    o.op.array.array = a;
    o.op.array.offset = {x, y, 0};
    return o;
}

}  // namespace

int main() {
    const size_t N = 1 << 16, SMALL = 64;
    int* d[4];
    for (auto& p : d) CHECK(cudaMalloc(&p, N * sizeof(int)));
    int *pinned = nullptr, *pinned_back = nullptr, *pinned_src = nullptr;
    CHECK(cudaMallocHost(&pinned, N * sizeof(int)));
    CHECK(cudaMallocHost(&pinned_back, 2 * SMALL * sizeof(int)));
    CHECK(cudaMallocHost(&pinned_src, SMALL * sizeof(int)));
    std::vector<int> pageable(N), back(N), back2(N);
    for (size_t i = 0; i < N; ++i) {
        pinned[i] = static_cast<int>(i);
        pageable[i] = static_cast<int>(3 * i + 1);
    }
    int stack_buf[SMALL];
    for (size_t i = 0; i < SMALL; ++i) {
        stack_buf[i] = static_cast<int>(1000 + i);
        pinned_src[i] = static_cast<int>(2000 + i);
    }
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

    // Batch 1: to the device. Copies 0 and 1 in stream order, 2 and 3 (a stack buffer, pinned memory) read
    // during the call.
    {
        void* dsts[] = {d[0], d[1], d[2], d[2] + SMALL};
        const void* srcs[] = {pinned, pageable.data(), stack_buf, pinned_src};
        size_t sizes[] = {N * sizeof(int), N * sizeof(int), SMALL * sizeof(int), SMALL * sizeof(int)};
        cudaMemcpyAttributes attrs[] = {attributes(cudaMemcpySrcAccessOrderStream),
                                        attributes(cudaMemcpySrcAccessOrderDuringApiCall)};
        size_t idxs[] = {0, 2};
        CHECK(cudaMemcpyBatchAsync(dsts, srcs, sizes, 4, attrs, idxs, 2, s));
        for (size_t i = 0; i < SMALL; ++i) stack_buf[i] = pinned_src[i] = -1;  // read already: may change now
    }
    // Batch 2: device to device and back to the host.
    {
        void* dsts[] = {d[3], back.data(), pinned_back};
        const void* srcs[] = {d[0], d[1], d[2]};
        size_t sizes[] = {N * sizeof(int), N * sizeof(int), 2 * SMALL * sizeof(int)};
        cudaMemcpyAttributes attrs[] = {attributes(cudaMemcpySrcAccessOrderStream)};
        size_t idxs[] = {0};
        CHECK(cudaMemcpyBatchAsync(dsts, srcs, sizes, 3, attrs, idxs, 1, s));
    }
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaMemcpy(back2.data(), d[3], N * sizeof(int), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < N; ++i) {
        EXPECT(back2[i] == static_cast<int>(i), "pinned -> device -> device: [%zu] = %d", i, back2[i]);
        EXPECT(back[i] == static_cast<int>(3 * i + 1), "pageable -> device -> host: [%zu] = %d", i, back[i]);
    }
    for (size_t i = 0; i < SMALL; ++i) {
        EXPECT(pinned_back[i] == static_cast<int>(1000 + i), "stack buffer -> device -> pinned: [%zu] = %d",
               i, pinned_back[i]);
        EXPECT(pinned_back[SMALL + i] == static_cast<int>(2000 + i), "pinned -> device -> pinned: [%zu] = %d",
               i, pinned_back[SMALL + i]);
    }
    printf("cudaMemcpyBatchAsync: 7 copies in two batches, sources read during the call: ok\n");

    // Refusals: the legacy stream; attribute indices that do not start at 0.
    {
        void* dsts[] = {d[0]};
        const void* srcs[] = {d[1]};
        size_t sizes[] = {64};
        cudaMemcpyAttributes attrs[] = {attributes(cudaMemcpySrcAccessOrderStream)};
        size_t zero[] = {0}, one[] = {1};
        cudaError_t legacy = cudaMemcpyBatchAsync(dsts, srcs, sizes, 1, attrs, zero, 1, cudaStreamLegacy);
        cudaGetLastError();
        cudaError_t first = cudaMemcpyBatchAsync(dsts, srcs, sizes, 1, attrs, one, 1, s);
        cudaGetLastError();
        printf("legacy stream -> %s; attribute indices from 1 -> %s\n", cudaGetErrorName(legacy),
               cudaGetErrorName(first));
    }

    // 3D batch: a 48 x 16 block of rows 80 ints long into an array at (4, 2); a 16 x 8 box of the array from
    // (10, 5) to packed rows; a 32 x 4 block between pointers with rows of 50 and 40 ints.
    const size_t AW = 64, AH = 32;
    cudaChannelFormatDesc fdesc = cudaCreateChannelDesc<int>();
    cudaArray_t arr = nullptr;
    CHECK(cudaMallocArray(&arr, &fdesc, AW, AH));
    std::vector<int> rows(80 * 16);
    for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<int>(7 * i);
    CHECK(cudaMemcpy(d[0], rows.data(), rows.size() * sizeof(int), cudaMemcpyHostToDevice));
    std::vector<int> pitched(50 * 4);
    for (size_t i = 0; i < pitched.size(); ++i) pitched[i] = static_cast<int>(5 * i + 2);
    CHECK(cudaMemcpy(d[1], pitched.data(), pitched.size() * sizeof(int), cudaMemcpyHostToDevice));
    CHECK(cudaMemset(d[3], 0, 40 * 4 * sizeof(int)));
    cudaMemcpy3DBatchOp ops[2]{};
    ops[0].src = pointer(d[0], 80);
    ops[0].dst = array_at(arr, 4, 2);
    ops[0].extent = make_cudaExtent(48, 16, 1);
    ops[0].srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    ops[1].src = pointer(d[1], 50);
    ops[1].dst = pointer(d[3], 40);
    ops[1].extent = make_cudaExtent(32 * sizeof(int), 4, 1);  // bytes: both sides are pointers
    ops[1].srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    ops[1].src.op.ptr.rowLength = 50 * sizeof(int);
    ops[1].dst.op.ptr.rowLength = 40 * sizeof(int);
    CHECK(cudaMemcpy3DBatchAsync(2, ops, 0, s));
    std::vector<int> box(16 * 8, -1);
    cudaMemcpy3DBatchOp out{};
    out.src = array_at(arr, 10, 5);
    out.dst = pointer(box.data());
    out.extent = make_cudaExtent(16, 8, 1);
    out.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    CHECK(cudaMemcpy3DBatchAsync(1, &out, 0, s));
    CHECK(cudaStreamSynchronize(s));
    for (size_t y = 0; y < 8; ++y)
        for (size_t x = 0; x < 16; ++x) {
            // Array (10 + x, 5 + y) came from row 3 + y, column 6 + x of the 80-int rows.
            int want = static_cast<int>(7 * ((3 + y) * 80 + 6 + x));
            EXPECT(box[y * 16 + x] == want, "array box (%zu, %zu) = %d, expected %d", x, y, box[y * 16 + x],
                   want);
        }
    std::vector<int> packed(40 * 4);
    CHECK(cudaMemcpy(packed.data(), d[3], packed.size() * sizeof(int), cudaMemcpyDeviceToHost));
    for (size_t y = 0; y < 4; ++y)
        for (size_t x = 0; x < 40; ++x) {
            int want = x < 32 ? static_cast<int>(5 * (y * 50 + x) + 2) : 0;
            EXPECT(packed[y * 40 + x] == want, "pointer rows (%zu, %zu) = %d, expected %d", x, y,
                   packed[y * 40 + x], want);
        }
    printf("cudaMemcpy3DBatchAsync: into an array at an offset, out of it, between pointers: ok\n");

    CHECK(cudaFreeArray(arr));
    CHECK(cudaStreamDestroy(s));
    for (auto p : d) CHECK(cudaFree(p));
    CHECK(cudaFreeHost(pinned));
    CHECK(cudaFreeHost(pinned_back));
    CHECK(cudaFreeHost(pinned_src));
    return pass();
}
