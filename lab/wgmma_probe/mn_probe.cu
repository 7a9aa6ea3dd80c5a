/* mn_probe.cu — which no-swizzle descriptor offsets wgmma reads an MN-major (transposed) bf16 B
 * with: D (64 x 128) = A (64 x 16, registers) B (16 x 128), B stored as 8 x 8 core matrices whose
 * 16-byte rows are 8 n-values of one k (the latent tile's layout in cuda_mla_wgmma.cu), k groups
 * 128 bytes apart, n groups 512 bytes apart. Runs the product with (LBO, SBO) = (128, 512) and
 * (512, 128) against the CPU and prints each one's largest error. sm_90a only.
 *   nvcc -gencode=arch=compute_90a,code=sm_90a -o mn_probe mn_probe.cu && ./mn_probe */
#include <cstdio>
#include <cstdint>
#include <cmath>
#include <cuda_bf16.h>

__device__ uint64_t desc(const void *p, uint32_t lbo, uint32_t sbo)
{
    uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    return (uint64_t)((a & 0x3ffffu) >> 4) | ((uint64_t)(lbo >> 4) << 16) | ((uint64_t)(sbo >> 4) << 32);
}

__global__ void probe(const __nv_bfloat16 *A, const __nv_bfloat16 *B, float *D, uint32_t lbo, uint32_t sbo)
{
    __shared__ __align__(128) __nv_bfloat16 Bs[16 * 128 + 2048]; /* room for either reading */
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    for (int i = tid; i < 16 * 128 + 2048; i += 128)
        Bs[i] = __float2bfloat16(0.0f);
    __syncthreads();
    /* B[k][n] -> core matrix (kg = k / 8, ng = n / 8) at (ng * 4 + kg) * 64 elements, row k % 8 */
    for (int i = tid; i < 16 * 128; i += 128) {
        int k = i / 128, n = i % 128;
        Bs[((n / 8) * 4 + k / 8) * 64 + (k % 8) * 8 + n % 8] = B[i];
    }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    uint32_t a[4];
    const int r = warp * 16 + lane / 4, c = 2 * (lane % 4);
    auto pk = [&](int rr, int cc) {
        __nv_bfloat162 v;
        v.x = A[rr * 16 + cc];
        v.y = A[rr * 16 + cc + 1];
        return *(uint32_t *)&v;
    };
    a[0] = pk(r, c), a[1] = pk(r + 8, c), a[2] = pk(r, c + 8), a[3] = pk(r + 8, c + 8);
    float d[64];
    for (int i = 0; i < 64; i++)
        d[i] = 0.0f;
    uint64_t db = desc(Bs, lbo, sbo);
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, "
                 "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, "
                 "%40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, "
                 "%59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),
                   "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),
                   "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),
                   "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
                   "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]),
                   "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),
                   "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
                   "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    for (int j = 0; j < 16; j++)
        for (int e = 0; e < 4; e++)
            D[(r + 8 * (e / 2)) * 128 + j * 8 + c + (e & 1)] = d[j * 4 + e];
}

int main()
{
    static __nv_bfloat16 A[64 * 16], B[16 * 128];
    static float Af[64 * 16], Bf[16 * 128], D[64 * 128];
    unsigned s = 1;
    for (int i = 0; i < 64 * 16; i++) {
        s = s * 1103515245u + 12345u;
        A[i] = __float2bfloat16((float)((s >> 16) % 17) - 8.0f);
        Af[i] = __bfloat162float(A[i]);
    }
    for (int i = 0; i < 16 * 128; i++) {
        s = s * 1103515245u + 12345u;
        B[i] = __float2bfloat16((float)((s >> 16) % 13) - 6.0f);
        Bf[i] = __bfloat162float(B[i]);
    }
    __nv_bfloat16 *dA, *dB;
    float *dD;
    cudaMalloc(&dA, sizeof A), cudaMalloc(&dB, sizeof B), cudaMalloc(&dD, sizeof D);
    cudaMemcpy(dA, A, sizeof A, cudaMemcpyHostToDevice), cudaMemcpy(dB, B, sizeof B, cudaMemcpyHostToDevice);
    const uint32_t pairs[2][2] = {{128, 512}, {512, 128}};
    for (int q = 0; q < 2; q++) {
        cudaMemset(dD, 0, sizeof D);
        probe<<<1, 128>>>(dA, dB, dD, pairs[q][0], pairs[q][1]);
        cudaError_t e = cudaDeviceSynchronize();
        cudaMemcpy(D, dD, sizeof D, cudaMemcpyDeviceToHost);
        double worst = 0;
        for (int m = 0; m < 64; m++)
            for (int n = 0; n < 128; n++) {
                double want = 0;
                for (int k = 0; k < 16; k++)
                    want += (double)Af[m * 16 + k] * Bf[k * 128 + n];
                worst = fmax(worst, fabs(want - D[m * 128 + n]));
            }
        printf("mn_probe: LBO %u SBO %u: %s, max |error| %g%s\n", pairs[q][0], pairs[q][1], cudaGetErrorString(e), worst,
               worst == 0 ? "  <- exact" : "");
    }
    return 0;
}
