#version 450
// A plain cooperative-matrix GEMM, the yardstick of prefill (benchmarks/gemm_coop.py):
// C [M, N] fp32 = A [M, K] fp16 . B [N, K]^T fp16, 16x16x16 fp16 tiles with fp32 sums.
//
// The textbook shape: a workgroup of 8 subgroups owns a BM x BN = 128 x 128 tile of C; per stage
// of KU = 64 k it copies A and B [128, 64] to shared memory with 16-byte loads (the next stage's
// loads are issued before this stage's multiplies), then each subgroup multiplies its 32 x 64
// block (2 x 4 tiles). M, N multiples of the tile, K of KU. The defaults were the fastest of the
// five shapes tried on the H100 (the journal, `git show 4d73df3:docs/PERFORMANCE.md`); -DBM=.. -DBN=.. -DKU=.. -DSGM=.. build
// others. Not part of the engine: the engine's matmuls are shaders/matmul_coop.comp.
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_EXT_control_flow_attributes : require

#define WG 256
#ifndef BM
#define BM 128
#define BN 128
#define KU 64
#define SGM 4          // subgroups along M (8 / SGM along N)
#endif
#define SGN (8 / SGM)
#define KV8 (KU / 8)   // uvec4 per staged row
#define PAD (KV8 + 1)  // against bank conflicts
#define TM (BM / 16 / SGM)  // 16-row tiles per subgroup
#define TN (BN / 16 / SGN)  // 16-column tiles per subgroup
layout(local_size_x = WG) in;

layout(std430, binding = 0) readonly buffer Ab { uvec4 a4[]; };
layout(std430, binding = 1) readonly buffer Bb { uvec4 b4[]; };
layout(std430, binding = 2) writeonly buffer Cb { float c[]; };
layout(push_constant) uniform Push { uint M; uint N; uint K; uint pad; } pc;

shared uvec4 ash[BM * PAD];
shared uvec4 bsh[BN * PAD];

#define LOADS_A (BM * KV8 / WG)  // uvec4 of A per invocation per stage
#define LOADS_B (BN * KV8 / WG)

void main() {
    uint groups_n = pc.N / BN;
    uint m0 = (gl_WorkGroupID.x / groups_n) * BM, n0 = (gl_WorkGroupID.x % groups_n) * BN;
    uint tid = gl_LocalInvocationID.x, sg = gl_SubgroupID;
    uint sg_m = sg / SGN, sg_n = sg % SGN;
    uint K8 = pc.K / 8;
    coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator> acc[TM * TN];
    [[unroll]] for (uint i = 0; i < TM * TN; i++) acc[i] = coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>(0.0);
    uvec4 ar[LOADS_A], br[LOADS_B];
    [[unroll]] for (uint i = 0; i < LOADS_A; i++) {
        uint e = tid + WG * i;
        ar[i] = a4[(m0 + e / KV8) * K8 + e % KV8];
    }
    [[unroll]] for (uint i = 0; i < LOADS_B; i++) {
        uint e = tid + WG * i;
        br[i] = b4[(n0 + e / KV8) * K8 + e % KV8];
    }
    for (uint k0 = 0; k0 < pc.K; k0 += KU) {
        barrier();
        [[unroll]] for (uint i = 0; i < LOADS_A; i++) {
            uint e = tid + WG * i;
            ash[(e / KV8) * PAD + e % KV8] = ar[i];
        }
        [[unroll]] for (uint i = 0; i < LOADS_B; i++) {
            uint e = tid + WG * i;
            bsh[(e / KV8) * PAD + e % KV8] = br[i];
        }
        barrier();
        if (k0 + KU < pc.K) {
            [[unroll]] for (uint i = 0; i < LOADS_A; i++) {
                uint e = tid + WG * i;
                ar[i] = a4[(m0 + e / KV8) * K8 + (k0 + KU) / 8 + e % KV8];
            }
            [[unroll]] for (uint i = 0; i < LOADS_B; i++) {
                uint e = tid + WG * i;
                br[i] = b4[(n0 + e / KV8) * K8 + (k0 + KU) / 8 + e % KV8];
            }
        }
        [[unroll]] for (uint j = 0; j < KU / 16; j++) {
            coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA> a[TM];
            [[unroll]] for (uint tm = 0; tm < TM; tm++)
                coopMatLoad(a[tm], ash, ((sg_m * TM + tm) * 16) * PAD + 2 * j, PAD, gl_CooperativeMatrixLayoutRowMajor);
            [[unroll]] for (uint tn = 0; tn < TN; tn++) {
                coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB> b;
                coopMatLoad(b, bsh, ((sg_n * TN + tn) * 16) * PAD + 2 * j, PAD, gl_CooperativeMatrixLayoutColumnMajor);
                [[unroll]] for (uint tm = 0; tm < TM; tm++)
                    acc[tm * TN + tn] = coopMatMulAdd(a[tm], b, acc[tm * TN + tn]);
            }
        }
    }
    [[unroll]] for (uint tm = 0; tm < TM; tm++) {
        [[unroll]] for (uint tn = 0; tn < TN; tn++) {
            uint m = m0 + (sg_m * TM + tm) * 16, n = n0 + (sg_n * TN + tn) * 16;
            coopMatStore(acc[tm * TN + tn], c, m * pc.N + n, pc.N, gl_CooperativeMatrixLayoutRowMajor);
        }
    }
}
