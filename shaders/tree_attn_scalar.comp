#version 460
// Stage 1, the portable variant: one work group per (row pass, KV head). A row
// is one (tile query, query head of the group); 16 rows per pass, 8 lanes per
// row, each lane owning an eighth of the row's Q and K columns (HEAD_DIM) and of
// its V and O columns (HEAD_DIM_V). The block's K/V rows are gathered into
// shared memory CHUNK tokens at a time; scores are reduced across a row's 8
// lanes with an xor-shuffle butterfly (any subgroup size >= 8), and the online
// softmax runs in base 2. Runs anywhere, lavapipe included.
#extension GL_KHR_shader_subgroup_shuffle : require
#extension GL_GOOGLE_include_directive : require
#include "attn_common.glsl"

layout(local_size_x = 128) in;
layout(constant_id = 0) const uint HEAD_DIM = 128;
layout(constant_id = 1) const uint CHUNK = 32;     // tokens per shared-memory stage

const uint LANES = 8u, ROWS = 16u, THREADS = 128u;
const uint DIMS = HEAD_DIM / LANES;                 // of Q and K per lane: 8, 12, 16, 24 or 32
const uint V_DIMS = HEAD_DIM_V / LANES;             // of V and O per lane
const uint QUADS = HEAD_DIM / 8u;                   // 16-byte pieces of a K row in shared memory (16-bit elements)
const uint V_QUADS = HEAD_DIM_V / 8u;
const uint FETCHES = QUADS / FETCH_QUADS;           // 16-byte loads of a K row in memory
const uint V_FETCHES = V_QUADS / FETCH_QUADS;
const uint GROUP = 4u;                              // tokens per softmax step
const uint K_LOADS = (CHUNK * FETCHES + THREADS - 1u) / THREADS;  // 16-byte K loads per thread per chunk
const uint V_LOADS = (CHUNK * V_FETCHES + THREADS - 1u) / THREADS;

shared uvec4 k_tile[CHUNK * QUADS];
shared uvec4 v_tile[CHUNK * V_QUADS];

// Words a lane reads at once from its slice of a K (which=0) or V row of
// `dims` columns per lane: 4 (16 bytes) where the slice is whole pieces, else 2
// (head_dim 96: 12 columns, one and a half pieces).
uint piece_words(uint dims) { return dims % 8u == 0u ? 4u : 2u; }

// Read `p` of this lane's slice of token t's K (which=0) or V row, in .xy
// where piece_words is 2.
uvec4 lane_piece(uint which, uint t, uint lane, uint dims, uint p) {
  const uint quads = dims * LANES / 8u;
  if (piece_words(dims) == 4u) {
    const uint at = t * quads + lane * (dims / 8u) + p;
    return which == 0u ? k_tile[at] : v_tile[at];
  }
  const uint half_piece = lane * (dims / 4u) + p;
  const uvec4 quad = which == 0u ? k_tile[t * quads + half_piece / 2u] : v_tile[t * quads + half_piece / 2u];
  return half_piece % 2u == 0u ? quad : quad.zwzw;
}

