// treeattn::vulkan::Workspace: the plan's words on the device (copied from
// one of two staging buffers by a command the upload records), the partial
// buffers, a host-written table of K/V chunk addresses, and the recording of
// one attention call into any command buffer.

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "vk_check.hpp"
#include "vk_sequence.hpp"
#include "workspace_state.hpp"

namespace treeattn::vulkan {
namespace {

// K/V chunk addresses and attention options the table holds (8 bytes each),
// two halves of 2 048: a step's distinct K/V pools (a model's layers, each a
// few chunks) many times over.
constexpr std::size_t kTableBytes = std::size_t(32) << 10;

std::uint32_t out_type(DType dtype) {
  switch (dtype) {
    case DType::f16: return 0;
    case DType::bf16: return 1;
    case DType::f32: return 2;
    case DType::fp8_e4m3:
    case DType::fp8_e5m2: break;  // check_args refuses an fp8 O
  }
  throw Error(ErrorCategory::InvalidArgument, fmt::format("Vulkan backend: O is f16, bf16 or f32, not {}", to_string(dtype)));
}

// Room for `bytes` and half as much again: a tree that grows every decode step
// outgrows its buffers now and then, not every step. Uploads over 0.5 ms (an
// allocation's) in the H200 Vulkan demo, few-shot b=50: 15 of 400 steps, 103
// when regrown to the exact size (benchmarks/h200/demo_vulkan.json).
std::size_t with_headroom(std::size_t bytes) { return std::max<std::size_t>(bytes + bytes / 2, 16); }

// A buffer with headroom to replace `buffer` when that is smaller than
// `bytes`; else none (a null handle).
Buffer grown(const Buffer& buffer, std::size_t bytes, const Device& device, Buffer::Kind kind) {
  if (buffer.handle() != VK_NULL_HANDLE && buffer.bytes() >= bytes) return Buffer();
  return Buffer(device, with_headroom(bytes), kind);
}

// Puts `replacement` (when there is one) in `buffer`'s place; the old buffer
// goes to `retired` (commands recorded earlier may still read it).
void replace(Buffer& buffer, Buffer&& replacement, std::vector<Buffer>& retired) {
  if (replacement.handle() == VK_NULL_HANDLE) return;
  if (buffer.handle() != VK_NULL_HANDLE) retired.push_back(std::move(buffer));
  buffer = std::move(replacement);
}

VkDeviceAddress address_of(VkDevice device, const Tensor& t) {
  if (t.buffer == VK_NULL_HANDLE) return 0;
  VkBufferDeviceAddressInfo info{VK_STRUCTURE_TYPE_BUFFER_DEVICE_ADDRESS_INFO};
  info.buffer = t.buffer;
  return vkGetBufferDeviceAddress(device, &info) + t.offset;
}

}  // namespace

Runs runs_of(const DeviceCaps& caps, std::uint32_t run_limit, std::uint64_t count, int runs_axis, const std::string& what) {
  std::uint64_t length = std::min<std::uint64_t>(count, caps.max_work_groups[0]);
  if (run_limit > 0) length = std::min<std::uint64_t>(length, run_limit);
  const std::uint64_t runs = length == 0 ? 0 : (count + length - 1) / length;
  if (count > 0xffffffffull || runs > caps.max_work_groups[runs_axis]) {
    throw Error(ErrorCategory::InvalidArgument,
                fmt::format("Vulkan backend: the plan needs {}; device {} dispatches at most {} x {} x {} work groups", what,
                            caps.name, caps.max_work_groups[0], caps.max_work_groups[1], caps.max_work_groups[2]));
  }
  return {std::uint32_t(count), std::uint32_t(length), std::uint32_t(runs)};
}

Workspace::State::State(Context::State& c, DType in) : context(&c), inputs(in) {
  if (inputs != DType::f16 && inputs != DType::bf16) {
    throw Error(ErrorCategory::InvalidArgument,
                fmt::format("Vulkan backend: Q, K and V must be f16 or bf16 (got {})", to_string(inputs)));
  }
  table = Buffer(*c.device, kTableBytes, Buffer::Kind::host_written);
}

VkDeviceAddress Workspace::State::kv_table(const LayerTensors& t) {
  // K's chunks, then V's, then the options (the shaders' kv_chunks table and
  // option_word); the chunk size last, in the key only.
  std::uint32_t scale_bits[2];
  std::memcpy(&scale_bits[0], &t.k_scale, 4);
  std::memcpy(&scale_bits[1], &t.v_scale, 4);
  std::vector<VkDeviceAddress> key = t.k_chunks;
  key.insert(key.end(), t.v_chunks.begin(), t.v_chunks.end());
  for (VkDeviceAddress option : {t.sinks, t.k_scales, t.v_scales, VkDeviceAddress(scale_bits[0]) | VkDeviceAddress(scale_bits[1]) << 32}) {
    key.push_back(option);
  }
  key.push_back(t.chunk_slots);
  auto& entries = table_entries[current];
  const std::size_t half = table.bytes() / 2, base = std::size_t(current) * half;
  auto found = entries.find(key);
  if (found == entries.end()) {
    const std::size_t bytes = (key.size() - 1) * sizeof(VkDeviceAddress);
    if (table_used[current] + bytes > half) {
      throw Error(ErrorCategory::InvalidArgument,
                  fmt::format("Vulkan workspace: a step recorded more distinct K/V buffers than its table holds ({} "
                              "addresses, {} K/V pairs so far)",
                              half / sizeof(VkDeviceAddress), entries.size()));
    }
    auto* at = reinterpret_cast<VkDeviceAddress*>(static_cast<unsigned char*>(table.mapped()) + base + table_used[current]);
    std::copy(key.begin(), key.end() - 1, at);
    found = entries.emplace(std::move(key), base + table_used[current]).first;
    table_used[current] += bytes;
  }
  return table.address() + found->second;
}

void Workspace::State::use_pipelines(const LayerTensors& t) {
  ShaderKey key = pipelines_key;
  key.kv_fp8 = t.kv == DType::fp8_e4m3 ? 1 : t.kv == DType::fp8_e5m2 ? 2 : 0;
  key.softcap = t.logit_softcap > 0.0f;
  key.sinks = t.sinks != 0;
  if (key == pipelines_key) return;  // a plain call after a plain call: no lookup
  stage1_pipeline = &context->stage1_pipeline(key);
  merge_pipeline = &context->merge_pipeline(key);
  pipelines_key = key;
}

// A barrier first (stage 1 rewrites the partials the previous call's merge
// read, and the previous call's outputs may be this one's inputs), then stage
// 1's dispatches, a barrier, and the merge where the plan has partials.
void Workspace::State::record(VkCommandBuffer commands, const LayerTensors& t) {
  use_pipelines(t);
  PushConstants pc{};
  pc.plan = plan.address();
  pc.q = t.q;
  pc.kv_chunks = kv_table(t);
  pc.o = t.o;
  pc.lse = t.lse;
  pc.partial_o = partials.address();
  pc.partial_lse = partials.address() + partial_rows * std::size_t(shape.heads.value_dim()) * 4;
  pc.chunk_slots = t.chunk_slots;
  pc.num_chunks = std::uint32_t(t.k_chunks.size());
  pc.heads_q = std::uint32_t(shape.heads.heads_q);
  pc.heads_kv = std::uint32_t(shape.heads.heads_kv);
  pc.group = std::uint32_t(shape.heads.group_size());
  pc.out_type = out_type(t.out);
  pc.scale_log2 = shape.heads.effective_scale() * 1.4426950408889634f;
  std::copy(std::begin(encoded.offsets), std::end(encoded.offsets), pc.offsets);
  pc.groups = stage1.count;
  pc.run = stage1.length;
  pc.softcap_log2 = t.logit_softcap * 1.4426950408889634f;
  record_compute_barrier(commands);
  record_dispatch(commands, *stage1_pipeline, &pc, sizeof(pc), stage1.length, stage1.runs);
  if (partial_rows > 0) {
    record_compute_barrier(commands);
    pc.groups = merge.count;
    pc.run = merge.length;
    record_dispatch(commands, *merge_pipeline, &pc, sizeof(pc), merge.length, std::uint32_t(shape.heads.heads_q), merge.runs);
  }
}

Workspace::Workspace(const Context& context, DType inputs)
    : state_(std::make_unique<State>(state_of(context), inputs)) {}
Workspace::~Workspace() = default;
Workspace::Workspace(Workspace&&) noexcept = default;
Workspace& Workspace::operator=(Workspace&&) noexcept = default;

void Workspace::upload(const Plan& plan, VkCommandBuffer commands) {
  State& s = *state_;
  Context::State& ctx = *s.context;
  const Device& device = *ctx.device;
  const DeviceCaps& caps = device.caps();
  // A failure below leaves no plan to record: record() refuses until an upload succeeds.
  s.uploaded = false;
  std::string reason;
  s.variant = ctx.variant(s.inputs, plan.heads.head_dim, plan.heads.value_dim(), &reason);
  ctx.log_variant(reason);
  // The plain call's pipelines; a call with variants switches at its record.
  ShaderKey key;
  key.variant = s.variant;
  key.head_dim = plan.heads.head_dim;
  key.head_dim_v = plan.heads.value_dim();
  key.bf16 = s.inputs == DType::bf16;
  s.stage1_pipeline = &ctx.stage1_pipeline(key);
  s.merge_pipeline = &ctx.merge_pipeline(key);
  s.pipelines_key = key;

  lower(plan, std::int32_t(rows_per_pass(s.variant)), s.lowered);
  s.encoded = encode_plan(plan, s.lowered);
  const std::uint64_t passes = s.encoded.passes;
  s.stage1 = runs_of(caps, ctx.max_dispatch_run, passes * std::uint64_t(plan.heads.heads_kv), 1,
                     fmt::format("{} passes x {} KV heads stage-1 work groups (plan with longer blocks or more queries "
                                 "per item)", passes, plan.heads.heads_kv));
  s.merge = runs_of(caps, ctx.max_dispatch_run, std::uint64_t(plan.num_queries), 2,
                    fmt::format("{} queries x {} query heads merge work groups", plan.num_queries, plan.heads.heads_q));
  if (std::uint32_t(plan.heads.heads_q) > caps.max_work_groups[1]) {
    throw Error(ErrorCategory::InvalidArgument, fmt::format("Vulkan backend: {} query heads exceed device {}'s {} work groups in y",
                                                            plan.heads.heads_q, caps.name, caps.max_work_groups[1]));
  }

  // This staging slot (and table half) was last used by the step two uploads
  // back, which has completed (vulkan.hpp): so have the users of what was retired then.
  const int b = s.next;
  s.retired[b].clear();
  s.table_entries[b].clear();
  s.table_used[b] = 0;
  s.current = b;
  // Every allocation before any buffer is replaced: a failed one leaves the
  // buffers that the previous step's commands read where they are (the upload
  // made again takes this slot again, and releases what it holds retired).
  s.retired[b].reserve(2);  // nor can retiring them fail once they are replaced
  const std::size_t bytes = s.encoded.words.size() * 4;
  const std::size_t partial_rows = std::size_t(plan.num_partials) * std::size_t(plan.heads.heads_q);
  if (s.staging[b].bytes() < bytes) s.staging[b] = Buffer(device, with_headroom(bytes), Buffer::Kind::staging);
  Buffer plan_buffer = grown(s.plan, bytes, device, Buffer::Kind::device_local);
  Buffer partials = grown(s.partials, partial_rows * std::size_t(plan.heads.value_dim() + 1) * 4, device, Buffer::Kind::device_local);
  replace(s.plan, std::move(plan_buffer), s.retired[b]);
  replace(s.partials, std::move(partials), s.retired[b]);
  s.partial_rows = partial_rows;
  std::memcpy(s.staging[b].mapped(), s.encoded.words.data(), bytes);
  s.next = 1 - b;

  // The copy waits for earlier dispatches that read the plan, and the dispatches after it for the copy.
  VkMemoryBarrier before{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
  before.srcAccessMask = VK_ACCESS_SHADER_READ_BIT;
  before.dstAccessMask = VK_ACCESS_TRANSFER_WRITE_BIT;
  vkCmdPipelineBarrier(commands, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_PIPELINE_STAGE_TRANSFER_BIT, 0, 1, &before, 0,
                       nullptr, 0, nullptr);
  const VkBufferCopy region{0, 0, bytes};
  vkCmdCopyBuffer(commands, s.staging[b].handle(), s.plan.handle(), 1, &region);
  record_transfer_to_compute_barrier(commands);
  s.shape = CallShape::of(plan);
  s.uploaded = true;
}

void Workspace::State::record_addresses(VkCommandBuffer commands, const AttentionArgs& a) {
  if (!uploaded) throw Error(ErrorCategory::InvalidArgument, "record before any plan was uploaded to the workspace");
  check_args(shape, a);
  if (a.q.dtype != inputs) {
    throw Error(ErrorCategory::InvalidArgument, fmt::format("Q is {}, but the workspace was made for {} inputs",
                                                            to_string(a.q.dtype), to_string(inputs)));
  }
  if (!a.q.dense() || !a.k.dense() || !a.v.dense() || !a.o.dense()) {
    throw Error(ErrorCategory::InvalidArgument,
                fmt::format("Vulkan backend: Q, K, V and O must be dense (got Q {}, K {}, V {}, O {})", describe(a.q),
                            describe(a.k), describe(a.v), describe(a.o)));
  }
  auto address = [](const TensorRef& t) { return VkDeviceAddress(reinterpret_cast<std::uintptr_t>(t.data)); };
  for (const auto& [name, t] : {std::pair<const char*, const TensorRef*>{"Q", &a.q}, {"K", &a.k}, {"V", &a.v}, {"O", &a.o},
                                {"LSE", &a.lse}}) {
    if (address(*t) % 16 != 0) {
      throw Error(ErrorCategory::InvalidArgument,
                  fmt::format("{} is at device address {:#x}: it must be 16-byte aligned", name, address(*t)));
    }
  }
  const treeattn::AttentionOptions& options = a.options;
  for (const auto& [name, t] : {std::pair<const char*, const TensorRef*>{"sinks", &options.sinks},
                                {"k_scales", &options.k_scales}, {"v_scales", &options.v_scales}}) {
    if (address(*t) % 4 != 0) {
      throw Error(ErrorCategory::InvalidArgument,
                  fmt::format("{} is at device address {:#x}: it must be 4-byte aligned", name, address(*t)));
    }
  }
  LayerTensors layer;
  layer.q = address(a.q);
  layer.o = address(a.o);
  layer.lse = address(a.lse);
  layer.k_chunks = {address(a.k)};
  layer.v_chunks = {address(a.v)};
  layer.chunk_slots = std::uint32_t(std::min<std::int64_t>(std::max<std::int64_t>(a.k.shape[0], 1), 0xffffffff));
  layer.out = a.o.dtype;
  set_options(layer, a, address(options.sinks), address(options.k_scales), address(options.v_scales));
  record(commands, layer);
}

void Workspace::record(VkCommandBuffer commands, const Tensors& t) {
  for (const auto& [name, x] : {std::pair<const char*, const Tensor*>{"Q", &t.q}, {"K", &t.k}, {"V", &t.v}, {"O", &t.o},
                                {"LSE", &t.lse}}) {
    if (x->buffer != VK_NULL_HANDLE && x->offset % 16 != 0) {
      throw Error(ErrorCategory::InvalidArgument, fmt::format("{} starts at offset {}: it must be 16-byte aligned", name, x->offset));
    }
  }
  const VkDevice device = state_->context->device->handle();
  auto ref = [&](const Tensor& x) {
    return TensorRef{reinterpret_cast<void*>(static_cast<std::uintptr_t>(address_of(device, x))), x.dtype, x.shape};
  };
  const AttentionOptions& o = t.options;
  const treeattn::AttentionOptions options{o.logit_softcap, o.k_scale, o.v_scale, ref(o.sinks), ref(o.k_scales), ref(o.v_scales)};
  state_->record_addresses(commands, AttentionArgs{ref(t.q), ref(t.k), ref(t.v), ref(t.o), ref(t.lse), options});
}

}  // namespace treeattn::vulkan
