// A probe of the real driver, run natively (no vcuda): does a CUDA user object outlive the context it was
// made in? A suspend destroys the session's contexts and makes new ones; if the driver's user objects stay
// (their destructors not run), a suspend can keep them as they are (server/session_image.cpp). Made in
// context 1 with one reference; context 1 destroyed; then, in a new context 2, one reference taken and two
// given back. Printed: whether the destructor ran after each step. On the H200 (driver 580.159, session 25)
// it printed: made in context 1: destructor ran 0 time(s); context 1 destroyed: 0; retained in context 2: 0
// (success); released in context 2: 0, destructor ran 1 time(s). So a user object outlives its context, and
// works in the next one.
//   nvcc -o user_object_context user_object_context.cpp -lcuda
#include <cuda.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>

#define CK(x)                                               \
    do {                                                    \
        CUresult r_ = (x);                                  \
        if (r_) {                                           \
            printf("%s -> %d\n", #x, static_cast<int>(r_)); \
            return 1;                                       \
        }                                                   \
    } while (0)

static std::atomic<int> ended{0};
static void CUDA_CB on_end(void*) { ended.fetch_add(1); }

static void settle() { std::this_thread::sleep_for(std::chrono::milliseconds(200)); }

int main() {
    CK(cuInit(0));
    CUdevice dev;
    CK(cuDeviceGet(&dev, 0));
    CUcontext c1, c2;
    CK(cuCtxCreate(&c1, nullptr, 0, dev));
    CUuserObject obj;
    CK(cuUserObjectCreate(&obj, nullptr, on_end, 1, CU_USER_OBJECT_NO_DESTRUCTOR_SYNC));
    settle();
    printf("made in context 1: destructor ran %d time(s)\n", ended.load());
    CK(cuCtxDestroy(c1));
    settle();
    printf("context 1 destroyed: destructor ran %d time(s)\n", ended.load());
    CK(cuCtxCreate(&c2, nullptr, 0, dev));
    CUresult r = cuUserObjectRetain(obj, 1);
    printf("retained in context 2: %d\n", static_cast<int>(r));
    r = cuUserObjectRelease(obj, r == CUDA_SUCCESS ? 2 : 1);
    settle();
    printf("released in context 2: %d; destructor ran %d time(s)\n", static_cast<int>(r), ended.load());
    CK(cuCtxDestroy(c2));
    return 0;
}
