// Shared by the tree-attention shaders: the push-constant block, the device
// addresses of every tensor (buffer device address: no binding-size limit, so
// KV pools larger than maxStorageBufferRange work), the plan workspace layout
// (its arrays' offsets in the push constants: no header load ahead of the first
// lookup), exact 16-bit conversions, and the attention variants (DESIGN.md §8)
// as specialization constants: a pipeline built without one runs none of its code.
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
  float softcap_log2;    // the logit soft-cap in base 2 (cap * log2(e)), read where SOFTCAP
} pc;

// The variants a pipeline runs (context.cpp's ShaderKey sets them; ids 0 and 1
// are each shader's own). Q and K have the shader's HEAD_DIM columns, V and O
// HEAD_DIM_V.
layout(constant_id = 2) const bool IN_BF16 = false;  // Q (and 16-bit K and V) bf16, else f16
layout(constant_id = 3) const uint HEAD_DIM_V = 128;
layout(constant_id = 4) const uint KV_FP8 = 0;       // K and V: 0 Q's 16-bit type, 1 fp8_e4m3, 2 fp8_e5m2
layout(constant_id = 5) const bool SOFTCAP = false;  // s = cap * tanh(s / cap)
layout(constant_id = 6) const bool SINKS = false;    // a logit per query head joins each query's softmax once

// The plan arrays after the pass records (vk_plan.cpp writes them).
const uint kItemTokenSlot = 0, kTileVisible = 1, kTileQuery = 2, kTilePartial = 3, kMergeBegin = 4;
const uint kKvTileTokens = 64u;  // tokens per tile of kTileVisible (one bit each)
const int kDirect = -1;
const float kLn2 = 0.69314718055994531;
const float kLog2e = 1.4426950408889634;

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

// 16 bytes of head `head` of KV-pool row `slot` (8 16-bit elements or 16 fp8
// ones), from K (which=0) or V (which=1), of a pool split over several buffers.
// (A one-buffer pool, the usual case, the shaders read through kv_base
// directly, with the branch on pc.num_chunks outside their load loops.)
uvec4 kv_quad_chunked(uint which, uint slot, uint head, uint quad, uint quads_per_head) {
  uint chunk = slot / pc.chunk_slots;
  uint local_slot = slot - chunk * pc.chunk_slots;
  Quads base = Quads(Addresses(pc.kv_chunks).a[which * pc.num_chunks + chunk]);
  return base.q[(local_slot * pc.heads_kv + head) * quads_per_head + quad];
}

// What one 16-byte load of K or V carries, in 16-byte pieces of 16-bit
// elements (the shared-memory tiles' unit): 1, or 2 where K and V are fp8.
const uint FETCH_QUADS = 1u + (KV_FP8 + 1u) / 2u;

// Two fp8 elements (bits 0-7 and 8-15 of `bytes`) as two 16-bit ones of Q's
// type, each byte first moved to the upper byte of its half: that is e5m2 as
// f16. e4m3's exponent and mantissa, one bit lower, are f16's and read as the
// value / 256 for normal and subnormal numbers alike (kv_scale multiplies the
// 256 back); the NaN magnitude 0x7f carries into bit 15 when 1 is added, and
// that bit, shifted with the rest, fills the exponent. A few instructions a
// pair, since every element a work group reads goes through here (e4m3 1.068x
// over assembling sign, exponent, mantissa and NaN apart on the H200,
// docs/performance.md). bf16 takes the f16 value's upper half through f32:
// exact, fp8 has at most 3 mantissa bits.
uint fp8_pair(uint bytes) {
  const uint upper = ((bytes << 8) & 0x0000ff00u) | ((bytes << 16) & 0xff000000u);
  uint h;
  if (KV_FP8 == 2u) {
    h = upper;
  } else {
    const uint magnitude = upper & 0x7f007f00u;
    const uint nan = (magnitude + 0x01000100u) & 0x80008000u;
    h = ((magnitude | nan) >> 1) | (upper & 0x80008000u);
  }
  if (IN_BF16) {
    const vec2 value = unpackHalf2x16(h);
    h = (floatBitsToUint(value.x) >> 16) | (floatBitsToUint(value.y) & 0xffff0000u);
  }
  return h;
}

// Piece `part` (< FETCH_QUADS) of 16 loaded bytes of K or V, as the shared
// tiles hold it: the bytes themselves, or 8 fp8 elements made 16-bit ones of
// Q's type. Called where the loaded rows are stored, never beside the load.
uvec4 fetched_quad(uvec4 fetched, uint part) {
  if (KV_FP8 == 0u) return fetched;
  const uvec2 bytes = part == 0u ? fetched.xy : fetched.zw;
  return uvec4(fp8_pair(bytes.x), fp8_pair(bytes.x >> 16), fp8_pair(bytes.y), fp8_pair(bytes.y >> 16));
}

// The call's attention options follow its K and V chunk addresses in the
// kv_chunks table (workspace.cpp writes them): the addresses of sinks,
// k_scales and v_scales (0: none), then k_scale and v_scale.
uint64_t option_word(uint index) { return Addresses(pc.kv_chunks).a[2u * pc.num_chunks + index]; }

// What multiplies K's (which=0) or V's (which=1) decoded elements of KV head
// `kv_head`: its scale, and for e4m3 the 256 that fp8_pair leaves out.
float kv_scale(uint which, uint kv_head) {
  const uint64_t per_head = option_word(1u + which);
  const float per_tensor = uintBitsToFloat(uint(option_word(3u) >> (32u * which)));
  const float scale = per_head != 0ul ? Floats(per_head).f[kv_head] : per_tensor;
  return KV_FP8 == 1u ? scale * 256.0 : scale;
}

// A base-2 logit soft-capped: cap * tanh(logit / cap) with cap = pc.softcap_log2
// (the natural cap scaled as the logits are). tanh as 1 - 2 / (e^2x + 1): 1 for
// large x, where e^2x / e^2x would be NaN.
float softcap(float logit) {
  const float x = abs(logit) / pc.softcap_log2;
  return sign(logit) * pc.softcap_log2 * (1.0 - 2.0 / (exp2(2.0 * kLog2e * x) + 1.0));
}

// A query written without partials (or merged from them) has its query head's
// sink join its softmax of base-2 maximum `running_max` and sum `running_sum`:
// `inv` becomes the factor that normalises O, `lse2` the base-2 LSE.
void join_sink(uint head, float running_max, float running_sum, inout float inv, inout float lse2) {
  const float sink = Floats(option_word(0u)).f[head] * kLog2e;
  const float m = max(running_max, sink);
  const float weight = exp2(running_max - m);
  const float sum = running_sum * weight + exp2(sink - m);
  inv = weight / sum;
  lse2 = m + log2(sum);
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
