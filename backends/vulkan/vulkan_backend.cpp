#include "vulkan_backend.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "vk_check.hpp"
#include "vk_sequence.hpp"

namespace treeattn::vulkan {
namespace {

std::size_t align16(std::size_t bytes) { return (bytes + 15) / 16 * 16; }

// check_args, then what the shaders lack: f32 inputs (no f32 stage-1 shader;
// fp8 K and V come with f16 or bf16 Q, which check_args enforces).
void check_inputs(const Plan& plan, const AttentionArgs& args) {
  check_args(plan, args);
  if (args.q.dtype == DType::f32) {
    throw Error(ErrorCategory::InvalidArgument, "Vulkan backend: Q, K and V must be f16 or bf16 (got f32)");
  }
}

// check_inputs, and dense Q, K, V and O: the shaders read rows that are a row apart.
void check_supported(const Plan& plan, const AttentionArgs& args) {
  check_inputs(plan, args);
  if (!args.q.dense() || !args.k.dense() || !args.v.dense() || !args.o.dense()) {
    throw Error(ErrorCategory::InvalidArgument,
                fmt::format("Vulkan backend: Q, K, V and O must be dense (got Q {}, K {}, V {}, O {})", describe(args.q),
                            describe(args.k), describe(args.v), describe(args.o)));
  }
}

// The workspace (and held plan) of f16 inputs, or of bf16 ones.
int slot_of(DType inputs) { return inputs == DType::bf16 ? 1 : 0; }

std::unique_ptr<Context::State> make_state(const BackendOptions& o, std::shared_ptr<Instance> instance,
                                           const DeviceCaps* caps) {
  auto state = std::make_unique<Context::State>(context_options(o), std::move(instance), caps);
  state->max_chunk_bytes = o.vk_max_chunk_bytes;
  state->max_dispatch_run = o.vk_max_dispatch_run;
  return state;
}

}  // namespace

ContextOptions context_options(const BackendOptions& o) {
  ContextOptions c;
  c.device = o.device >= 0 ? o.device : o.vk_device;
  c.variant = o.vk_variant;
  c.verbose = o.verbose;
  c.log = o.log;
  c.pipeline_cache_path = o.vk_pipeline_cache;
  c.model_cache_path = o.model_cache;
  c.validation = o.vk_validation;
  return c;
}

// One call's device buffers: the tensors, and `pools` copies of the KV pool
// (one per benchmarked layer), each split into chunks of at most the device's
// allocation size.
struct VulkanBackend::Staged {
  Buffer q, o, lse, readback;
  std::vector<Buffer> kv_chunks;  // pool-major: pool p's K chunks, then its V chunks
  std::uint32_t chunk_slots = 0, chunks = 0;
  Buffer options;                             // the attention options' tensors (sinks, k_scales, v_scales)
  VkDeviceAddress sinks = 0, k_scales = 0, v_scales = 0;  // in `options` (0: not given)
};

VulkanBackend::VulkanBackend(const BackendOptions& options)
    : VulkanBackend(make_state(options, Instance::get(options.vk_validation, options.log), nullptr)) {}

VulkanBackend::VulkanBackend(std::unique_ptr<Context::State> state) : context_(std::move(state)) {}

VulkanBackend::VulkanBackend(const ExternalDevice& device, const BackendOptions& options)
    : context_(device, context_options(options)), own_device_(false) {}

std::unique_ptr<Backend> VulkanBackend::make_for_gpu(const BackendOptions& options) {
  std::shared_ptr<Instance> instance;
  std::vector<DeviceCaps> devices;
  const DeviceCaps* caps = nullptr;
  try {
    instance = Instance::get(options.vk_validation, options.log);
    devices = probe_devices(*instance);
    if (!devices.empty()) caps = &select_device(devices, context_options(options).device);
  } catch (const Error&) {
    return nullptr;  // no loader, no driver, or a bad device index: not a GPU to pick automatically
  }
  if (caps == nullptr || caps->type == VK_PHYSICAL_DEVICE_TYPE_CPU || !caps->scalar_unsupported().empty()) return nullptr;
  return std::unique_ptr<Backend>(new VulkanBackend(make_state(options, std::move(instance), caps)));
}

VulkanBackend::~VulkanBackend() {
  staged_.reset();
  for (auto& w : workspaces_) w.reset();
}

Workspace& VulkanBackend::workspace(DType inputs) {
  auto& slot = workspaces_[slot_of(inputs)];
  if (!slot) slot = std::make_unique<Workspace>(context_, inputs);
  return *slot;
}

void VulkanBackend::upload_if_new(const Plan& plan, DType inputs, VkCommandBuffer commands) {
  std::uint64_t& held = uploaded_[slot_of(inputs)];
  if (plan.id != 0 && plan.id == held) return;
  held = 0;  // a failed upload leaves no plan to trust
  workspace(inputs).upload(plan, commands);
  held = plan.id;
}

void VulkanBackend::enqueue(const Plan& plan, const AttentionArgs& a, void* stream) {
  if (stream == nullptr) throw Error(ErrorCategory::InvalidArgument, "enqueue: the VkCommandBuffer is null");
  check_inputs(plan, a);
  const auto commands = static_cast<VkCommandBuffer>(stream);
  upload_if_new(plan, a.q.dtype, commands);
  state_of(workspace(a.q.dtype)).record_addresses(commands, a);
}

void VulkanBackend::stage(const Plan& plan, const AttentionArgs& a, int kv_pools) {
  if (!own_device_) {
    throw Error(ErrorCategory::InvalidArgument,
                "a context on the application's Vulkan device records into its command buffers only (enqueue): "
                "host arrays need a context on treeattn's own device");
  }
  check_supported(plan, a);
  check_host_scale_values(a.options);
  staged_.reset();  // frees the previous call's memory first
  auto s = std::make_unique<Staged>();
  Context::State& ctx = state_of(context_);
  const Device& dev = *ctx.device;
  const DeviceCaps& caps = dev.caps();

  // KV chunks: whole slots, at most one allocation each (or the test limit).
  const std::uint64_t slots = std::uint64_t(std::max<std::int64_t>(a.k.shape[0], 1));
  const std::size_t slot_bytes[2] = {a.k.bytes() / slots, a.v.bytes() / slots};  // K's and V's
  std::uint64_t chunk_limit = std::min(caps.max_allocation_bytes, caps.max_buffer_bytes);
  if (ctx.max_chunk_bytes > 0) chunk_limit = std::min<std::uint64_t>(chunk_limit, ctx.max_chunk_bytes);
  s->chunk_slots = std::uint32_t(
      std::max<std::uint64_t>(chunk_limit / std::max<std::size_t>({slot_bytes[0], slot_bytes[1], 1}), 1));
  s->chunks = std::uint32_t((slots + s->chunk_slots - 1) / s->chunk_slots);
  s->q = Buffer(dev, a.q.bytes(), Buffer::Kind::device_local);
  s->o = Buffer(dev, a.o.bytes(), Buffer::Kind::device_local);
  s->lse = Buffer(dev, a.lse.data ? a.lse.bytes() : 0, Buffer::Kind::device_local);
  for (int p = 0; p < kv_pools; ++p) {
    for (int which = 0; which < 2; ++which) {
      for (std::uint32_t c = 0; c < s->chunks; ++c) {
        const std::uint64_t first = std::uint64_t(c) * s->chunk_slots;
        s->kv_chunks.emplace_back(
            dev, std::size_t(std::min<std::uint64_t>(s->chunk_slots, slots - first)) * slot_bytes[which],
            Buffer::Kind::device_local);
      }
    }
  }

  // One staging buffer carries every input up and the outputs back: Q, K, V,
  // then the option tensors given.
  const std::size_t q_at = 0, k_at = align16(a.q.bytes());
  const std::size_t v_at = k_at + align16(a.k.bytes());
  const TensorRef* option_tensors[3] = {&a.options.sinks, &a.options.k_scales, &a.options.v_scales};
  std::size_t option_at[3], options_end = align16(v_at + a.v.bytes());
  for (int i = 0; i < 3; ++i) {
    option_at[i] = options_end;
    if (option_tensors[i]->data) options_end += align16(option_tensors[i]->bytes());
  }
  const std::size_t options_begin = option_at[0];
  const std::size_t staging_bytes = std::max(options_end, align16(a.o.bytes()) + (a.lse.data ? a.lse.bytes() : 0));
  s->readback = Buffer(dev, staging_bytes, Buffer::Kind::staging);
  auto* host = static_cast<unsigned char*>(s->readback.mapped());
  std::memcpy(host + q_at, a.q.data, a.q.bytes());
  std::memcpy(host + k_at, a.k.data, a.k.bytes());
  std::memcpy(host + v_at, a.v.data, a.v.bytes());
  if (options_end > options_begin) s->options = Buffer(dev, options_end - options_begin, Buffer::Kind::device_local);
  VkDeviceAddress* option_address[3] = {&s->sinks, &s->k_scales, &s->v_scales};
  for (int i = 0; i < 3; ++i) {
    if (!option_tensors[i]->data) continue;
    std::memcpy(host + option_at[i], option_tensors[i]->data, option_tensors[i]->bytes());
    *option_address[i] = s->options.address() + (option_at[i] - options_begin);
  }

  CommandSequence upload(dev);
  upload.begin();
  upload.copy(s->readback, s->q, a.q.bytes(), q_at);
  for (std::size_t i = 0; i < s->kv_chunks.size(); ++i) {
    const std::size_t which = (i / s->chunks) % 2, c = i % s->chunks;
    upload.copy(s->readback, s->kv_chunks[i], s->kv_chunks[i].bytes(),
                (which ? v_at : k_at) + c * s->chunk_slots * slot_bytes[which]);
  }
  if (options_end > options_begin) upload.copy(s->readback, s->options, options_end - options_begin, options_begin);
  upload_if_new(plan, a.q.dtype, upload.handle());
  try {
    upload.end();
    upload.submit_and_wait();
  } catch (const Error&) {
    uploaded_[slot_of(a.q.dtype)] = 0;  // the plan's copy was recorded, but may not have run
    throw;
  }
  staged_ = std::move(s);
}

LayerTensors VulkanBackend::layer(const AttentionArgs& a, int pool) const {
  const Staged& s = *staged_;
  LayerTensors t;
  t.q = s.q.address();
  t.o = s.o.address();
  t.lse = a.lse.data ? s.lse.address() : 0;
  for (std::uint32_t c = 0; c < s.chunks; ++c) {
    t.k_chunks.push_back(s.kv_chunks[std::size_t(pool) * 2 * s.chunks + c].address());
    t.v_chunks.push_back(s.kv_chunks[(std::size_t(pool) * 2 + 1) * s.chunks + c].address());
  }
  t.chunk_slots = s.chunk_slots;
  t.out = a.o.dtype;
  set_options(t, a, s.sinks, s.k_scales, s.v_scales);
  return t;
}

void VulkanBackend::run(const Plan& plan, const AttentionArgs& a) {
  stage(plan, a, 1);
  const Device& dev = *state_of(context_).device;
  CommandSequence sequence(dev);
  sequence.begin();
  state_of(workspace(a.q.dtype)).record(sequence.handle(), layer(a, 0));
  sequence.barrier();
  sequence.copy(staged_->o, staged_->readback, a.o.bytes());
  if (a.lse.data) sequence.copy(staged_->lse, staged_->readback, a.lse.bytes(), 0, align16(a.o.bytes()));
  sequence.end();
  sequence.submit_and_wait();
  const auto* host = static_cast<const unsigned char*>(staged_->readback.mapped());
  std::memcpy(a.o.data, host, a.o.bytes());
  if (a.lse.data) std::memcpy(a.lse.data, host + align16(a.o.bytes()), a.lse.bytes());
}

std::vector<double> VulkanBackend::time_uploads(const Plan& plan, int repeats) {
  CommandSequence sequence(*state_of(context_).device);
  Workspace& ws = workspace(DType::f16);
  uploaded_[0] = 0;  // its uploads below replace the plan the workspace holds
  std::vector<double> us;
  for (int r = 0; r < repeats; ++r) {
    sequence.begin();
    const auto t0 = std::chrono::steady_clock::now();
    ws.upload(plan, sequence.handle());
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    sequence.end();
    sequence.submit_and_wait();
  }
  return us;
}

std::vector<double> VulkanBackend::time_layers(const Plan& plan, const AttentionArgs& a, int layers, int repeats) {
  const Device& dev = *state_of(context_).device;
  if (!dev.caps().timestamps) {
    throw Error(ErrorCategory::Backend, fmt::format("Vulkan device {} has no compute timestamps", dev.caps().name));
  }
  // Each layer reads its own KV pool where half the device memory holds them.
  const std::size_t pool_bytes = std::max<std::size_t>(a.k.bytes() + a.v.bytes(), 1);
  const int pools = int(std::clamp<std::uint64_t>(dev.caps().device_local_bytes / 2 / pool_bytes, 1, std::uint64_t(layers)));
  stage(plan, a, pools);
  // Larger than any last-level cache: filled before each replay so no layer
  // starts with the previous replay's KV in cache.
  Buffer flush(dev, std::size_t(256) << 20, Buffer::Kind::device_local);

  CommandSequence sequence(dev, 2);
  sequence.begin();
  sequence.fill(flush, 0);
  sequence.barrier();
  sequence.timestamp(0);
  Workspace::State& ws = state_of(workspace(a.q.dtype));
  for (int l = 0; l < layers; ++l) ws.record(sequence.handle(), layer(a, l % pools));
  sequence.timestamp(1);
  sequence.barrier();
  sequence.copy(staged_->o, staged_->readback, a.o.bytes());
  sequence.end();
  std::vector<double> us;
  // Warm-up: 200 ms of replays before any is timed. With a single one, some
  // processes time some trees up to 1.7x slower, often for every replay, so a
  // tree's median moves between runs of one binary (H100: 1x1024/4x256/... 173
  // to 296 us); after 200 ms, three runs agree within 0.5 % on every tree.
  const auto warm_until = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
  do {
    sequence.submit_and_wait();
  } while (std::chrono::steady_clock::now() < warm_until);
  for (int r = 0; r < repeats; ++r) {
    sequence.submit_and_wait();
    us.push_back(sequence.elapsed_ns(0, 1) / 1e3);
  }
  std::memcpy(a.o.data, staged_->readback.mapped(), a.o.bytes());
  return us;
}

}  // namespace treeattn::vulkan
