#version 460
// Stage 1 on tensor cores, for any cooperative-matrix layout (coopmat_pipeline.glsl
// has the pipeline both coopmat shaders share). S goes through shared memory:
// lane pair (2r, 2r+1) runs row r's online softmax there (lane h of the pair the
// columns 2j + h of each chunk) and writes P back as an A matrix. The per-row
// rescale of O is a component-wise product with a matrix whose row r holds row
// r's factor (ones while no row's reference moved).
//
// S, P and the factor matrix are column-major with padded columns so the lanes
// of a softmax step (16 rows of one column) hit 16 different banks.
#extension GL_GOOGLE_include_directive : require
const uint KV_STAGES = 1u;  // S and P take the shared memory a second stage would
#include "coopmat_pipeline.glsl"

const uint S_STRIDE = TILE + 4u;  // floats per column of S / the factor matrix
const uint P_STRIDE = TILE + 8u;  // halves per column of P (48 bytes: 16-byte aligned)
const uint COLUMNS = CHUNK / 2u;  // softmax columns per lane

shared float scores[SUBGROUPS * CHUNK * S_STRIDE];     // S of each subgroup, then its factor / O tiles
shared float16_t probs[SUBGROUPS * CHUNK * P_STRIDE];  // P of each subgroup

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
  const uint r = lane >> 1, half_index = lane & 1u;
  const uint row = sub_row0 + r;
  const bool row_live = row < row_end;
  const uint tile_query = row_live ? row / pc.group : 0u;
  const uint head = kv_head * pc.group + (row_live ? row % pc.group : 0u);
  const uint query = plan_word(kTileQuery, tile_begin + tile_query);
  // Loaded now, used by the epilogue: its latency hides behind the whole pass.
  const int partial_slot = row_live ? plan_int(kTilePartial, tile_begin + tile_query) : kDirect;
  const uint sg_s = sg * CHUNK * S_STRIDE, sg_p = sg * CHUNK * P_STRIDE;
  // fp8: the dequantizing scales, loaded now and used by the softmax and the epilogue.
  const float logit_scale = KV_FP8 != 0u ? pc.scale_log2 * kv_scale(0u, kv_head) : pc.scale_log2;
  const float v_scale = KV_FP8 != 0u ? kv_scale(1u, kv_head) : 1.0;

  // The pipeline's prologue (chunk 0's rows and visibility in registers, chunk 1's
  // indices) goes out beside Q's loads, before Q is staged.
  fetch_indices(token_begin, tokens, 0u, tid);
  uvec4 q_quads[DTILES];
  load_q_row(query, head, half_index, q_quads);
  uint row_word = fetch_visible(token_begin, tile_query, tokens, 0u);
  gather_rows(kv_head, tid);
  fetch_indices(token_begin, tokens, CHUNK, tid);
  MAT_A q[DTILES];
  stage_q(q_quads, r, half_index, sg, q);

  ACC o[V_DTILES];
  [[unroll]] for (uint n = 0u; n < V_DTILES; ++n) o[n] = ACC(0.0);
  float running_max = kNoReference, running_sum = 0.0;

  for (uint chunk0 = 0u; chunk0 < tokens; chunk0 += CHUNK) {
    barrier();  // every subgroup is done with the previous chunk's K and V
    store_rows(tid, 0u);
    barrier();

    // Bit c: the row sees token chunk0 + c (rows past the pass see nothing).
    const uint visible = row_live ? row_word >> (chunk0 % 32u) : 0u;
    // Bit 2j: this lane's column j (shifted once here, so each column tests a constant bit).
    const uint lane_visible = visible >> half_index;

    // Issue the next chunk's loads now; they land while this chunk is computed.
    // After the last chunk they reread the block's first token (cached), so no
    // branch joins loaded registers.
    gather_rows(kv_head, tid);
    row_word = fetch_visible(token_begin, tile_query, tokens, chunk0 + CHUNK);
    fetch_indices(token_begin, tokens, chunk0 + 2u * CHUNK, tid);
    if (!subgroup_live) continue;
    // A chunk that none of the subgroup's rows sees would leave their state as
    // it is (P = 0, no rescale): skip its math (deep trees' passes hold many).
    if (subgroupAll(visible << (32u - CHUNK) == 0u)) continue;

    ACC s[STILES];
    compute_s(q, 0u, s);
    [[unroll]] for (uint nb = 0u; nb < STILES; ++nb) {
      coopMatStore(s[nb], scores, sg_s + nb * TILE * S_STRIDE, S_STRIDE, gl_CooperativeMatrixLayoutColumnMajor);
    }
    subgroup_sync();

    // Masked online softmax of row r over this chunk (this lane: every other
    // column), branch-free: every column's S is loaded, the visibility bit selects.
    float x[COLUMNS];
    float chunk_max = -1.0 / 0.0;
    [[unroll]] for (uint j = 0u; j < COLUMNS; ++j) {
      float logit = scores[sg_s + r + (2u * j + half_index) * S_STRIDE] * logit_scale;
      if (SOFTCAP) logit = softcap(logit);
      x[j] = ((lane_visible >> (2u * j)) & 1u) != 0u ? logit : -1.0 / 0.0;
      chunk_max = max(chunk_max, x[j]);
    }
    chunk_max = max(chunk_max, subgroupShuffleXor(chunk_max, 1u));
    // The row's reference moves only when a logit passes it by more than
    // kSlack, so P stays below 2^kSlack (well inside f16) and O is rescaled
    // about once per row instead of on most of a block's first chunks. Until
    // the row sees a token its reference is kNoReference, finite, so a masked
    // logit's exp2(-inf - reference) is exactly 0 with no select.
    const float new_max = chunk_max > running_max + kSlack ? chunk_max : running_max;
    // alpha = 1 while the row has seen nothing (O is still zero) or its reference stayed.
    const float alpha = new_max == running_max || running_max == kNoReference ? 1.0 : exp2(running_max - new_max);
    float sum = 0.0;
    [[unroll]] for (uint j = 0u; j < COLUMNS; ++j) {
      const float p = exp2(x[j] - new_max);
      sum += p;
      probs[sg_p + (2u * j + half_index) * P_STRIDE + r] = float16_t(p);
    }
    sum += subgroupShuffleXor(sum, 1u);
    running_sum = running_sum * alpha + sum;
    running_max = new_max;

    // O = O * alpha (per row) + P V; the factor matrix goes where S was.
    const bool rescale = subgroupAny(alpha != 1.0);
    if (rescale) {
      subgroup_sync();  // every lane has read its S before the factors overwrite it
      [[unroll]] for (uint c = half_index * 8u; c < half_index * 8u + 8u; ++c) scores[sg_s + c * S_STRIDE + r] = alpha;
    }
    subgroup_sync();
    // O is multiplied on every chunk, by ones unless a reference moved: only
    // the factor matrix differs between the paths, so O keeps its registers
    // (with a rescale in the branch the driver copies half of O's accumulators
    // out and back around each chunk's P V products).
    ACC factor = ACC(1.0);
    if (rescale) coopMatLoad(factor, scores, sg_s, S_STRIDE, gl_CooperativeMatrixLayoutColumnMajor);
    [[unroll]] for (uint n = 0u; n < V_DTILES; ++n) o[n] = o[n] * factor;
    [[unroll]] for (uint nb = 0u; nb < STILES; ++nb) {
      MAT_A p;
      coopMatLoad(p, probs, sg_p + nb * TILE * P_STRIDE, P_STRIDE, gl_CooperativeMatrixLayoutColumnMajor);
      accumulate_pv(p, nb, 0u, o);
    }
    subgroup_sync();  // P and the factors are read before the next chunk's S overwrites them
  }
  if (!subgroup_live) return;

  // Normalise (every live row saw at least one token: running_sum > 0; a row
  // written directly joins its sink, V's scale applies to every row), then
  // write each 16x16 tile through shared memory: lane pair per row, 8 columns each.
  float inv = row_live ? 1.0 / running_sum : 0.0;
  float lse2 = running_max + log2(running_sum);
  if (SINKS && row_live && partial_slot == kDirect) join_sink(head, running_max, running_sum, inv, lse2);
  if (KV_FP8 != 0u) inv *= v_scale;
  [[unroll]] for (uint c = half_index * 8u; c < half_index * 8u + 8u; ++c) scores[sg_s + c * S_STRIDE + r] = inv;
  subgroup_sync();
  ACC factor;
  coopMatLoad(factor, scores, sg_s, S_STRIDE, gl_CooperativeMatrixLayoutColumnMajor);
  subgroup_sync();  // the factors are in registers before the first tile overwrites them
  [[unroll]] for (uint n = 0u; n < V_DTILES; ++n) {
    coopMatStore(o[n] * factor, scores, sg_s, S_STRIDE, gl_CooperativeMatrixLayoutColumnMajor);
    subgroup_sync();
    if (row_live) {
      const uint col0 = n * TILE + half_index * 8u;
      float value[8];
      [[unroll]] for (uint c = 0u; c < 8u; ++c) value[c] = scores[sg_s + (half_index * 8u + c) * S_STRIDE + r];
      if (partial_slot == kDirect) {
        const uint out0 = (query * pc.heads_q + head) * HEAD_DIM_V + col0;
        [[unroll]] for (uint c = 0u; c < 8u; c += 2u) store_output_pair(out0 + c, vec2(value[c], value[c + 1u]));
      } else {
        const uint out0 = (uint(partial_slot) * pc.heads_q + head) * HEAD_DIM_V + col0;
        Vec4s(pc.partial_o).v[out0 / 4u] = vec4(value[0], value[1], value[2], value[3]);
        Vec4s(pc.partial_o).v[out0 / 4u + 1u] = vec4(value[4], value[5], value[6], value[7]);
      }
    }
    subgroup_sync();
  }
  if (row_live && half_index == 0u) {
    if (partial_slot == kDirect) {
      if (pc.lse != 0ul) Floats(pc.lse).f[query * pc.heads_q + head] = lse2 * kLn2;
    } else {
      Floats(pc.partial_lse).f[uint(partial_slot) * pc.heads_q + head] = lse2;
    }
  }
}
