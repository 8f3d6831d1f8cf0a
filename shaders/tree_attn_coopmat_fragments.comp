#version 460
// Stage 1 on tensor cores with the softmax in registers, for devices whose
// cooperative matrices place elements as mma.sync's m16n8k16 fragments do
// (NVIDIA's; coopmat_layout.comp probes it, the backend picks this shader only
// when the probe matches). Element i of a lane's 16x16 f32 accumulator, and of
// its 16x16 f16 A matrix, sits at row g + 8 (i / 4), column 8 ((i / 2) % 2) +
// 2 t + i % 2, where g = lane / 4 and t = lane % 4. So a lane holds 8 columns
// of rows g and g + 8 of S, O and P alike: the row maximum and sum are four
// lanes' (two shuffles), the rescale of O is a product per element, P's A
// matrix is S's accumulator converted element by element, and O leaves the
// accumulators straight to memory. Nothing of S or P goes through shared
// memory (coopmat_pipeline.glsl has the pipeline both coopmat shaders share).
#extension GL_GOOGLE_include_directive : require
const uint KV_STAGES = 2u;  // one barrier a chunk (the chunk loop's comment says why)
#include "coopmat_pipeline.glsl"

const uint ELEMENTS = 8u;  // a lane's elements of a 16x16 matrix (subgroups of 32)

