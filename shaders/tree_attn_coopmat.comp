#version 460
// Stage 1 on tensor cores (VK_KHR_cooperative_matrix, 16x16x16 f16 -> f32).
// One work group per (64-row pass, KV head): four subgroups of 32, each owning
// 16 rows (tile query x query head). The block's K/V rows are gathered into
// shared memory CHUNK tokens at a time by the whole group; each subgroup then
// computes S = Q K^T into shared memory, runs the masked online softmax there in
// base 2 (two lanes per row), and accumulates O += P V in accumulator matrices.
// The per-row rescale of O is a component-wise product with a matrix whose row r
// holds row r's factor, so O never leaves the accumulators until the end.
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_GOOGLE_include_directive : require
#include "attn_common.glsl"

layout(local_size_x = 128) in;
layout(constant_id = 0) const uint HEAD_DIM = 128;
layout(constant_id = 1) const uint CHUNK = 32;  // tokens per shared-memory stage, a multiple of 16

const uint SUBGROUPS = 4u, TILE = 16u, THREADS = 128u;
const uint DTILES = HEAD_DIM / TILE;   // 16-column tiles of a head row
const uint VEC4S = HEAD_DIM / 4u;      // f16vec4 per K/V row in shared memory
const uint LOADS = CHUNK * (HEAD_DIM / 8u) / THREADS;  // 16-byte K (and V) loads per thread per chunk

#define ACC coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>
#define MAT_A coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA>
#define MAT_B coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB>

shared f16vec4 k_tile[CHUNK * VEC4S];
shared f16vec4 v_tile[CHUNK * VEC4S];
shared uvec2 token_mask[CHUNK];
shared float scores[SUBGROUPS * TILE * CHUNK];      // S of each subgroup's 16 rows, row-major
shared float16_t probs[SUBGROUPS * TILE * CHUNK];   // P (also stages Q, 16 columns at a time)
shared float row_factor[SUBGROUPS * TILE * TILE];   // row r of a 16x16 tile = row r's factor

void subgroup_sync() {
  subgroupMemoryBarrierShared();
  subgroupBarrier();
}

