// Shared by the tree-attention shaders: the push-constant block, the device
// addresses of every tensor (buffer device address: no binding-size limit, so
// KV pools larger than maxStorageBufferRange work), the plan workspace layout
// (its arrays' offsets in the push constants: no header load ahead of the first
// lookup), and exact 16-bit conversions.
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require
#extension GL_EXT_control_flow_attributes : require

layout(buffer_reference, std430, buffer_reference_align = 4) readonly buffer Words { uint w[]; };
layout(buffer_reference, std430, buffer_reference_align = 16) readonly buffer Quads { uvec4 q[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) buffer OutWords { uint w[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) buffer Floats { float f[]; };
layout(buffer_reference, std430, buffer_reference_align = 16) buffer Vec4s { vec4 v[]; };
layout(buffer_reference, std430, buffer_reference_align = 8) buffer Vec2s { vec2 v[]; };
layout(buffer_reference, std430, buffer_reference_align = 8) readonly buffer Addresses { uint64_t a[]; };

// Mirrors vulkan::PushConstants (vk_plan.hpp).
layout(push_constant) uniform Params {
  uint64_t plan;         // Words: the plan workspace (header of array offsets, then the arrays)
  uint64_t q;            // [queries, heads_q, head_dim] 16-bit
  uint64_t kv_chunks;    // Addresses: K chunk bases, then V chunk bases
  uint64_t o;            // [queries, heads_q, head_dim] f16, bf16 or f32
  uint64_t lse;          // [queries, heads_q] f32, natural log (0: not wanted)
  uint64_t partial_o;    // [partials, heads_q, head_dim] f32
  uint64_t partial_lse;  // [partials, heads_q] f32, base 2
  uint chunk_slots;      // KV-pool slots per chunk
  uint num_chunks;
  uint heads_q;
  uint heads_kv;
  uint group;            // heads_q / heads_kv
  uint out_type;         // 0 f16, 1 bf16, 2 f32
  float scale_log2;      // softmax scale * log2(e): logits in base 2
  uint offsets[5];       // word offset of each plan array (kItemTokenSlot ... kMergeBegin)
  uint groups;           // stage 1: its passes x heads_kv work groups; the merge: the queries (each over
                         // the query heads); the dispatch may hold more
  uint run;              // of those, the most in a run along x (numbered_work_group)
} pc;

// The plan arrays after the pass records (vk_plan.cpp writes them).
const uint kItemTokenSlot = 0, kTileVisible = 1, kTileQuery = 2, kTilePartial = 3, kMergeBegin = 4;
const uint kKvTileTokens = 64u;  // tokens per tile of kTileVisible (one bit each)
const int kDirect = -1;
const float kLn2 = 0.69314718055994531;

uint64_t kv_base[2];  // K and V base addresses when the pool is one chunk

void load_kv_bases() {
  Addresses chunks = Addresses(pc.kv_chunks);
  kv_base[0] = chunks.a[0];
  kv_base[1] = chunks.a[pc.num_chunks];
}

// A dispatch's `groups` work groups lie in runs of `run` along x, the runs
// along y (stage 1) or z (the merge), as many as a device takes in one
// dimension (at least 65 535): this work group's index among them. The run
// comes in the push constants rather than from gl_NumWorkGroups, whose use
// costs a dispatch 0.2-0.3 us on the H100 (docs/performance.md).
uint numbered_work_group(uint run_index) { return run_index * pc.run + gl_WorkGroupID.x; }

// Stage 1's work group: its pass and KV head, numbered pass-major with the KV
// heads adjacent (the plan's launch order, as the CUDA grid and the cost model
// have it). False for the work groups past the last.
bool stage1_work_group(out uint pass_index, out uint kv_head) {
  const uint linear = numbered_work_group(gl_WorkGroupID.y);
  pass_index = linear / pc.heads_kv;
  kv_head = linear % pc.heads_kv;
  return linear < pc.groups;
}

// A row pass (one work group per KV head), from its 32-byte record at the
// start of the plan's words.
struct Pass {
  uint token_begin, tokens;   // the item's tokens in kItemTokenSlot (token_begin / 64: its first tile of kTileVisible)
  uint tile_begin, row_end;   // the item's first tile query; the end of the pass's rows (tile query x group
                              // head of the item: row_end - row0 <= the work group's rows)
  uint row0;                  // the pass's first row
};
Pass load_pass(uint pass_index) {
  Quads records = Quads(pc.plan);
  const uint at = 2u * pass_index;
  const uvec4 a = records.q[at], b = records.q[at + 1u];
  return Pass(a.x, a.y, a.z, a.w, b.x);
}

uint plan_word(uint array, uint index) { return Words(pc.plan).w[pc.offsets[array] + index]; }
int plan_int(uint array, uint index) { return int(plan_word(array, index)); }

// Word `half_index` (0: tokens 0-31, 1: tokens 32-63) of tile query `tile_query`'s
// visibility in item tile `tile` (counted in kTileVisible): bit t <=> it sees
// the tile's token t (zero past the item's tokens).
uint visible_word(uint tile, uint tile_query, uint half_index) {
  return plan_word(kTileVisible, (tile * 64u + tile_query) * 2u + half_index);
}

// 16 bytes (8 elements) of head `head` of KV-pool row `slot`, from K (which=0) or
// V (which=1), of a pool split over several buffers. (A one-buffer pool, the
// usual case, the shaders read through kv_base directly, with the branch on
// pc.num_chunks outside their load loops.)
uvec4 kv_quad_chunked(uint which, uint slot, uint head, uint quad, uint quads_per_head) {
  uint chunk = slot / pc.chunk_slots;
  uint local_slot = slot - chunk * pc.chunk_slots;
  Quads base = Quads(Addresses(pc.kv_chunks).a[which * pc.num_chunks + chunk]);
  return base.q[(local_slot * pc.heads_kv + head) * quads_per_head + quad];
}

// Two 16-bit inputs of one word, as floats.
vec2 unpack_pair(uint word, bool bf16) {
  return bf16 ? vec2(uintBitsToFloat(word << 16), uintBitsToFloat(word & 0xffff0000u)) : unpackHalf2x16(word);
}

// Round to nearest even, bit-exact with the host's store_from_float (the GLSL
// packHalf2x16 leaves the rounding mode to the implementation). Branch-free:
// every case is computed and selected, so a lane converting many values runs
// straight-line code the scheduler can interleave, not a chain of branches.
uint f32_to_f16(float value) {
  const uint x = floatBitsToUint(value);
  const uint sign = (x >> 16) & 0x8000u;
  const uint ax = x & 0x7fffffffu;
  const uint rebiased = ax - 0x38000000u;                              // exponent 127 -> 15 (normal results)
  const uint normal = (rebiased + 0xfffu + ((rebiased >> 13) & 1u)) >> 13;
  const uint subnormal = floatBitsToUint(uintBitsToFloat(ax) + 0.5) - 0x3f000000u;  // the f32 add rounds to 2^-24 steps
  uint h = ax < 0x38800000u ? subnormal : normal;
  h = ax >= 0x477ff000u ? 0x7c00u : h;                                // rounds to infinity
  h = ax > 0x7f800000u ? 0x7e00u : h;                                 // NaN
  return sign | h;
}
uint f32_to_bf16(float value) {
  const uint x = floatBitsToUint(value);
  const uint rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  return (x & 0x7fffffffu) > 0x7f800000u ? (x >> 16) | 0x40u : rounded;  // NaN stays NaN
}

// Writes elements [index, index + 1] of O in its dtype (index even).
void store_output_pair(uint index, vec2 value) {
  if (pc.out_type == 2u) {
    Floats(pc.o).f[index] = value.x;
    Floats(pc.o).f[index + 1u] = value.y;
  } else if (pc.out_type == 1u) {
    OutWords(pc.o).w[index >> 1] = f32_to_bf16(value.x) | (f32_to_bf16(value.y) << 16);
  } else {
    OutWords(pc.o).w[index >> 1] = f32_to_f16(value.x) | (f32_to_f16(value.y) << 16);
  }
}
