#version 460
// Stage 1 on tensor cores (VK_KHR_cooperative_matrix, 16x16x16 f16 -> f32).
// One work group per (64-row pass, KV head): four subgroups of 32, each owning
// 16 rows (tile query x query head). The block's K/V rows reach shared memory
// CHUNK tokens at a time through registers, software-pipelined: while the
// subgroups compute chunk c from shared memory, every thread's loads of chunk
// c+1's rows (and of chunk c+2's slot indices) are in flight, so
// the gather's latency overlaps the math instead of preceding it. Each subgroup
// computes S = Q K^T, runs the masked online softmax on it in shared memory in
// base 2 (two lanes per row), and accumulates O += P V in accumulator
// matrices. The per-row rescale of O is a component-wise product with a matrix
// whose row r holds row r's factor (ones while no row's reference moved).
//
// Visibility comes as one word per row and chunk (bit = chunk column), half of
// the plan's visibility word for the row's tile query and 64-token tile
// (item_token_map), loaded a chunk ahead, so the softmax tests a register bit
// per column. Per-token segment masks would need a subgroup ballot per tile
// query and chunk to become such words: 16 per subgroup at one query head per
// KV head.
//
// Shared-memory layouts are chosen for the access patterns, not for simplicity:
// K/V rows are padded by 16 bytes so the 8 rows one matrix load reads start on
// different banks; S, P and the factor matrix are column-major with padded
// columns so the lanes of a softmax step (16 rows of one column) hit 16
// different banks.
//
// bf16 inputs run this same SPIR-V with its 16-bit float type declared bfloat16
// (backends/vulkan/spirv_bf16.hpp), which only works while 16-bit floats are
// bitcast, converted, stored, loaded and multiplied as matrices here, never
// computed with (test_vulkan retypes the embedded module to check).
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#extension GL_KHR_shader_subgroup_vote : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_GOOGLE_include_directive : require
#include "attn_common.glsl"

layout(local_size_x = 128) in;
layout(constant_id = 0) const uint HEAD_DIM = 128;
layout(constant_id = 1) const uint CHUNK = 32;  // tokens per shared-memory stage: 16 or 32 (one visibility word)

const uint SUBGROUPS = 4u, TILE = 16u, THREADS = 128u;
const uint DTILES = HEAD_DIM / TILE;             // 16-column tiles of a head row
const uint QUADS = HEAD_DIM / 8u;                // 16-byte pieces of a K/V row
const uint ROW_QUADS = QUADS + 1u;              // 16-byte pieces per shared K/V row, one of padding
const uint LOADS = CHUNK * QUADS / THREADS;      // 16-byte K (and V) loads per thread per chunk
const uint TOKEN_STEP = THREADS / QUADS;         // tokens between one thread's successive loads
const uint S_STRIDE = TILE + 4u;                 // floats per column of S / the factor matrix
const uint P_STRIDE = TILE + 8u;                 // halves per column of P (48 bytes: 16-byte aligned)
const float kSlack = 8.0;                        // log2 of how far P may exceed 1 before O is rescaled
const float kNoReference = -1.0e30;              // a row's reference before it sees a token (below any logit)
const uint COLUMNS = CHUNK / 2u;                 // softmax columns per lane

#define ACC coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>
#define MAT_A coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA>
#define MAT_B coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB>

// K and V rows as they arrive (16 bytes per element: one store per load);
// matrix loads reinterpret them as f16, offsets and strides in 16-byte units.
shared uvec4 k_tile[CHUNK * ROW_QUADS];
shared uvec4 v_tile[CHUNK * ROW_QUADS];
shared float scores[SUBGROUPS * CHUNK * S_STRIDE];     // S of each subgroup, then its factor / O tiles
shared float16_t probs[SUBGROUPS * CHUNK * P_STRIDE];  // P of each subgroup (also stages Q)

// Orders this subgroup's shared-memory accesses, and nothing else: subgroupBarrier()
// also acquires and releases buffer memory, which would wait for the next chunk's
// gather loads in flight and serialise the pipeline.
void subgroup_sync() {
  controlBarrier(gl_ScopeSubgroup, gl_ScopeSubgroup, gl_StorageSemanticsShared, gl_SemanticsAcquireRelease);
}

