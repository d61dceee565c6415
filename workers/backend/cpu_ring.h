/* cpu_ring.h: the CPU backend's ring-attention ops (cpu_ring.c), private to
 * workers/backend/: cpu.c puts them in the table. Contracts in backend.h. */
#ifndef BALLAST_CPU_RING_H
#define BALLAST_CPU_RING_H

#include <stdbool.h>

void cpu_attn_block_fwd(float *out, float *lse, const float *q, const float *k, const float *v, int Tq, int Tk,
                        int H, int Hkv, int Dh, bool causal);
void cpu_attn_merge(float *out, float *lse, const float *out_b, const float *lse_b, int Tq, int H, int Dh);
void cpu_attn_block_bwd(float *dq, float *dk, float *dv, const float *dout, const float *out, const float *lse,
                        const float *q, const float *k, const float *v, int Tq, int Tk, int H, int Hkv, int Dh,
                        bool causal);

#endif
