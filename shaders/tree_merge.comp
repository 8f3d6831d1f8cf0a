#version 460
// Stage 2: one work group per (query, query head) merges the query's partial
// results with the log-sum-exp rule, in the plan's order, so the output is
// bitwise deterministic. Queries with no partials were written by stage 1 and
// are skipped.
//
// Each of the THREADS threads (32; 48 for 96 columns) owns HEAD_DIM_V / THREADS
// consecutive dimensions of the partial rows (V's columns) and walks
// the query's partials in steps of up to eight: it loads every partial's LSE
// (the same word in every thread: one broadcast load) and its own slice of the
// partial rows, all issued together, then rescales the running sum once per
// step (online softmax over partials). The uploaded plan numbers partials in
// merge order (lowering.hpp), so a partial's row is known from merge_begin
// alone and a step waits on one round of loads. Where SINKS, the query head's
// sink joins the merged softmax once, at the end.
#extension GL_GOOGLE_include_directive : require
#include "attn_common.glsl"

layout(local_size_x_id = 1) in;
layout(constant_id = 1) const uint THREADS = 32;
const uint DIMS = HEAD_DIM_V / THREADS;  // per thread: 2, 4 or 8 consecutive dimensions

// Adds the query's partials m .. m + step - 1 (step: 4 or 8, a constant at
// each call) that come before `last`; a position past it rereads the last
// partial and is weighted 0.
void add_partials(uint m, uint last, uint step, uint head, uint d0, inout float acc[DIMS], inout float running_max,
                  inout float sum) {
  float lse[8], o[8][DIMS];
  [[unroll]] for (uint u = 0u; u < step; ++u) {
    const uint partial = min(m + u, last - 1u);
    const uint row = partial * pc.heads_q + head;
    lse[u] = Floats(pc.partial_lse).f[row];
    const uint at = row * HEAD_DIM_V + d0;
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
  float step_max = running_max;
  [[unroll]] for (uint u = 0u; u < step; ++u) step_max = max(step_max, lse[u]);  // rereads change nothing
  const float alpha = exp2(running_max - step_max);  // 0 on the first step (running_max = -inf)
  sum *= alpha;
  [[unroll]] for (uint d = 0u; d < DIMS; ++d) acc[d] *= alpha;
  running_max = step_max;
  [[unroll]] for (uint u = 0u; u < step; ++u) {
    const float w = m + u < last ? exp2(lse[u] - step_max) : 0.0;
    sum += w;
    [[unroll]] for (uint d = 0u; d < DIMS; ++d) acc[d] += w * o[u][d];
  }
}

void main() {
  // x: the query within its run of queries, y: the query head, z: the run
  // (runs past the device's dispatch limit; the last one may end early).
  const uint query = numbered_work_group(gl_WorkGroupID.z), head = gl_WorkGroupID.y;
  if (query >= pc.groups) return;
  const uint d0 = gl_LocalInvocationID.x * DIMS;
  const uint first = plan_word(kMergeBegin, query), last = plan_word(kMergeBegin, query + 1u);
  if (first == last) return;

  float acc[DIMS];
  [[unroll]] for (uint d = 0u; d < DIMS; ++d) acc[d] = 0.0;
  float running_max = -1.0 / 0.0, sum = 0.0;
  // Eight partials a step where more than four are left, else four: one round
  // of loads for a query's usual 5-8 partials, and no rereads for the 2-4 of
  // short trees (eight on every step: up to 0.7 % slower on those; sixteen
  // where more than eight are left: 0.4 % slower overall; docs/performance.md).
  for (uint m = first; m < last;) {
    if (last - m > 4u) {
      add_partials(m, last, 8u, head, d0, acc, running_max, sum);
      m += 8u;
    } else {
      add_partials(m, last, 4u, head, d0, acc, running_max, sum);
      m += 4u;
    }
  }
  float inv = 1.0 / sum;
  float lse2 = running_max + log2(sum);
  if (SINKS) join_sink(head, running_max, sum, inv, lse2);
  const uint out0 = (query * pc.heads_q + head) * HEAD_DIM_V + d0;
  for (uint i = 0u; i < DIMS; i += 2u) store_output_pair(out0 + i, vec2(acc[i], acc[i + 1u]) * inv);
  if (pc.lse != 0ul && d0 == 0u) Floats(pc.lse).f[query * pc.heads_q + head] = lse2 * kLn2;
}