void main() {
  load_kv_bases();
  uint pass_index, kv_head;
  if (!stage1_work_group(pass_index, kv_head)) return;
  const uint tid = gl_LocalInvocationID.x;
  const Pass pass = load_pass(pass_index);
  const uint row = pass.row0 + tid / LANES, lane = tid % LANES;
  const uint tile_begin = pass.tile_begin, row_end = pass.row_end;
  const uint token_begin = pass.token_begin, tokens = pass.tokens;

  const bool row_live = row < row_end;
  const uint tile_query = row_live ? row / pc.group : 0u;
  const uint head = kv_head * pc.group + (row_live ? row % pc.group : 0u);
  const uint query = plan_word(kTileQuery, tile_begin + tile_query);

  // This lane's slice of the query, pre-scaled into base-2 logits (and by K's
  // dequantizing scale where K is fp8).
  const float logit_scale = KV_FP8 != 0u ? pc.scale_log2 * kv_scale(0u, kv_head) : pc.scale_log2;
  float q[DIMS];
  const uint q_word0 = ((query * pc.heads_q + head) * HEAD_DIM + lane * DIMS) / 2u;
  for (uint i = 0u; i < DIMS / 2u; ++i) {
    vec2 pair = unpack_pair(Words(pc.q).w[q_word0 + i], IN_BF16) * logit_scale;
    q[2u * i] = pair.x;
    q[2u * i + 1u] = pair.y;
  }
  float acc[V_DIMS];
  for (uint i = 0u; i < V_DIMS; ++i) acc[i] = 0.0;
  float running_max = -1.0 / 0.0, running_sum = 0.0;

  for (uint chunk0 = 0u; chunk0 < tokens; chunk0 += CHUNK) {
    const uint count = min(CHUNK, tokens - chunk0);
    // The row's visibility word of the 64-token tile holding this chunk (CHUNK
    // divides 64), from the chunk's first token on: bit t <=> it sees token
    // chunk0 + t (zero past the item's tokens).
    const uint tile = (token_begin + chunk0) / kKvTileTokens;
    const uint64_t seen = (uint64_t(visible_word(tile, tile_query, 1u)) << 32 | visible_word(tile, tile_query, 0u)) >>
                          (chunk0 % kKvTileTokens);
    barrier();
    // Every slot index first, then every row, then the stores: loading and
    // storing one row at a time pays two memory latencies per row.
    // Positions past the chunk read the block's first token and are never used.
    uint k_slot[K_LOADS], v_slot[V_LOADS];
    [[unroll]] for (uint j = 0u; j < K_LOADS; ++j) {
      const uint t = (tid + j * THREADS) / FETCHES;
      k_slot[j] = plan_word(kItemTokenSlot, token_begin + (t < count ? chunk0 + t : 0u));
    }
    [[unroll]] for (uint j = 0u; j < V_LOADS; ++j) {
      const uint t = (tid + j * THREADS) / V_FETCHES;
      v_slot[j] = V_FETCHES == FETCHES ? k_slot[j]
                                       : plan_word(kItemTokenSlot, token_begin + (t < count ? chunk0 + t : 0u));
    }
    uvec4 k_rows[K_LOADS], v_rows[V_LOADS];
    if (pc.num_chunks == 1u) {  // the usual case: no branch around each load
      [[unroll]] for (uint j = 0u; j < K_LOADS; ++j) {
        k_rows[j] = Quads(kv_base[0]).q[(k_slot[j] * pc.heads_kv + kv_head) * FETCHES + (tid + j * THREADS) % FETCHES];
      }
      [[unroll]] for (uint j = 0u; j < V_LOADS; ++j) {
        v_rows[j] = Quads(kv_base[1]).q[(v_slot[j] * pc.heads_kv + kv_head) * V_FETCHES + (tid + j * THREADS) % V_FETCHES];
      }
    } else {
      [[unroll]] for (uint j = 0u; j < K_LOADS; ++j) {
        k_rows[j] = kv_quad_chunked(0u, k_slot[j], kv_head, (tid + j * THREADS) % FETCHES, FETCHES);
      }
      [[unroll]] for (uint j = 0u; j < V_LOADS; ++j) {
        v_rows[j] = kv_quad_chunked(1u, v_slot[j], kv_head, (tid + j * THREADS) % V_FETCHES, V_FETCHES);
      }
    }
    // Load i of the chunk is piece i of its K rows (FETCH_QUADS of them where fp8).
    [[unroll]] for (uint j = 0u; j < K_LOADS; ++j) {
      const uint i = tid + j * THREADS;
      [[unroll]] for (uint part = 0u; part < FETCH_QUADS; ++part) {
        if (i < CHUNK * FETCHES) k_tile[i * FETCH_QUADS + part] = fetched_quad(k_rows[j], part);
      }
    }
    [[unroll]] for (uint j = 0u; j < V_LOADS; ++j) {
      const uint i = tid + j * THREADS;
      [[unroll]] for (uint part = 0u; part < FETCH_QUADS; ++part) {
        if (i < CHUNK * V_FETCHES) v_tile[i * FETCH_QUADS + part] = fetched_quad(v_rows[j], part);
      }
    }
    barrier();

    // Four tokens per step: their dot products and shuffles are independent, and
    // the running maximum and sum are updated once per four tokens, not per token.
    for (uint t0 = 0u; t0 < count; t0 += GROUP) {
      float score[GROUP];
      [[unroll]] for (uint u = 0u; u < GROUP; ++u) {
        const uint t = min(t0 + u, count - 1u);
        float partial = 0.0;
        const uint words = piece_words(DIMS);
        [[unroll]] for (uint i = 0u; i < DIMS / (2u * words); ++i) {
          const uvec4 k = lane_piece(0u, t, lane, DIMS, i);
          [[unroll]] for (uint c = 0u; c < words; ++c) {
            const vec2 kk = unpack_pair(k[c], IN_BF16);
            partial += q[2u * words * i + 2u * c] * kk.x + q[2u * words * i + 2u * c + 1u] * kk.y;
          }
        }
        score[u] = partial;
      }
      // Lanes of a row are 8 aligned invocations; branch-free from here, so they stay converged.
      [[unroll]] for (uint u = 0u; u < GROUP; ++u) score[u] += subgroupShuffleXor(score[u], 4u);
      [[unroll]] for (uint u = 0u; u < GROUP; ++u) score[u] += subgroupShuffleXor(score[u], 2u);
      [[unroll]] for (uint u = 0u; u < GROUP; ++u) score[u] += subgroupShuffleXor(score[u], 1u);
      if (SOFTCAP) {
        [[unroll]] for (uint u = 0u; u < GROUP; ++u) score[u] = softcap(score[u]);
      }
      bool visible[GROUP];
      float new_max = running_max;
      [[unroll]] for (uint u = 0u; u < GROUP; ++u) {
        visible[u] = row_live && (seen >> (t0 + u) & 1ul) != 0ul;
        new_max = visible[u] ? max(new_max, score[u]) : new_max;
      }
      const float alpha = new_max == running_max ? 1.0 : exp2(running_max - new_max);
      float p[GROUP];
      running_sum *= alpha;
      [[unroll]] for (uint u = 0u; u < GROUP; ++u) {
        p[u] = visible[u] ? exp2(score[u] - new_max) : 0.0;
        running_sum += p[u];
      }
      running_max = new_max;
      const uint words = piece_words(V_DIMS);
      [[unroll]] for (uint i = 0u; i < V_DIMS / (2u * words); ++i) {
        [[unroll]] for (uint c = 0u; c < words; ++c) {
          acc[2u * words * i + 2u * c] *= alpha;
          acc[2u * words * i + 2u * c + 1u] *= alpha;
        }
        [[unroll]] for (uint u = 0u; u < GROUP; ++u) {
          const uvec4 v = lane_piece(1u, min(t0 + u, count - 1u), lane, V_DIMS, i);
          [[unroll]] for (uint c = 0u; c < words; ++c) {
            const vec2 vv = unpack_pair(v[c], IN_BF16);
            acc[2u * words * i + 2u * c] += p[u] * vv.x;
            acc[2u * words * i + 2u * c + 1u] += p[u] * vv.y;
          }
        }
      }
    }
  }
  if (!row_live) return;

  // Every tile query sees at least one token of its item (the planner's
  // invariant), so running_sum > 0.
  float inv = 1.0 / running_sum;
  float lse2 = running_max + log2(running_sum);
  const int partial_slot = plan_int(kTilePartial, tile_begin + tile_query);
  if (SINKS && partial_slot == kDirect) join_sink(head, running_max, running_sum, inv, lse2);
  if (KV_FP8 != 0u) inv *= kv_scale(1u, kv_head);
  if (partial_slot == kDirect) {
    const uint out0 = (query * pc.heads_q + head) * HEAD_DIM_V + lane * V_DIMS;
    for (uint i = 0u; i < V_DIMS; i += 2u) store_output_pair(out0 + i, vec2(acc[i], acc[i + 1u]) * inv);
    if (pc.lse != 0ul && lane == 0u) Floats(pc.lse).f[query * pc.heads_q + head] = lse2 * kLn2;
  } else {
    const uint row_index = uint(partial_slot) * pc.heads_q + head;
    Floats partial_o = Floats(pc.partial_o);
    for (uint i = 0u; i < V_DIMS; ++i) partial_o.f[row_index * HEAD_DIM_V + lane * V_DIMS + i] = acc[i] * inv;
    if (lane == 0u) Floats(pc.partial_lse).f[row_index] = lse2;
  }
}
