// Shared by the two cooperative-matrix stage-1 shaders (VK_KHR_cooperative_matrix,
// 16x16x16 f16 -> f32): tree_attn_coopmat.comp runs the softmax through shared
// memory and works with any accumulator layout; tree_attn_coopmat_fragments.comp
// runs it in registers where the layout is known (coopmat_layout.comp probes it).
//
// One work group per (64-row pass, KV head): four subgroups of 32, each owning
// 16 rows (tile query x query head). The block's K/V rows reach shared memory
// CHUNK tokens at a time through registers, software-pipelined: while the
// subgroups compute chunk c from shared memory, every thread's loads of chunk
// c+1's rows (and of chunk c+2's slot indices) are in flight, so the gather's
// latency overlaps the math instead of preceding it. Each subgroup computes
// S = Q K^T, the masked online softmax in base 2, and O += P V in accumulator
// matrices.
//
// Visibility comes as one word per row and chunk (bit = chunk column), half of
// the plan's visibility word for the row's tile query and 64-token tile
// (item_token_map), loaded a chunk ahead, so the softmax tests a register bit
// per column.
//
// K/V rows in shared memory are padded by 16 bytes so the 8 rows one matrix
// load reads start on different banks. fp8 K and V (KV_FP8) arrive 16 elements a
// load and are decoded to f16 (bf16) on their way into shared memory, after the
// loads have landed: the matrices stay 16-bit.
//
// bf16 inputs run the same SPIR-V with its 16-bit float type declared bfloat16
// (backends/vulkan/spirv_bf16.hpp), which only works while 16-bit floats are
// bitcast, converted, stored, loaded and multiplied as matrices, never computed
// with (test_vulkan retypes both embedded modules to check).
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
const uint DTILES = HEAD_DIM / TILE;             // 16-column tiles of a Q/K row
const uint V_DTILES = HEAD_DIM_V / TILE;         // of a V/O row
const uint STILES = CHUNK / TILE;                // 16-token tiles of a chunk
const uint QUADS = HEAD_DIM / 8u;                // 16-byte pieces (8 elements) of a K row
const uint V_QUADS = HEAD_DIM_V / 8u;
const uint ROW_QUADS = QUADS + 1u;              // 16-byte pieces per shared K row, one of padding
const uint V_ROW_QUADS = V_QUADS + 1u;
const uint FETCHES = QUADS / FETCH_QUADS;        // 16-byte loads of a K row in memory
const uint V_FETCHES = V_QUADS / FETCH_QUADS;
const uint LOADS = (CHUNK * FETCHES + THREADS - 1u) / THREADS;  // 16-byte K loads per thread per chunk
const uint V_LOADS = (CHUNK * V_FETCHES + THREADS - 1u) / THREADS;
const uint Q_STRIDE = TILE + 8u;                 // halves per column of a staged Q tile (48 bytes: 16-byte aligned)
const float kSlack = 8.0;                        // log2 of how far P may exceed 1 before O is rescaled
const float kNoReference = -1.0e30;              // a row's reference before it sees a token (below any logit)

#define ACC coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>
#define MAT_A coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA>
#define MAT_B coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB>

// K and V rows as they arrive (16 bytes per element: one store per load);
// matrix loads reinterpret them as f16, offsets and strides in 16-byte units.
// KV_STAGES chunks of them (the including shader declares KV_STAGES: with two,
// a chunk's rows go into one stage while subgroups still read the other).
const uint STAGE_QUADS = CHUNK * ROW_QUADS;  // one stage of the K tile
const uint V_STAGE_QUADS = CHUNK * V_ROW_QUADS;
shared uvec4 k_tile[KV_STAGES * STAGE_QUADS];
shared uvec4 v_tile[KV_STAGES * V_STAGE_QUADS];
shared float16_t q_stage[SUBGROUPS * TILE * Q_STRIDE];  // one 16x16 Q tile per subgroup on its way to registers