// A load is only in flight until something reads its register: a select on
// the loaded value (`past_end ? 0 : value`), or a copy where two branches
// join, waits for the data right there. So the pipeline below issues every
// load unconditionally: positions past the block read the block's first
// token, which is cached, and the visibility masks them where they are used.

// The gather's indices for the chunk after the one in flight: the pool slot of
// each token this thread loads.
uint next_slot[LOADS];

void fetch_indices(uint token_begin, uint tokens, uint chunk0, uint tid) {
  [[unroll]] for (uint j = 0u; j < LOADS; ++j) {
    const uint t = chunk0 + tid / QUADS + j * TOKEN_STEP;
    next_slot[j] = plan_word(kItemTokenSlot, token_begin + (t < tokens ? t : 0u));
  }
}

// The 32-bit half of a row's tile visibility word that holds the chunk at
// chunk0 (its tokens from bit chunk0 % 32 on; zero past the block); a chunk
// past the block reads the first one's, which is never used.
uint fetch_visible(uint token_begin, uint tile_query, uint tokens, uint chunk0) {
  const uint c = chunk0 < tokens ? chunk0 : 0u;
  return visible_word((token_begin + c) / kKvTileTokens, tile_query, (c / 32u) % 2u);
}

// The K and V rows of next_slot[] (16 bytes each), issued and left in flight.
uvec4 k_rows[LOADS], v_rows[LOADS];

void gather_rows(uint kv_head, uint quad) {
  if (pc.num_chunks == 1u) {
    [[unroll]] for (uint j = 0u; j < LOADS; ++j) {
      const uint index = (next_slot[j] * pc.heads_kv + kv_head) * QUADS + quad;
      k_rows[j] = Quads(kv_base[0]).q[index];
      v_rows[j] = Quads(kv_base[1]).q[index];
    }
  } else {
    [[unroll]] for (uint j = 0u; j < LOADS; ++j) {
      k_rows[j] = kv_quad_chunked(0u, next_slot[j], kv_head, quad, QUADS);
      v_rows[j] = kv_quad_chunked(1u, next_slot[j], kv_head, quad, QUADS);
    }
  }
}