void main() {
  load_kv_bases();
  uint pass_index, kv_head;
  if (!stage1_work_group(pass_index, kv_head)) return;
  const uint tid = gl_LocalInvocationID.x;
  const uint sg = gl_SubgroupID, lane = gl_SubgroupInvocationID;
  const Pass pass = load_pass(pass_index);
  const uint tile_begin = pass.tile_begin, row_end = pass.row_end;
  const uint token_begin = pass.token_begin, tokens = pass.tokens;

  const uint sub_row0 = pass.row0 + sg * TILE;
  const bool subgroup_live = sub_row0 < row_end;
  // Lane pair (2r, 2r+1) loads row r's Q; the lane's own rows are g and g + 8.
  const uint r = lane >> 1, half_index = lane & 1u;
  const uint row = sub_row0 + r;
  const bool row_live = row < row_end;
  const uint tile_query = row_live ? row / pc.group : 0u;
  const uint head = kv_head * pc.group + (row_live ? row % pc.group : 0u);
  const uint query = plan_word(kTileQuery, tile_begin + tile_query);
  const uint g = lane >> 2, t = lane & 3u;
  // fp8: the dequantizing scales, loaded now and used by the softmax and the epilogue.
  const float logit_scale = KV_FP8 != 0u ? pc.scale_log2 * kv_scale(0u, kv_head) : pc.scale_log2;
  const float v_scale = KV_FP8 != 0u ? kv_scale(1u, kv_head) : 1.0;
  // Row g + 8h's query, head and tile query are lane pair (g + 8h)'s: by
  // shuffle, not another division and lookup chain each.
  bool own_live[2];
  uint own_tile_query[2], own_head[2], own_query[2];
  [[unroll]] for (uint h = 0u; h < 2u; ++h) {
    const uint pair_lane = 2u * (g + 8u * h);
    own_live[h] = sub_row0 + g + 8u * h < row_end;
    own_tile_query[h] = subgroupShuffle(tile_query, pair_lane);
    own_head[h] = subgroupShuffle(head, pair_lane);
    own_query[h] = subgroupShuffle(query, pair_lane);
  }

  // The pipeline's prologue (chunk 0's rows and visibility in registers, chunk 1's
  // indices) goes out beside Q's loads, before Q is staged. The partial slots
  // are loaded now and used by the epilogue: their latency hides behind the pass.
  fetch_indices(token_begin, tokens, 0u, tid);
  uvec4 q_quads[DTILES];
  load_q_row(query, head, half_index, q_quads);
  int own_partial[2];
  uint own_word[2];
  [[unroll]] for (uint h = 0u; h < 2u; ++h) {
    own_partial[h] = own_live[h] ? plan_int(kTilePartial, tile_begin + own_tile_query[h]) : kDirect;
    own_word[h] = fetch_visible(token_begin, own_tile_query[h], tokens, 0u);
  }
  gather_rows(kv_head, tid);
  fetch_indices(token_begin, tokens, CHUNK, tid);
  MAT_A q[DTILES];
  stage_q(q_quads, r, half_index, sg, q);

  ACC o[V_DTILES];
  [[unroll]] for (uint n = 0u; n < V_DTILES; ++n) o[n] = ACC(0.0);
  // Per own row: the reference (lazy, as in tree_attn_coopmat.comp) and this
  // lane's share of the sum (the four lanes' shares are added at the end).
  float running_max[2] = {kNoReference, kNoReference}, running_sum[2] = {0.0, 0.0};

  // Two K/V stages, one barrier a chunk: the stage written at the top of chunk
  // c was last read in chunk c - 2, which every subgroup left before chunk
  // c - 1's barrier. What needs no stage goes before the barrier: the next
  // chunk's loads (in flight through it) and lookups, and this chunk's
  // visibility bits (work for the wait). H100: 1.02x over one stage and two
  // barriers (docs/performance.md).
  for (uint chunk0 = 0u, stage = 0u; chunk0 < tokens; chunk0 += CHUNK, stage ^= 1u) {
    store_rows(tid, stage);
    gather_rows(kv_head, tid);
    // Bit c of row g + 8h's word: it sees token chunk0 + c (rows past the pass
    // see nothing). Shifted by 2t, each element tests a constant bit.
    uint lane_visible[2];
    [[unroll]] for (uint h = 0u; h < 2u; ++h) lane_visible[h] = own_live[h] ? own_word[h] >> (chunk0 % 32u) : 0u;
    const bool chunk_unseen = ((lane_visible[0] | lane_visible[1]) << (32u - CHUNK)) == 0u;
    [[unroll]] for (uint h = 0u; h < 2u; ++h) lane_visible[h] >>= 2u * t;
    [[unroll]] for (uint h = 0u; h < 2u; ++h) {
      own_word[h] = fetch_visible(token_begin, own_tile_query[h], tokens, chunk0 + CHUNK);
    }
    fetch_indices(token_begin, tokens, chunk0 + 2u * CHUNK, tid);
    barrier();
    if (!subgroup_live) continue;
    // A chunk that none of the subgroup's rows sees would leave their state as it is.
    if (subgroupAll(chunk_unseen)) continue;

    ACC s[STILES];
    compute_s(q, stage, s);

    // Masked online softmax of rows g and g + 8, branch-free: the visibility
    // bit selects, and a masked logit's exp2(-inf - reference) is exactly 0.
    float x[STILES][ELEMENTS];
    float chunk_max[2] = {-1.0 / 0.0, -1.0 / 0.0};
    [[unroll]] for (uint nb = 0u; nb < STILES; ++nb) {
      [[unroll]] for (uint i = 0u; i < ELEMENTS; ++i) {
        const uint h = i >> 2, column = nb * TILE + 8u * ((i >> 1) & 1u) + (i & 1u);
        float logit = s[nb][i] * logit_scale;
        if (SOFTCAP) logit = softcap(logit);
        x[nb][i] = ((lane_visible[h] >> column) & 1u) != 0u ? logit : -1.0 / 0.0;
        chunk_max[h] = max(chunk_max[h], x[nb][i]);
      }
    }
    float new_max[2], alpha[2];
    [[unroll]] for (uint h = 0u; h < 2u; ++h) {
      chunk_max[h] = max(chunk_max[h], subgroupShuffleXor(chunk_max[h], 1u));
      chunk_max[h] = max(chunk_max[h], subgroupShuffleXor(chunk_max[h], 2u));
      new_max[h] = chunk_max[h] > running_max[h] + kSlack ? chunk_max[h] : running_max[h];
      alpha[h] = new_max[h] == running_max[h] || running_max[h] == kNoReference ? 1.0
                                                                                : exp2(running_max[h] - new_max[h]);
    }
    MAT_A p[STILES];
    float sum[2] = {0.0, 0.0};
    [[unroll]] for (uint nb = 0u; nb < STILES; ++nb) {
      [[unroll]] for (uint i = 0u; i < ELEMENTS; ++i) {
        const float e = exp2(x[nb][i] - new_max[i >> 2]);
        sum[i >> 2] += e;
        p[nb][i] = float16_t(e);
      }
    }
    [[unroll]] for (uint h = 0u; h < 2u; ++h) {
      running_sum[h] = running_sum[h] * alpha[h] + sum[h];
      running_max[h] = new_max[h];
    }
    // Unconditional, though alpha is 1 on most chunks: skipped under a subgroup
    // vote, 0.95x (docs/performance.md).
    [[unroll]] for (uint n = 0u; n < V_DTILES; ++n) {
      [[unroll]] for (uint i = 0u; i < ELEMENTS; ++i) o[n][i] *= alpha[i >> 2];
    }
    [[unroll]] for (uint nb = 0u; nb < STILES; ++nb) accumulate_pv(p[nb], nb, stage, o);
  }
  if (!subgroup_live) return;

  // Normalise (every live row saw at least one token; a row written directly
  // joins its sink, V's scale applies to every row) and write straight from
  // the accumulators: elements 4h + 2c and 4h + 2c + 1 are columns 8c + 2t and
  // 8c + 2t + 1 of row g + 8h.
  float inv[2], lse2[2];
  [[unroll]] for (uint h = 0u; h < 2u; ++h) {
    float total = running_sum[h];
    total += subgroupShuffleXor(total, 1u);
    total += subgroupShuffleXor(total, 2u);
    inv[h] = own_live[h] ? 1.0 / total : 0.0;
    lse2[h] = running_max[h] + log2(total);
    if (SINKS && own_live[h] && own_partial[h] == kDirect) join_sink(own_head[h], running_max[h], total, inv[h], lse2[h]);
    if (KV_FP8 != 0u) inv[h] *= v_scale;
  }
  // One branch per row, outside its stores: a branch per store (on the row and
  // the output's kind) runs the trees of many small passes at 0.95x
  // (docs/performance.md).
  [[unroll]] for (uint h = 0u; h < 2u; ++h) {
    if (!own_live[h]) continue;
    if (own_partial[h] == kDirect) {
      const uint out0 = (own_query[h] * pc.heads_q + own_head[h]) * HEAD_DIM_V + 2u * t;
      [[unroll]] for (uint n = 0u; n < V_DTILES; ++n) {
        [[unroll]] for (uint c = 0u; c < 2u; ++c) {
          const uint i = 4u * h + 2u * c;
          store_output_pair(out0 + n * TILE + 8u * c, vec2(o[n][i], o[n][i + 1u]) * inv[h]);
        }
      }
    } else {
      const uint out0 = ((uint(own_partial[h]) * pc.heads_q + own_head[h]) * HEAD_DIM_V + 2u * t) / 2u;
      [[unroll]] for (uint n = 0u; n < V_DTILES; ++n) {
        [[unroll]] for (uint c = 0u; c < 2u; ++c) {
          const uint i = 4u * h + 2u * c;
          Vec2s(pc.partial_o).v[out0 + (n * TILE + 8u * c) / 2u] = vec2(o[n][i], o[n][i + 1u]) * inv[h];
        }
      }
    }
  }
  // The LSEs after all rows' stores (inside each row's branch: 0.99x).
  [[unroll]] for (uint h = 0u; h < 2u; ++h) {
    if (own_live[h] && t == 0u) {
      if (own_partial[h] == kDirect) {
        if (pc.lse != 0ul) Floats(pc.lse).f[own_query[h] * pc.heads_q + own_head[h]] = lse2[h] * kLn2;
      } else {
        Floats(pc.partial_lse).f[uint(own_partial[h]) * pc.heads_q + own_head[h]] = lse2[h];
      }
    }
  }
}
