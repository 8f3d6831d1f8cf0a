#pragma once
// What a treeattn::vulkan::Workspace holds, and the layer recording that the
// public record() and the host-array backend share.

#include <map>
#include <vector>

#include "context_state.hpp"
#include "lowering.hpp"
#include "backend.hpp"
#include "vk_buffer.hpp"
#include "vk_plan.hpp"

namespace treeattn::vulkan {

// `count` work groups laid out in runs along x: one run where they fit in a
// dispatch's x (any device takes 65 535), else full runs of the most x takes
// (or `run_limit`, for tests), the last run ending early. The shaders number
// them back (numbered_work_group). `runs_axis` is the axis that counts the runs.
struct Runs {
  std::uint32_t count = 0, length = 0, runs = 0;
};
Runs runs_of(const DeviceCaps& caps, std::uint32_t run_limit, std::uint64_t count, int runs_axis, const std::string& what);

// One layer's tensors by device address. K and V may each be split into
// chunks of `chunk_slots` slots (a pool larger than one allocation); an
// application's are one chunk each.
struct LayerTensors {
  VkDeviceAddress q = 0, o = 0, lse = 0;  // lse 0: none
  std::vector<VkDeviceAddress> k_chunks, v_chunks;
  std::uint32_t chunk_slots = 0;
  DType out = DType::f32;
  // The call's attention options (DESIGN.md §8): K and V's dtype, the scalars,
  // and the option tensors' addresses (0: none).
  DType kv = DType::f16;
  float logit_softcap = 0.0f, k_scale = 1.0f, v_scale = 1.0f;
  VkDeviceAddress sinks = 0, k_scales = 0, v_scales = 0;
};

// `args`' attention options into `layer`, its option tensors at these device addresses.
inline void set_options(LayerTensors& layer, const AttentionArgs& args, VkDeviceAddress sinks, VkDeviceAddress k_scales,
                        VkDeviceAddress v_scales) {
  layer.kv = args.k.dtype;
  layer.logit_softcap = args.options.logit_softcap;
  layer.k_scale = args.options.k_scale;
  layer.v_scale = args.options.v_scale;
  layer.sinks = sinks;
  layer.k_scales = k_scales;
  layer.v_scales = v_scales;
}

struct Workspace::State {
  State(Context::State& context, DType inputs);

  // Records stage 1 and the merge of the uploaded plan (workspace.cpp says
  // which barriers), with the pipelines of the call's variants.
  void record(VkCommandBuffer commands, const LayerTensors& tensors);
  // The same for tensors given by device address (each TensorRef's data is its
  // VkDeviceAddress), checked against the plan first: what record() and the C
  // API's treeattn_enqueue run.
  void record_addresses(VkCommandBuffer commands, const AttentionArgs& tensors);
  // The address of `tensors`' K/V chunk table and attention options
  // (attn_common.glsl's option_word), written on first sight.
  VkDeviceAddress kv_table(const LayerTensors& tensors);
  // The pipelines of the uploaded plan for the variants of `tensors`.
  void use_pipelines(const LayerTensors& tensors);

  Context::State* context;
  DType inputs;
  Buffer plan;                       // the encoded plan's words, device-local
  Buffer staging[2];                 // the uploads' host copies, taken in turn
  std::vector<Buffer> retired[2];    // replaced buffers, released when their staging slot comes round again
  int next = 0;
  Buffer partials;                   // partial O [partials, heads_q, head_dim] f32, then partial LSE
  // K/V chunk addresses, host-written, in two halves taken in turn by the
  // uploads like the staging buffers: a step's records use its upload's half.
  Buffer table;
  std::map<std::vector<VkDeviceAddress>, std::size_t> table_entries[2];  // chunk addresses (and chunk_slots) -> offset
  std::size_t table_used[2] = {0, 0};
  int current = 0;                   // the half (and staging slot) of the last upload

  // The uploaded plan.
  bool uploaded = false;
  CallShape shape;
  Variant variant = Variant::scalar;
  Lowering lowered;                  // its vectors kept for the next plan
  EncodedPlan encoded;
  Runs stage1, merge;
  std::size_t partial_rows = 0;
  ShaderKey pipelines_key;            // what the two pipelines below run
  const ComputePipeline* stage1_pipeline = nullptr;
  const ComputePipeline* merge_pipeline = nullptr;
};

// The state behind a public Workspace, for the library and its tests.
inline Workspace::State& state_of(const Workspace& workspace) noexcept { return *workspace.state_; }

}  // namespace treeattn::vulkan
