#pragma once
// Host entry points of the CUDA kernels (implemented in attn_launch.cu), for
// the CUDA backend. Enqueue only: no allocation, no synchronisation, so a decode
// step can be captured in a CUDA graph.

#include <cuda_runtime_api.h>

#include "attn_params.hpp"

namespace treeattn::cuda {

// Query rows (queries x query heads of a KV head) one stage-1 CTA takes at
// most: a pass of a large tile (plan.hpp, kLargeTileRows).
inline constexpr int kRowsPerPass = 64;

// What the current device runs for stage 1 (f16, these head dims): which code,
// its registers and spills, and how many CTAs fit on an SM. The cost model
// plans with the CTAs; --verbose prints the rest, since occupancy and spills
// decide the kernel's speed and are otherwise invisible.
struct Stage1Occupancy {
  int ctas_per_sm = 0;   // 0: the query failed
  int binary_arch = 0;   // the machine code's: 90 on the H100, 80 on the A100
  int ptx_arch = 0;      // the virtual architecture it came from: 90 for the sm_90a cubin, 80 for sm_80's
                         // (and for the driver's compile of compute_80 PTX on a newer GPU)
  bool wgmma = false;    // its 64-row passes run wgmma (else mma.sync)
  int registers = 0;     // per thread
  int spill_bytes = 0;   // local memory per thread
  int shared_bytes = 0;  // dynamic shared memory per CTA
};
Stage1Occupancy stage1_occupancy(int head_dim, int head_dim_v);

// The grids of one call. A growing workspace launches exactly its plan's
// passes and queries; a graph-stable one launches its capacities, so the grids
// never change between decode steps, and the kernels skip what the plan's
// StepCounts leave out.
struct LaunchGeometry {
  std::int32_t passes = 0;   // stage-1 CTAs per KV head
  std::int32_t queries = 0;  // merge (query, head) warps over heads_q; 0: no merge
  bool lean_merge = false;   // every query merges at most kMergeLeanBatch partials
};

// Stage 1 over every work item and KV head, then the stage-2 merge.
// head_dim (Q, K) and head_dim_v (V, O) are equal, 64, 96, 128 or 256, or 192
// and 128 (attn_launch.cu, KernelHeadDims; others: cudaErrorInvalidValue);
// `q` is the element type of Q (f16 and bf16 on the tensor cores, f32 on the
// CUDA cores), `kv` that of K and V: Q's, or fp8 beside f16 or bf16 Q. The
// params' options pick the kernels (attn_launch.cu).
cudaError_t launch_tree_attention(const KernelParams& params, const LaunchGeometry& geometry, int head_dim,
                                  int head_dim_v, ElementType q, ElementType kv, cudaStream_t stream);

// An upload's device work (PlanUpload: the copies, then a CTA of 64 threads
// per tile map); ordered on `stream` before the layers that read them. At
// least one copy CTA: the last CTA to finish writes the ticket.
cudaError_t launch_upload_plan(const PlanUpload& upload, cudaStream_t stream);

// Sets the stage-1 kernels' shared-memory limit, once per process and device
// before any launch (not per launch: a graph capture must hold kernels only).
cudaError_t prepare_kernels();

}  // namespace treeattn::cuda
