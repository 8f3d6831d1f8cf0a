#version 460
// Stage 2: one work group per (query, query head) merges the query's partial
// results with the max-shifted log-sum-exp rule, in the plan's order
// (merge_partial ascending), so the output is bitwise deterministic. Queries
// with no partials were written by stage 1 and are skipped.
#extension GL_GOOGLE_include_directive : require
#include "attn_common.glsl"

layout(local_size_x = 32) in;
layout(constant_id = 0) const uint HEAD_DIM = 128;
const uint DIMS = HEAD_DIM / 32u;  // per thread: 2, 4 or 8 consecutive dimensions

void main() {
  load_plan_header();
  const uint query = gl_WorkGroupID.x, head = gl_WorkGroupID.y, d0 = gl_LocalInvocationID.x * DIMS;
  const uint first = plan_word(kMergeBegin, query), last = plan_word(kMergeBegin, query + 1u);
  if (first == last) return;

  Floats partial_lse = Floats(pc.partial_lse), partial_o = Floats(pc.partial_o);
  float max_lse = -1.0 / 0.0;
  for (uint m = first; m < last; ++m) {
    max_lse = max(max_lse, partial_lse.f[plan_word(kMergePartial, m) * pc.heads_q + head]);
  }
  float acc[DIMS];
  for (uint i = 0u; i < DIMS; ++i) acc[i] = 0.0;
  float sum = 0.0;
  for (uint m = first; m < last; ++m) {
    const uint row_index = plan_word(kMergePartial, m) * pc.heads_q + head;
    const float w = exp2(partial_lse.f[row_index] - max_lse);
    sum += w;
    for (uint i = 0u; i < DIMS; ++i) acc[i] += w * partial_o.f[row_index * HEAD_DIM + d0 + i];
  }
  const float inv = 1.0 / sum;
  const uint out0 = (query * pc.heads_q + head) * HEAD_DIM + d0;
  for (uint i = 0u; i < DIMS; i += 2u) store_output_pair(out0 + i, vec2(acc[i], acc[i + 1u]) * inv);
  if (pc.lse != 0ul && d0 == 0u) Floats(pc.lse).f[query * pc.heads_q + head] = (max_lse + log2(sum)) * kLn2;
}