void main() {
  load_plan_header();
  const uint pass_index = gl_WorkGroupID.x, kv_head = gl_WorkGroupID.y, tid = gl_LocalInvocationID.x;
  const uint sg = gl_SubgroupID, lane = gl_SubgroupInvocationID;
  const uint item = plan_word(kPassItem, pass_index);
  const uint block = plan_word(kItemBlock, item);
  const uint tile_begin = plan_word(kItemQueryBegin, item);
  const uint tile_rows = (plan_word(kItemQueryBegin, item + 1u) - tile_begin) * pc.group;
  const uint mask_begin = plan_word(kItemMaskBegin, item);
  const uint token_begin = plan_word(kBlockTokenBegin, block);
  const uint tokens = plan_word(kBlockTokenBegin, block + 1u) - token_begin;

  // Lane pair (2r, 2r+1) owns row r of the subgroup's 16; each lane half the columns.
  const uint sub_row0 = plan_word(kPassRow, pass_index) + sg * TILE;
  const bool subgroup_live = sub_row0 < tile_rows;
  const uint r = lane >> 1, half_index = lane & 1u;
  const uint row = sub_row0 + r;
  const bool row_live = row < tile_rows;
  const uint tile_query = row_live ? row / pc.group : 0u;
  const uint head = kv_head * pc.group + (row_live ? row % pc.group : 0u);
  const uint query = plan_word(kTileQuery, tile_begin + tile_query);
  const uint sg_scores = sg * TILE * CHUNK, sg_factor = sg * TILE * TILE;

  // Q into A matrices, 16 columns at a time through the subgroup's P area.
  MAT_A q[DTILES];
  [[unroll]] for (uint k = 0u; k < DTILES; ++k) {
    const uvec4 eight = row_live ? Quads(pc.q).q[((query * pc.heads_q + head) * HEAD_DIM + k * TILE) / 8u + half_index]
                                 : uvec4(0u);
    [[unroll]] for (uint c = 0u; c < 4u; ++c) {
      const f16vec2 pair = unpackFloat2x16(eight[c]);
      probs[sg_scores + r * CHUNK + half_index * 8u + 2u * c] = pair.x;
      probs[sg_scores + r * CHUNK + half_index * 8u + 2u * c + 1u] = pair.y;
    }
    subgroup_sync();
    coopMatLoad(q[k], probs, sg_scores, CHUNK, gl_CooperativeMatrixLayoutRowMajor);
    subgroup_sync();
  }

  ACC o[DTILES];
  [[unroll]] for (uint n = 0u; n < DTILES; ++n) o[n] = ACC(0.0);
  float running_max = -1.0 / 0.0, running_sum = 0.0;

  for (uint chunk0 = 0u; chunk0 < tokens; chunk0 += CHUNK) {
    const uint count = min(CHUNK, tokens - chunk0);
    barrier();
    // All of this thread's loads are issued before any is stored: the gather's
    // latency is paid once per chunk, not once per load.
    uvec4 k[LOADS], v[LOADS];
    [[unroll]] for (uint j = 0u; j < LOADS; ++j) {
      const uint i = tid + j * THREADS, t = i / (HEAD_DIM / 8u), quad = i % (HEAD_DIM / 8u);
      k[j] = uvec4(0u);  // tokens past the block: zeros (finite, masked out)
      v[j] = uvec4(0u);
      if (t < count) {
        const uint slot = plan_word(kBlockTokenSlot, token_begin + chunk0 + t);
        k[j] = kv_quad(0u, slot, kv_head, quad, HEAD_DIM / 8u);
        v[j] = kv_quad(1u, slot, kv_head, quad, HEAD_DIM / 8u);
      }
    }
    [[unroll]] for (uint j = 0u; j < LOADS; ++j) {
      const uint i = tid + j * THREADS, t = i / (HEAD_DIM / 8u), quad = i % (HEAD_DIM / 8u);
      k_tile[t * VEC4S + 2u * quad] = f16vec4(unpackFloat2x16(k[j].x), unpackFloat2x16(k[j].y));
      k_tile[t * VEC4S + 2u * quad + 1u] = f16vec4(unpackFloat2x16(k[j].z), unpackFloat2x16(k[j].w));
      v_tile[t * VEC4S + 2u * quad] = f16vec4(unpackFloat2x16(v[j].x), unpackFloat2x16(v[j].y));
      v_tile[t * VEC4S + 2u * quad + 1u] = f16vec4(unpackFloat2x16(v[j].z), unpackFloat2x16(v[j].w));
    }
    if (tid < CHUNK) {
      token_mask[tid] = tid < count ? segment_mask(mask_begin + token_segment(token_begin + chunk0 + tid)) : uvec2(0u);
    }
    barrier();
    if (!subgroup_live) continue;

    // S = Q K^T, 16 tokens at a time: B(k, n) = K[token n][dim k] (K read column-major).
    [[unroll]] for (uint nb = 0u; nb < CHUNK / TILE; ++nb) {
      ACC s = ACC(0.0);
      [[unroll]] for (uint k = 0u; k < DTILES; ++k) {
        MAT_B kt;
        coopMatLoad(kt, k_tile, nb * TILE * VEC4S + k * (TILE / 4u), VEC4S, gl_CooperativeMatrixLayoutColumnMajor);
        s = coopMatMulAdd(q[k], kt, s);
      }
      coopMatStore(s, scores, sg_scores + nb * TILE, CHUNK, gl_CooperativeMatrixLayoutRowMajor);
    }
    subgroup_sync();

    // Masked online softmax of row r over this chunk (this lane: half the columns).
    const uint c0 = half_index * (CHUNK / 2u);
    float chunk_max = -1.0 / 0.0;
    for (uint c = c0; c < c0 + CHUNK / 2u; ++c) {
      if (row_live && mask_has(token_mask[c], tile_query)) chunk_max = max(chunk_max, scores[sg_scores + r * CHUNK + c] * pc.scale_log2);
    }
    chunk_max = max(chunk_max, subgroupShuffleXor(chunk_max, 1u));
    const float new_max = max(running_max, chunk_max);
    const float alpha = new_max == running_max ? 1.0 : exp2(running_max - new_max);
    float sum = 0.0;
    for (uint c = c0; c < c0 + CHUNK / 2u; ++c) {
      const bool visible = row_live && mask_has(token_mask[c], tile_query);
      const float p = visible ? exp2(scores[sg_scores + r * CHUNK + c] * pc.scale_log2 - new_max) : 0.0;
      sum += p;
      probs[sg_scores + r * CHUNK + c] = float16_t(p);
    }
    sum += subgroupShuffleXor(sum, 1u);
    running_sum = running_sum * alpha + sum;
    running_max = new_max;
    for (uint c = half_index * 8u; c < half_index * 8u + 8u; ++c) row_factor[sg_factor + r * TILE + c] = alpha;
    subgroup_sync();

    // O = O * alpha (per row) + P V.
    ACC factor;
    coopMatLoad(factor, row_factor, sg_factor, TILE, gl_CooperativeMatrixLayoutRowMajor);
    [[unroll]] for (uint n = 0u; n < DTILES; ++n) o[n] = o[n] * factor;
    [[unroll]] for (uint nb = 0u; nb < CHUNK / TILE; ++nb) {
      MAT_A p;
      coopMatLoad(p, probs, sg_scores + nb * TILE, CHUNK, gl_CooperativeMatrixLayoutRowMajor);
      [[unroll]] for (uint n = 0u; n < DTILES; ++n) {
        MAT_B v;
        coopMatLoad(v, v_tile, nb * TILE * VEC4S + n * (TILE / 4u), VEC4S, gl_CooperativeMatrixLayoutRowMajor);
        o[n] = coopMatMulAdd(p, v, o[n]);
      }
    }
    subgroup_sync();
  }
  if (!subgroup_live) return;

  // Normalise (every live row saw at least one token: running_sum > 0), then
  // write each 16x16 tile through shared memory: lane pair per row, 8 columns each.
  const float inv = row_live ? 1.0 / running_sum : 0.0;
  for (uint c = half_index * 8u; c < half_index * 8u + 8u; ++c) row_factor[sg_factor + r * TILE + c] = inv;
  subgroup_sync();
  ACC factor;
  coopMatLoad(factor, row_factor, sg_factor, TILE, gl_CooperativeMatrixLayoutRowMajor);
  const int partial_slot = row_live ? plan_int(kTilePartial, tile_begin + tile_query) : kDirect;
  const float lse2 = running_max + log2(running_sum);
  [[unroll]] for (uint n = 0u; n < DTILES; ++n) {
    coopMatStore(o[n] * factor, scores, sg_scores, CHUNK, gl_CooperativeMatrixLayoutRowMajor);
    subgroup_sync();
    if (row_live) {
      const uint col0 = n * TILE + half_index * 8u;
      if (partial_slot == kDirect) {
        const uint out0 = (query * pc.heads_q + head) * HEAD_DIM + col0;
        for (uint c = 0u; c < 8u; c += 2u) {
          store_output_pair(out0 + c, vec2(scores[sg_scores + r * CHUNK + half_index * 8u + c],
                                           scores[sg_scores + r * CHUNK + half_index * 8u + c + 1u]));
        }
      } else {
        const uint out0 = (uint(partial_slot) * pc.heads_q + head) * HEAD_DIM + col0;
        for (uint c = 0u; c < 8u; ++c) Floats(pc.partial_o).f[out0 + c] = scores[sg_scores + r * CHUNK + half_index * 8u + c];
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
