#version 460
// Where a device's cooperative matrices keep their elements: one subgroup of
// 32 loads a 16x16 f32 accumulator and a 16x16 f16 A matrix whose element
// (row, column) holds row * 16 + column, and writes, per lane, each element it
// holds (the accumulator's at [lane][i][0], the A matrix's at [lane][i][1];
// 8 elements a lane at most), then the two matrices' lengths at [512] and [513].
// coopmat_layout.cpp compares them with mma.sync's fragment layout, which
// tree_attn_coopmat_fragments.comp needs.
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_control_flow_attributes : require

layout(local_size_x = 32) in;
layout(buffer_reference, std430, buffer_reference_align = 4) buffer Floats { float f[]; };
layout(push_constant) uniform Params { uint64_t out_address; } pc;

shared float accumulator_source[256];
shared float16_t a_source[256];

void main() {
  const uint lane = gl_SubgroupInvocationID;
  for (uint e = lane; e < 256u; e += 32u) {
    accumulator_source[e] = float(e);
    a_source[e] = float16_t(e);
  }
  barrier();
  coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator> c;
  coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA> a;
  coopMatLoad(c, accumulator_source, 0, 16, gl_CooperativeMatrixLayoutRowMajor);
  coopMatLoad(a, a_source, 0, 16, gl_CooperativeMatrixLayoutRowMajor);
  Floats o = Floats(pc.out_address);
  [[unroll]] for (uint i = 0u; i < 8u; ++i) {
    if (i < c.length()) o.f[(lane * 8u + i) * 2u] = c[i];
    if (i < a.length()) o.f[(lane * 8u + i) * 2u + 1u] = float(a[i]);
  }
  if (lane == 0u) {
    o.f[512] = float(c.length());
    o.f[513] = float(a.length());
  }
}
