// cusparse_ilu (GPU only: cuSPARSE's kernels need a real GPU): an incomplete-LU preconditioned conjugate
// gradient as the CUDA sample conjugateGradientPrecond runs it — a 2D Laplacian in CSR, csrilu02 (buffer
// size, analysis, factorization), two triangular solves with cusparseSpSV per iteration, SpMV and cuBLAS-free
// vector updates in small kernels — then every descriptor destroyed, csrilu02's info last checked: it frees
// its unused buffers with cudaFreeAsync(NULL), which vcuda refused (CUSPARSE_STATUS_INVALID_VALUE). The
// solution is checked against the right-hand side on the host.
#include <cuda_runtime.h>
#define DISABLE_CUSPARSE_DEPRECATED  // csrilu02 is what the sample uses
#include <cusparse.h>

#include <cmath>
#include <vector>

#include "common.cuh"

#define CHECK_SPARSE(call)                                                                              \
    do {                                                                                                \
        cusparseStatus_t s_ = (call);                                                                   \
        if (s_ != CUSPARSE_STATUS_SUCCESS)                                                              \
            fail("%s returned %s (%d) at line %d", #call, cusparseGetErrorName(s_), int(s_), __LINE__); \
    } while (0)

// y = a * x + y
extern "C" __global__ void ci_axpy(int n, float a, const float* x, float* y) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += a * x[i];
}
// p = z + b * p
extern "C" __global__ void ci_update_p(int n, float b, const float* z, float* p) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = z[i] + b * p[i];
}