void main() {
  load_kv_bases();
  uint pass_index, kv_head;
  if (!stage1_work_group(pass_index, kv_head)) return;
  const uint tid = gl_LocalInvocationID.x;
  const uint sg = gl_SubgroupID, lane = gl_SubgroupInvocationID;
  const Pass pass = load_pass(pass_index);
  const uint tile_begin = pass.tile_begin, tile_rows = pass.tile_rows;
  const uint token_begin = pass.token_begin, tokens = pass.tokens;

  // Lane pair (2r, 2r+1) owns row r of the subgroup's 16; lane h of the pair the
  // columns 2j + h of each chunk (and columns 8h..8h+7 of a 16x16 tile).
  const uint sub_row0 = pass.row0 + sg * TILE;
  const bool subgroup_live = sub_row0 < tile_rows;
  const uint r = lane >> 1, half_index = lane & 1u;
  const uint row = sub_row0 + r;
  const bool row_live = row < tile_rows;
  const uint tile_query = row_live ? row / pc.group : 0u;
  const uint head = kv_head * pc.group + (row_live ? row % pc.group : 0u);
  const uint query = plan_word(kTileQuery, tile_begin + tile_query);
  // Loaded now, used by the epilogue: its latency hides behind the whole pass.
  const int partial_slot = row_live ? plan_int(kTilePartial, tile_begin + tile_query) : kDirect;
  const uint sg_s = sg * CHUNK * S_STRIDE, sg_p = sg * CHUNK * P_STRIDE;

  // The pipeline's prologue (chunk 0's rows and visibility in registers, chunk 1's
  // indices) goes out beside Q's loads: chunk 0's slots are fetched with Q's
  // query and its rows leave with Q's rows, instead of after Q is staged.
  const uint quad = tid % QUADS;
  fetch_indices(token_begin, tokens, 0u, tid);
  // Q into A matrices, 16 columns at a time through the subgroup's P area. All
  // of the row's loads are issued first: between syncs they would be issued one
  // after another, each paying the full memory latency.
  uvec4 q_quads[DTILES];
  [[unroll]] for (uint k = 0u; k < DTILES; ++k) {
    q_quads[k] = row_live ? Quads(pc.q).q[((query * pc.heads_q + head) * HEAD_DIM + k * TILE) / 8u + half_index] : uvec4(0u);
  }
  uint row_word = fetch_visible(token_begin, tile_query, tokens, 0u);
  gather_rows(kv_head, quad);
  fetch_indices(token_begin, tokens, CHUNK, tid);
  MAT_A q[DTILES];
  [[unroll]] for (uint k = 0u; k < DTILES; ++k) {
    [[unroll]] for (uint c = 0u; c < 4u; ++c) {
      const f16vec2 pair = unpackFloat2x16(q_quads[k][c]);
      probs[sg_p + (half_index * 8u + 2u * c) * P_STRIDE + r] = pair.x;
      probs[sg_p + (half_index * 8u + 2u * c + 1u) * P_STRIDE + r] = pair.y;
    }
    subgroup_sync();
    coopMatLoad(q[k], probs, sg_p, P_STRIDE, gl_CooperativeMatrixLayoutColumnMajor);
    subgroup_sync();
  }

  ACC o[DTILES];
  [[unroll]] for (uint n = 0u; n < DTILES; ++n) o[n] = ACC(0.0);
  float running_max = kNoReference, running_sum = 0.0;

  for (uint chunk0 = 0u; chunk0 < tokens; chunk0 += CHUNK) {
    barrier();  // every subgroup is done with the previous chunk's K and V
    // Positions past the block hold its first token's rows: finite, and no row
    // sees them, so their P is exactly 0 and they add nothing to O.
    [[unroll]] for (uint j = 0u; j < LOADS; ++j) {
      const uint at = (tid / QUADS + j * TOKEN_STEP) * ROW_QUADS + quad;
      k_tile[at] = k_rows[j];
      v_tile[at] = v_rows[j];
    }
    barrier();

    // Bit c: the row sees token chunk0 + c (rows past the pass see nothing).
    const uint visible = row_live ? row_word >> (chunk0 % 32u) : 0u;
    // Bit 2j: this lane's column j (shifted once here, so each column tests a constant bit).
    const uint lane_visible = visible >> half_index;

    // Issue the next chunk's loads now; they land while this chunk is computed.
    // After the last chunk they reread the block's first token (cached), so no
    // branch joins loaded registers.
    gather_rows(kv_head, quad);
    row_word = fetch_visible(token_begin, tile_query, tokens, chunk0 + CHUNK);
    fetch_indices(token_begin, tokens, chunk0 + 2u * CHUNK, tid);
    if (!subgroup_live) continue;
    // A chunk that none of the subgroup's rows sees would leave their state as
    // it is (P = 0, no rescale): skip its math (deep trees' passes hold many).
    if (subgroupAll(visible << (32u - CHUNK) == 0u)) continue;

    // S = Q K^T: B(k, n) = K[token n][dim k] (K read column-major). The 16-token
    // blocks' accumulations are interleaved: independent chains of matrix
    // products overlap their latency instead of queueing behind one another.
    ACC s[CHUNK / TILE];
    [[unroll]] for (uint nb = 0u; nb < CHUNK / TILE; ++nb) s[nb] = ACC(0.0);
    [[unroll]] for (uint k = 0u; k < DTILES; ++k) {
      [[unroll]] for (uint nb = 0u; nb < CHUNK / TILE; ++nb) {
        MAT_B kt;
        coopMatLoad(kt, k_tile, nb * TILE * ROW_QUADS + k * (TILE / 8u), ROW_QUADS,
                    gl_CooperativeMatrixLayoutColumnMajor);
        s[nb] = coopMatMulAdd(q[k], kt, s[nb]);
      }
    }
    [[unroll]] for (uint nb = 0u; nb < CHUNK / TILE; ++nb) {
      coopMatStore(s[nb], scores, sg_s + nb * TILE * S_STRIDE, S_STRIDE, gl_CooperativeMatrixLayoutColumnMajor);
    }
    subgroup_sync();

    // Masked online softmax of row r over this chunk (this lane: every other
    // column), branch-free: every column's S is loaded, the visibility bit selects.
    float x[COLUMNS];
    float chunk_max = -1.0 / 0.0;
    [[unroll]] for (uint j = 0u; j < COLUMNS; ++j) {
      const float logit = scores[sg_s + r + (2u * j + half_index) * S_STRIDE] * pc.scale_log2;
      x[j] = ((lane_visible >> (2u * j)) & 1u) != 0u ? logit : -1.0 / 0.0;
      chunk_max = max(chunk_max, x[j]);
    }
    chunk_max = max(chunk_max, subgroupShuffleXor(chunk_max, 1u));
    // The row's reference moves only when a logit passes it by more than
    // kSlack, so P stays below 2^kSlack (well inside f16) and O, whose rescale
    // goes through shared memory and two subgroup barriers, is rescaled about
    // once per row instead of on most of a block's first chunks. Until the row
    // sees a token its reference is kNoReference, finite, so a masked logit's
    // exp2(-inf - reference) is exactly 0 with no select.
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
    // (a rescale in the branch made the driver copy half of O's accumulators
    // out and back around each chunk's P V products).
    ACC factor = ACC(1.0);
    if (rescale) coopMatLoad(factor, scores, sg_s, S_STRIDE, gl_CooperativeMatrixLayoutColumnMajor);
    [[unroll]] for (uint n = 0u; n < DTILES; ++n) o[n] = o[n] * factor;
    [[unroll]] for (uint nb = 0u; nb < CHUNK / TILE; ++nb) {
      MAT_A p;
      coopMatLoad(p, probs, sg_p + nb * TILE * P_STRIDE, P_STRIDE, gl_CooperativeMatrixLayoutColumnMajor);
      [[unroll]] for (uint n = 0u; n < DTILES; ++n) {
        MAT_B v;
        coopMatLoad(v, v_tile, nb * TILE * ROW_QUADS + n * (TILE / 8u), ROW_QUADS, gl_CooperativeMatrixLayoutRowMajor);
        o[n] = coopMatMulAdd(p, v, o[n]);
      }
    }
    subgroup_sync();  // P and the factors are read before the next chunk's S overwrites them
  }
  if (!subgroup_live) return;

  // Normalise (every live row saw at least one token: running_sum > 0), then
  // write each 16x16 tile through shared memory: lane pair per row, 8 columns each.
  const float inv = row_live ? 1.0 / running_sum : 0.0;
  [[unroll]] for (uint c = half_index * 8u; c < half_index * 8u + 8u; ++c) scores[sg_s + c * S_STRIDE + r] = inv;
  subgroup_sync();
  ACC factor;
  coopMatLoad(factor, scores, sg_s, S_STRIDE, gl_CooperativeMatrixLayoutColumnMajor);
  subgroup_sync();  // the factors are in registers before the first tile overwrites them
  const float lse2 = running_max + log2(running_sum);
  [[unroll]] for (uint n = 0u; n < DTILES; ++n) {
    coopMatStore(o[n] * factor, scores, sg_s, S_STRIDE, gl_CooperativeMatrixLayoutColumnMajor);
    subgroup_sync();
    if (row_live) {
      const uint col0 = n * TILE + half_index * 8u;
      float value[8];
      [[unroll]] for (uint c = 0u; c < 8u; ++c) value[c] = scores[sg_s + (half_index * 8u + c) * S_STRIDE + r];
      if (partial_slot == kDirect) {
        const uint out0 = (query * pc.heads_q + head) * HEAD_DIM + col0;
        [[unroll]] for (uint c = 0u; c < 8u; c += 2u) store_output_pair(out0 + c, vec2(value[c], value[c + 1u]));
      } else {
        const uint out0 = (uint(partial_slot) * pc.heads_q + head) * HEAD_DIM + col0;
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