// Orders this subgroup's shared-memory accesses, and nothing else: subgroupBarrier()
// also acquires and releases buffer memory, which would wait for the next chunk's
// gather loads in flight and serialise the pipeline.
void subgroup_sync() {
  controlBarrier(gl_ScopeSubgroup, gl_ScopeSubgroup, gl_StorageSemanticsShared, gl_SemanticsAcquireRelease);
}

// A load is only in flight until something reads its register: a select on
// the loaded value (`past_end ? 0 : value`), or a copy where two branches
// join, waits for the data right there. So the pipeline issues every load
// unconditionally: positions past the block read the block's first token,
// which is cached, and the visibility masks them where they are used.

// The token (x) and 16-byte load (y) of a row of `fetches` loads that a
// thread's load j of a chunk carries: each thread the same part of every few
// tokens where `fetches` divides the work group (head_dim 64, 128, 256), else
// the work group's loads laid over the chunk in order.
uvec2 gather_place(uint tid, uint j, uint fetches) {
  if (THREADS % fetches == 0u) return uvec2(tid / fetches + j * (THREADS / fetches), tid % fetches);
  return uvec2((tid + j * THREADS) / fetches, (tid + j * THREADS) % fetches);
}

// The gather's indices for the chunk after the one in flight: the pool slot of
// each token this thread loads (of K's rows, and of V's where they differ).
uint next_slot[LOADS], next_v_slot[V_LOADS];

uint gather_slot(uint token_begin, uint tokens, uint t) {
  return plan_word(kItemTokenSlot, token_begin + (t < tokens ? t : 0u));
}