static float dot(const float* a, const float* b, int n) {
    std::vector<float> ha(n), hb(n);
    CHECK(cudaMemcpy(ha.data(), a, n * sizeof(float), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(hb.data(), b, n * sizeof(float), cudaMemcpyDeviceToHost));
    double s = 0;
    for (int i = 0; i < n; ++i) s += double(ha[i]) * hb[i];
    return float(s);
}

int main() {
    // The 5-point Laplacian on a side x side grid.
    const int side = 64, n = side * side;
    std::vector<int> rows(n + 1), cols;
    std::vector<float> vals;
    for (int y = 0; y < side; ++y)
        for (int x = 0; x < side; ++x) {
            int i = y * side + x;
            rows[i] = int(cols.size());
            auto put = [&](int j, float v) {
                cols.push_back(j);
                vals.push_back(v);
            };
            if (y > 0) put(i - side, -1.0f);
            if (x > 0) put(i - 1, -1.0f);
            put(i, 4.0f);
            if (x < side - 1) put(i + 1, -1.0f);
            if (y < side - 1) put(i + side, -1.0f);
        }
    rows[n] = int(cols.size());
    const int nz = int(cols.size());
    std::vector<float> rhs(n, 1.0f);

    int *d_row = nullptr, *d_col = nullptr;
    float *d_val = nullptr, *d_ilu = nullptr, *d_x = nullptr, *d_r = nullptr, *d_z = nullptr, *d_y = nullptr,
          *d_p = nullptr, *d_q = nullptr;
    CHECK(cudaMalloc(&d_row, (n + 1) * sizeof(int)));
    CHECK(cudaMalloc(&d_col, nz * sizeof(int)));
    CHECK(cudaMalloc(&d_val, nz * sizeof(float)));
    CHECK(cudaMalloc(&d_ilu, nz * sizeof(float)));
    for (float** v : {&d_x, &d_r, &d_z, &d_y, &d_p, &d_q}) CHECK(cudaMalloc(v, n * sizeof(float)));
    CHECK(cudaMemcpy(d_row, rows.data(), (n + 1) * sizeof(int), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(d_col, cols.data(), nz * sizeof(int), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(d_val, vals.data(), nz * sizeof(float), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(d_ilu, d_val, nz * sizeof(float), cudaMemcpyDeviceToDevice));
    CHECK(cudaMemcpy(d_r, rhs.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    CHECK(cudaMemset(d_x, 0, n * sizeof(float)));

    cusparseHandle_t h = nullptr;
    CHECK_SPARSE(cusparseCreate(&h));
    cusparseMatDescr_t descr = nullptr;
    CHECK_SPARSE(cusparseCreateMatDescr(&descr));
    CHECK_SPARSE(cusparseSetMatType(descr, CUSPARSE_MATRIX_TYPE_GENERAL));
    CHECK_SPARSE(cusparseSetMatIndexBase(descr, CUSPARSE_INDEX_BASE_ZERO));

    // ILU(0) of the matrix, in place in d_ilu.
    csrilu02Info_t info = nullptr;
    CHECK_SPARSE(cusparseCreateCsrilu02Info(&info));
    int ilu_bytes = 0;
    CHECK_SPARSE(cusparseScsrilu02_bufferSize(h, n, nz, descr, d_ilu, d_row, d_col, info, &ilu_bytes));
    void* ilu_buf = nullptr;
    CHECK(cudaMalloc(&ilu_buf, ilu_bytes));
    CHECK_SPARSE(cusparseScsrilu02_analysis(h, n, nz, descr, d_ilu, d_row, d_col, info,
                                            CUSPARSE_SOLVE_POLICY_USE_LEVEL, ilu_buf));
    int zero_pivot = -1;
    cusparseStatus_t zp = cusparseXcsrilu02_zeroPivot(h, info, &zero_pivot);
    EXPECT(zp == CUSPARSE_STATUS_SUCCESS, "structural zero pivot at %d", zero_pivot);
    CHECK_SPARSE(cusparseScsrilu02(h, n, nz, descr, d_ilu, d_row, d_col, info,
                                   CUSPARSE_SOLVE_POLICY_USE_LEVEL, ilu_buf));
    printf("csrilu02 of a %d x %d Laplacian (%d non-zeros): factorized\n", n, n, nz);

    // L (unit diagonal) and U over the factors, the matrix itself, and the vectors.
    cusparseSpMatDescr_t A = nullptr, L = nullptr, U = nullptr;
    CHECK_SPARSE(cusparseCreateCsr(&A, n, n, nz, d_row, d_col, d_val, CUSPARSE_INDEX_32I, CUSPARSE_INDEX_32I,
                                   CUSPARSE_INDEX_BASE_ZERO, CUDA_R_32F));
    CHECK_SPARSE(cusparseCreateCsr(&L, n, n, nz, d_row, d_col, d_ilu, CUSPARSE_INDEX_32I, CUSPARSE_INDEX_32I,
                                   CUSPARSE_INDEX_BASE_ZERO, CUDA_R_32F));
    CHECK_SPARSE(cusparseCreateCsr(&U, n, n, nz, d_row, d_col, d_ilu, CUSPARSE_INDEX_32I, CUSPARSE_INDEX_32I,
                                   CUSPARSE_INDEX_BASE_ZERO, CUDA_R_32F));
    cusparseFillMode_t lower = CUSPARSE_FILL_MODE_LOWER, upper = CUSPARSE_FILL_MODE_UPPER;
    cusparseDiagType_t unit = CUSPARSE_DIAG_TYPE_UNIT, non_unit = CUSPARSE_DIAG_TYPE_NON_UNIT;
    CHECK_SPARSE(cusparseSpMatSetAttribute(L, CUSPARSE_SPMAT_FILL_MODE, &lower, sizeof lower));
    CHECK_SPARSE(cusparseSpMatSetAttribute(L, CUSPARSE_SPMAT_DIAG_TYPE, &unit, sizeof unit));
    CHECK_SPARSE(cusparseSpMatSetAttribute(U, CUSPARSE_SPMAT_FILL_MODE, &upper, sizeof upper));
    CHECK_SPARSE(cusparseSpMatSetAttribute(U, CUSPARSE_SPMAT_DIAG_TYPE, &non_unit, sizeof non_unit));
    cusparseDnVecDescr_t vr = nullptr, vz = nullptr, vy = nullptr, vp = nullptr, vq = nullptr;
    CHECK_SPARSE(cusparseCreateDnVec(&vr, n, d_r, CUDA_R_32F));
    CHECK_SPARSE(cusparseCreateDnVec(&vz, n, d_z, CUDA_R_32F));
    CHECK_SPARSE(cusparseCreateDnVec(&vy, n, d_y, CUDA_R_32F));
    CHECK_SPARSE(cusparseCreateDnVec(&vp, n, d_p, CUDA_R_32F));
    CHECK_SPARSE(cusparseCreateDnVec(&vq, n, d_q, CUDA_R_32F));

    const float one = 1.0f, zero = 0.0f;
    size_t mv_bytes = 0, l_bytes = 0, u_bytes = 0;
    CHECK_SPARSE(cusparseSpMV_bufferSize(h, CUSPARSE_OPERATION_NON_TRANSPOSE, &one, A, vp, &zero, vq,
                                         CUDA_R_32F, CUSPARSE_SPMV_ALG_DEFAULT, &mv_bytes));
    cusparseSpSVDescr_t sl = nullptr, su = nullptr;
    CHECK_SPARSE(cusparseSpSV_createDescr(&sl));
    CHECK_SPARSE(cusparseSpSV_createDescr(&su));
    CHECK_SPARSE(cusparseSpSV_bufferSize(h, CUSPARSE_OPERATION_NON_TRANSPOSE, &one, L, vr, vy, CUDA_R_32F,
                                         CUSPARSE_SPSV_ALG_DEFAULT, sl, &l_bytes));
    CHECK_SPARSE(cusparseSpSV_bufferSize(h, CUSPARSE_OPERATION_NON_TRANSPOSE, &one, U, vy, vz, CUDA_R_32F,
                                         CUSPARSE_SPSV_ALG_DEFAULT, su, &u_bytes));
    void *mv_buf = nullptr, *l_buf = nullptr, *u_buf = nullptr;
    CHECK(cudaMalloc(&mv_buf, mv_bytes ? mv_bytes : 1));
    CHECK(cudaMalloc(&l_buf, l_bytes ? l_bytes : 1));
    CHECK(cudaMalloc(&u_buf, u_bytes ? u_bytes : 1));
    CHECK_SPARSE(cusparseSpSV_analysis(h, CUSPARSE_OPERATION_NON_TRANSPOSE, &one, L, vr, vy, CUDA_R_32F,
                                       CUSPARSE_SPSV_ALG_DEFAULT, sl, l_buf));
    CHECK_SPARSE(cusparseSpSV_analysis(h, CUSPARSE_OPERATION_NON_TRANSPOSE, &one, U, vy, vz, CUDA_R_32F,
                                       CUSPARSE_SPSV_ALG_DEFAULT, su, u_buf));

    // Preconditioned CG: z = U^-1 L^-1 r.
    const int blocks = (n + 255) / 256;
    float rz_old = 0;
    int k = 0;
    const int max_iter = 200;
    float residual = std::sqrt(dot(d_r, d_r, n));
    while (residual > 1e-5f && k < max_iter) {
        CHECK_SPARSE(cusparseSpSV_solve(h, CUSPARSE_OPERATION_NON_TRANSPOSE, &one, L, vr, vy, CUDA_R_32F,
                                        CUSPARSE_SPSV_ALG_DEFAULT, sl));
        CHECK_SPARSE(cusparseSpSV_solve(h, CUSPARSE_OPERATION_NON_TRANSPOSE, &one, U, vy, vz, CUDA_R_32F,
                                        CUSPARSE_SPSV_ALG_DEFAULT, su));
        float rz = dot(d_r, d_z, n);
        if (k == 0)
            CHECK(cudaMemcpy(d_p, d_z, n * sizeof(float), cudaMemcpyDeviceToDevice));
        else
            ci_update_p<<<blocks, 256>>>(n, rz / rz_old, d_z, d_p);
        CHECK_LAUNCH();
        CHECK_SPARSE(cusparseSpMV(h, CUSPARSE_OPERATION_NON_TRANSPOSE, &one, A, vp, &zero, vq, CUDA_R_32F,
                                  CUSPARSE_SPMV_ALG_DEFAULT, mv_buf));
        float alpha = rz / dot(d_p, d_q, n);
        ci_axpy<<<blocks, 256>>>(n, alpha, d_p, d_x);
        ci_axpy<<<blocks, 256>>>(n, -alpha, d_q, d_r);
        CHECK_LAUNCH();
        rz_old = rz;
        residual = std::sqrt(dot(d_r, d_r, n));
        ++k;
    }
    EXPECT(k < max_iter, "no convergence in %d iterations (residual %g)", k, residual);
    printf("preconditioned CG converged in %d iterations\n", k);

    // The solution against the right-hand side, on the host.
    std::vector<float> x(n);
    CHECK(cudaMemcpy(x.data(), d_x, n * sizeof(float), cudaMemcpyDeviceToHost));
    double worst = 0;
    for (int i = 0; i < n; ++i) {
        double s = 0;
        for (int j = rows[i]; j < rows[i + 1]; ++j) s += double(vals[j]) * x[cols[j]];
        worst = std::fmax(worst, std::fabs(s - rhs[i]));
    }
    EXPECT(worst < 1e-3, "largest error of A x - b: %g", worst);
    printf("A x = b within 1e-3\n");

    CHECK_SPARSE(cusparseSpSV_destroyDescr(sl));
    CHECK_SPARSE(cusparseSpSV_destroyDescr(su));
    for (auto v : {vr, vz, vy, vp, vq}) CHECK_SPARSE(cusparseDestroyDnVec(v));
    for (auto m : {A, L, U}) CHECK_SPARSE(cusparseDestroySpMat(m));
    CHECK_SPARSE(cusparseDestroyCsrilu02Info(info));
    CHECK_SPARSE(cusparseDestroyMatDescr(descr));
    CHECK_SPARSE(cusparseDestroy(h));
    printf("every descriptor destroyed, csrilu02's info included\n");
    for (void* p : {static_cast<void*>(d_row), static_cast<void*>(d_col), static_cast<void*>(d_val),
                    static_cast<void*>(d_ilu), static_cast<void*>(d_x), static_cast<void*>(d_r),
                    static_cast<void*>(d_z), static_cast<void*>(d_y), static_cast<void*>(d_p),
                    static_cast<void*>(d_q), ilu_buf, mv_buf, l_buf, u_buf})
        CHECK(cudaFree(p));
    return pass();
}
