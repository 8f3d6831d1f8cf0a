#version 460
// Stage 2: one work group per (query, query head) merges the query's partial
// results with the log-sum-exp rule, in the plan's order (merge_partial
// ascending), so the output is bitwise deterministic. Queries with no partials
// were written by stage 1 and are skipped.
//
// The partials are taken 32 at a time: each thread looks up one partial's row
// and LSE (one load, or two dependent ones where the plan's partials are not
// numbered query by query; paid once per batch instead of once per partial),
// then every thread walks the batch from shared memory, its loads of the
// partial rows independent of one another, with the running maximum rescaled
// once per batch (online softmax over partials).
#extension GL_GOOGLE_include_directive : require
#include "attn_common.glsl"

layout(local_size_x = 32) in;
layout(constant_id = 0) const uint HEAD_DIM = 128;
const uint THREADS = 32u, BATCH = 32u;
const uint DIMS = HEAD_DIM / THREADS;  // per thread: 2, 4 or 8 consecutive dimensions

shared uint batch_row[BATCH];    // partial row (partial x heads_q + head)
shared float batch_lse[BATCH];   // its LSE (base 2)

// Adds partials i .. i + step - 1 of the batch (step: 4 or 8, a constant at
// each call), all their loads issued before any is used; a position past the
// batch rereads its last row with weight 0.
void add_partials(uint i, uint count, uint step, float new_max, uint d0, inout float acc[DIMS], inout float sum) {
  float w[8], o[8][DIMS];
  [[unroll]] for (uint u = 0u; u < step; ++u) {
    const uint k = min(i + u, count - 1u);
    w[u] = i + u < count ? exp2(batch_lse[k] - new_max) : 0.0;
    const uint at = batch_row[k] * HEAD_DIM + d0;
    if (DIMS % 4u == 0u) {  // head_dim 128 and 256: 16-byte loads (at is a multiple of 4)
      [[unroll]] for (uint d = 0u; d < DIMS; d += 4u) {
        const vec4 four = Vec4s(pc.partial_o).v[(at + d) / 4u];
        o[u][d] = four.x;
        o[u][d + 1u] = four.y;
        o[u][d + 2u] = four.z;
        o[u][d + 3u] = four.w;
      }
    } else {
      [[unroll]] for (uint d = 0u; d < DIMS; ++d) o[u][d] = Floats(pc.partial_o).f[at + d];
    }
  }
  [[unroll]] for (uint u = 0u; u < step; ++u) {
    sum += w[u];
    [[unroll]] for (uint d = 0u; d < DIMS; ++d) acc[d] += w[u] * o[u][d];
  }
}

void main() {
  // x: the query within its run of queries, y: the query head, z: the run
  // (runs past the device's dispatch limit; the last one may end early).
  const uint query = numbered_work_group(gl_WorkGroupID.z), head = gl_WorkGroupID.y;
  if (query >= pc.groups) return;
  const uint tid = gl_LocalInvocationID.x, d0 = tid * DIMS;
  const uint first = plan_word(kMergeBegin, query), last = plan_word(kMergeBegin, query + 1u);
  if (first == last) return;

  Floats partial_lse = Floats(pc.partial_lse);
  float acc[DIMS];
  [[unroll]] for (uint i = 0u; i < DIMS; ++i) acc[i] = 0.0;
  float running_max = -1.0 / 0.0, sum = 0.0;
  for (uint m0 = first; m0 < last; m0 += BATCH) {
    const uint count = min(BATCH, last - m0);
    barrier();  // the previous batch is read
    if (tid < count) {
      const uint partial = pc.merge_in_order != 0u ? m0 + tid : plan_word(kMergePartial, m0 + tid);
      const uint row = partial * pc.heads_q + head;
      batch_row[tid] = row;
      batch_lse[tid] = partial_lse.f[row];
    }
    barrier();
    float batch_max = -1.0 / 0.0;
    for (uint i = 0u; i < count; ++i) batch_max = max(batch_max, batch_lse[i]);
    const float new_max = max(running_max, batch_max);
    const float alpha = exp2(running_max - new_max);  // 0 on the first batch (running_max = -inf)
    sum *= alpha;
    [[unroll]] for (uint d = 0u; d < DIMS; ++d) acc[d] *= alpha;
    running_max = new_max;
    // Eight partials a step where more than four are left, else four: one
    // round of loads instead of two for a query's usual 5-8 partials, and no
    // rereads for the 2-4 of short trees (eight on every step lost up to 0.7 %
    // there, sixteen 0.8 % overall; benchmarks/README.md, "Session 30"). The
    // order of the sums is the same either way, so the output is too.
    for (uint i = 0u; i < count;) {
      if (count - i > 4u) {
        add_partials(i, count, 8u, new_max, d0, acc, sum);
        i += 8u;
      } else {
        add_partials(i, count, 4u, new_max, d0, acc, sum);
        i += 4u;
      }
    }
  }
  const float inv = 1.0 / sum;
  const uint out0 = (query * pc.heads_q + head) * HEAD_DIM + d0;
  for (uint i = 0u; i < DIMS; i += 2u) store_output_pair(out0 + i, vec2(acc[i], acc[i + 1u]) * inv);
  if (pc.lse != 0ul && d0 == 0u) Floats(pc.lse).f[query * pc.heads_q + head] = (running_max + log2(sum)) * kLn2;
}