void fetch_indices(uint token_begin, uint tokens, uint chunk0, uint tid) {
  [[unroll]] for (uint j = 0u; j < LOADS; ++j) {
    next_slot[j] = gather_slot(token_begin, tokens, chunk0 + gather_place(tid, j, FETCHES).x);
  }
  if (V_FETCHES != FETCHES) {
    [[unroll]] for (uint j = 0u; j < V_LOADS; ++j) {
      next_v_slot[j] = gather_slot(token_begin, tokens, chunk0 + gather_place(tid, j, V_FETCHES).x);
    }
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
uvec4 k_rows[LOADS], v_rows[V_LOADS];

void gather_rows(uint kv_head, uint tid) {
  if (pc.num_chunks == 1u) {
    [[unroll]] for (uint j = 0u; j < LOADS; ++j) {
      const uint index = (next_slot[j] * pc.heads_kv + kv_head) * FETCHES + gather_place(tid, j, FETCHES).y;
      k_rows[j] = Quads(kv_base[0]).q[index];
    }
    [[unroll]] for (uint j = 0u; j < V_LOADS; ++j) {
      const uint slot = V_FETCHES == FETCHES ? next_slot[j] : next_v_slot[j];
      v_rows[j] = Quads(kv_base[1]).q[(slot * pc.heads_kv + kv_head) * V_FETCHES + gather_place(tid, j, V_FETCHES).y];
    }
  } else {
    [[unroll]] for (uint j = 0u; j < LOADS; ++j) {
      k_rows[j] = kv_quad_chunked(0u, next_slot[j], kv_head, gather_place(tid, j, FETCHES).y, FETCHES);
    }
    [[unroll]] for (uint j = 0u; j < V_LOADS; ++j) {
      const uint slot = V_FETCHES == FETCHES ? next_slot[j] : next_v_slot[j];
      v_rows[j] = kv_quad_chunked(1u, slot, kv_head, gather_place(tid, j, V_FETCHES).y, V_FETCHES);
    }
  }
}

// The landed rows into stage `stage` of the K/V tiles (decoded where fp8).
// Positions past the block hold its first token's rows: finite, and no row
// sees them, so their P is exactly 0 and they add nothing to O. (Loads past
// the chunk, where its loads do not fill every thread's last one, are dropped.)
void store_rows(uint tid, uint stage) {
  [[unroll]] for (uint j = 0u; j < LOADS; ++j) {
    const uvec2 place = gather_place(tid, j, FETCHES);
    const uint at = stage * STAGE_QUADS + place.x * ROW_QUADS + place.y * FETCH_QUADS;
    [[unroll]] for (uint part = 0u; part < FETCH_QUADS; ++part) {
      if ((CHUNK * FETCHES) % THREADS == 0u || place.x < CHUNK) k_tile[at + part] = fetched_quad(k_rows[j], part);
    }
  }
  [[unroll]] for (uint j = 0u; j < V_LOADS; ++j) {
    const uvec2 place = gather_place(tid, j, V_FETCHES);
    const uint at = stage * V_STAGE_QUADS + place.x * V_ROW_QUADS + place.y * FETCH_QUADS;
    [[unroll]] for (uint part = 0u; part < FETCH_QUADS; ++part) {
      if ((CHUNK * V_FETCHES) % THREADS == 0u || place.x < CHUNK) v_tile[at + part] = fetched_quad(v_rows[j], part);
    }
  }
}

// Row r of Q (a query head of one query), lane h of pair (2r, 2r+1) holding
// columns 8h..8h+7 of each 16-column tile. All of the row's loads are issued
// together: between syncs they would be issued one after another, each paying
// the full memory latency. (A row past the pass reads a live row's query; its
// results are never written.)
void load_q_row(uint query, uint head, uint half_index, out uvec4 quads[DTILES]) {
  [[unroll]] for (uint k = 0u; k < DTILES; ++k) {
    quads[k] = Quads(pc.q).q[((query * pc.heads_q + head) * HEAD_DIM + k * TILE) / 8u + half_index];
  }
}

// Q's rows into A matrices, one 16x16 tile at a time through the subgroup's staging tile.
void stage_q(uvec4 quads[DTILES], uint r, uint half_index, uint sg, out MAT_A q[DTILES]) {
  const uint at = sg * TILE * Q_STRIDE;
  [[unroll]] for (uint k = 0u; k < DTILES; ++k) {
    [[unroll]] for (uint c = 0u; c < 4u; ++c) {
      const f16vec2 pair = unpackFloat2x16(quads[k][c]);
      q_stage[at + (half_index * 8u + 2u * c) * Q_STRIDE + r] = pair.x;
      q_stage[at + (half_index * 8u + 2u * c + 1u) * Q_STRIDE + r] = pair.y;
    }
    subgroup_sync();
    coopMatLoad(q[k], q_stage, at, Q_STRIDE, gl_CooperativeMatrixLayoutColumnMajor);
    subgroup_sync();
  }
}

// S = Q K^T over the chunk: B(k, n) = K[token n][dim k] (K read column-major).
// The 16-token tiles' accumulations are interleaved: independent chains of
// matrix products overlap their latency instead of queueing behind one another.
void compute_s(MAT_A q[DTILES], uint stage, out ACC s[STILES]) {
  const uint base = stage * STAGE_QUADS;
  [[unroll]] for (uint nb = 0u; nb < STILES; ++nb) s[nb] = ACC(0.0);
  [[unroll]] for (uint k = 0u; k < DTILES; ++k) {
    [[unroll]] for (uint nb = 0u; nb < STILES; ++nb) {
      MAT_B kt;
      coopMatLoad(kt, k_tile, base + nb * TILE * ROW_QUADS + k * (TILE / 8u), ROW_QUADS,
                  gl_CooperativeMatrixLayoutColumnMajor);
      s[nb] = coopMatMulAdd(q[k], kt, s[nb]);
    }
  }
}

// O += P V for the chunk's 16-token tile nb.
void accumulate_pv(MAT_A p, uint nb, uint stage, inout ACC o[V_DTILES]) {
  [[unroll]] for (uint n = 0u; n < V_DTILES; ++n) {
    MAT_B v;
    coopMatLoad(v, v_tile, stage * V_STAGE_QUADS + nb * TILE * V_ROW_QUADS + n * (TILE / 8u), V_ROW_QUADS,
                gl_CooperativeMatrixLayoutRowMajor);
    o[n] = coopMatMulAdd(p, v, o[n]);
  }
}
