#include "vulkan_backend.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <fstream>
#include <iterator>

#include "coopmat_layout.hpp"
#include "shaders.hpp"
#include "spirv_bf16.hpp"
#include "vk_check.hpp"
#include "vk_sequence.hpp"

namespace treeattn::vulkan {
namespace {

constexpr std::uint32_t kScalarRowsPerPass = 16;   // tree_attn_scalar.comp: 16 rows x 8 lanes
constexpr std::uint32_t kCoopmatRowsPerPass = 64;  // tree_attn_coopmat.comp: 4 subgroups x 16 rows

std::size_t align16(std::size_t bytes) { return (bytes + 15) / 16 * 16; }

std::uint32_t out_type(DType dtype) {
  switch (dtype) {
    case DType::f16: return 0;
    case DType::bf16: return 1;
    case DType::f32: return 2;
  }
  return 2;
}

void check_supported(const Plan& plan, const AttentionArgs& args) {
  check_args(plan, args);
  if (args.q.dtype == DType::f32) {
    throw Error(ErrorCategory::InvalidArgument, "Vulkan backend: Q, K and V must be f16 or bf16 (got f32)");
  }
  if (!args.q.dense() || !args.o.dense()) {
    throw Error(ErrorCategory::InvalidArgument,
                fmt::format("Vulkan backend: Q and O must be dense (got Q {}, O {})", describe(args.q), describe(args.o)));
  }
}

// Tokens per shared-memory stage of the scalar shader: K and V (2 bytes each)
// must fit the device's shared memory. (A divisor of 64: a stage lies in one
// 64-token tile of visibility words.)
std::uint32_t scalar_chunk_tokens(const DeviceCaps& caps, int head_dim) {
  for (std::uint32_t chunk : {64u, 32u, 16u, 8u}) {
    if (chunk * 4u * std::uint32_t(head_dim) <= caps.shared_memory_bytes) return chunk;
  }
  return 8;
}

// `count` work groups laid out in runs along x: one run where they fit in a
// dispatch's x (any device takes 65 535), else full runs of the most x takes
// (or `run_limit`, for tests), the last run ending early. The shaders number
// them back (numbered_work_group). `runs_axis` is the axis that counts the runs.
struct Runs {
  std::uint32_t count = 0, length = 0, runs = 0;
};
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

}  // namespace

// One call's device buffers: the encoded plan, the tensors, and `pools` copies
// of the KV pool (one per benchmarked layer), each split into chunks of at most
// the device's allocation size and reached through a table of chunk addresses.
struct VulkanBackend::Staged {
  Variant variant = Variant::scalar;
  EncodedPlan encoded;
  Buffer plan, q, o, lse, partial_o, partial_lse, kv_table, readback;
  std::vector<Buffer> kv_chunks;  // pool-major: pool p's K chunks, then its V chunks
  std::uint32_t chunk_slots = 0, chunks = 0;
  Runs stage1;  // passes x KV heads, numbered pass-major
  Runs merge;   // queries, each over the query heads (y)
};

VulkanBackend::VulkanBackend(const BackendOptions& options)
    : VulkanBackend(options, Instance::get(), nullptr) {}

VulkanBackend::VulkanBackend(const BackendOptions& options, std::shared_ptr<Instance> instance, const DeviceCaps* caps)
    : options_(options), instance_(std::move(instance)) {
  std::vector<DeviceCaps> devices;
  if (caps == nullptr) {
    devices = probe_devices(*instance_);
    caps = &select_device(devices, options.device);
  }
  device_ = std::make_unique<Device>(instance_, *caps);
  // TREEATTN_VK_PIPELINE_CACHE names a file that carries the driver's compiled
  // pipelines from one process to the next (read here, written back on
  // destruction). Data another device or driver wrote is not handed over: the
  // cache starts empty and the file is replaced.
  std::vector<char> cached;
  if (const char* path = std::getenv("TREEATTN_VK_PIPELINE_CACHE"); path && *path) {
    cache_path_ = path;
    if (std::ifstream in{cache_path_, std::ios::binary}) cached.assign(std::istreambuf_iterator<char>(in), {});
    if (!cached.empty() && !caps->pipeline_cache_matches(cached)) {
      if (options.verbose) {
        std::fprintf(stderr, "treeattn: ignoring the pipeline cache %s: written by another device or driver\n", path);
      }
      cached.clear();
    }
  }
  VkPipelineCacheCreateInfo cache_info{VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO};
  cache_info.initialDataSize = cached.size();
  cache_info.pInitialData = cached.data();
  TREEATTN_VK_CHECK(vkCreatePipelineCache(device_->handle(), &cache_info, nullptr, &cache_));
  if (options.verbose) {
    std::fprintf(stderr, "treeattn: Vulkan device %u: %s (%s, %s), subgroup %u, shared memory %u KiB%s\n", caps->index,
                 caps->name.c_str(), caps->type_name(), caps->driver.c_str(), caps->subgroup_size,
                 caps->shared_memory_bytes / 1024, instance_->validation() ? ", validation layer on" : "");
  }
}

std::unique_ptr<Backend> VulkanBackend::make_for_gpu(const BackendOptions& options) {
  std::shared_ptr<Instance> instance;
  std::vector<DeviceCaps> devices;
  const DeviceCaps* caps = nullptr;
  try {
    instance = Instance::get();
    devices = probe_devices(*instance);
    if (!devices.empty()) caps = &select_device(devices, options.device);
  } catch (const Error&) {
    return nullptr;  // no loader, no driver, or a bad device index: not a GPU to pick automatically
  }
  if (caps == nullptr || caps->type == VK_PHYSICAL_DEVICE_TYPE_CPU || !caps->scalar_unsupported().empty()) return nullptr;
  return std::unique_ptr<Backend>(new VulkanBackend(options, std::move(instance), caps));
}

VulkanBackend::~VulkanBackend() {
  staged_.reset();
  stage1_.clear();
  merge_.clear();
  if (cache_ == VK_NULL_HANDLE) return;
  if (!cache_path_.empty()) {
    std::size_t bytes = 0;
    std::vector<char> data;
    if (vkGetPipelineCacheData(device_->handle(), cache_, &bytes, nullptr) == VK_SUCCESS) {
      data.resize(bytes);
      if (vkGetPipelineCacheData(device_->handle(), cache_, &bytes, data.data()) == VK_SUCCESS) {
        std::ofstream(cache_path_, std::ios::binary).write(data.data(), std::streamsize(bytes));
      }
    }
  }
  vkDestroyPipelineCache(device_->handle(), cache_, nullptr);
}

Variant choose_variant(const DeviceCaps& caps, const std::string& forced, DType inputs, bool fragment_layout,
                       int head_dim, std::string* reason) {
  const bool bf16 = inputs == DType::bf16;
  std::string why_not_coopmat;
#ifdef TREEATTN_HAVE_VK_COOPMAT
  why_not_coopmat = caps.coopmat_unsupported(bf16);
#else
  why_not_coopmat = "this build's glslang cannot compile cooperative-matrix shaders (scripts/setup_glslang.sh provides one)";
#endif
  auto say = [&](std::string text) {
    if (reason) *reason = std::move(text);
  };
  const std::string shape = bf16 ? "VK_KHR_cooperative_matrix 16x16x16 bf16 -> f32, VK_KHR_shader_bfloat16"
                                 : "VK_KHR_cooperative_matrix 16x16x16 f16 -> f32";
  // Which coopmat shader, and why, once coopmat is decided.
  auto coopmat = [&](bool shared_forced, const std::string& how) {
    if (fragment_layout && !shared_forced) {
      if (head_dim == 0 || coopmat_chunk_tokens(caps, head_dim, true) > 0) {
        say("coopmat, softmax in registers (" + shape + ", elements in mma's fragment layout" + how + ")");
        return Variant::coopmat_fragments;
      }
      say(fmt::format("coopmat, softmax through shared memory (the fragments shader's two K/V stages of head_dim {} "
                      "exceed the device's {} KiB of shared memory)",
                      head_dim, caps.shared_memory_bytes / 1024));
      return Variant::coopmat_shared;
    }
    say("coopmat, softmax through shared memory (" + shape +
        (shared_forced ? ", forced by --vk-variant" : ", elements not in mma's fragment layout") + ")");
    return Variant::coopmat_shared;
  };
  if (forced == "scalar") {
    say("scalar (forced by --vk-variant)");
    return Variant::scalar;
  }
  if (forced == "coopmat" || forced == "coopmat-shared") {
    if (bf16 && !why_not_coopmat.empty() && caps.coopmat_unsupported(false).empty()) {
      // The device runs the coopmat shaders on f16 only.
      say("scalar for bf16 inputs (" + forced + " forced, but " + why_not_coopmat + ")");
      return Variant::scalar;
    }
    if (!why_not_coopmat.empty()) {
      throw Error(ErrorCategory::Backend,
                  fmt::format("--vk-variant {}: Vulkan device {} cannot run it: {}", forced, caps.name, why_not_coopmat));
    }
    return coopmat(forced == "coopmat-shared", ", forced by --vk-variant");
  }
  if (forced != "auto" && !forced.empty()) {
    throw Error(ErrorCategory::InvalidArgument,
                fmt::format("unknown Vulkan variant '{}' (choose auto, scalar, coopmat or coopmat-shared)", forced));
  }
  if (why_not_coopmat.empty()) return coopmat(false, "");
  say("scalar (coopmat: " + why_not_coopmat + ")");
  return Variant::scalar;
}

// Both coopmat shaders hold each subgroup's 16x16 Q staging tile (48-byte
// columns) and K and V rows padded by 16 bytes; the shared-memory softmax adds
// per subgroup a column of S (f32, 20 per column) and of P (f16, 24 per column)
// per token, the register one a second K/V stage (coopmat_pipeline.glsl).
std::uint32_t coopmat_chunk_tokens(const DeviceCaps& caps, int head_dim, bool fragments) {
  const std::uint32_t q_staging = 4u * 16u * 24u * 2u;
  const std::uint32_t kv_stage = 2u * (2u * std::uint32_t(head_dim) + 16u);
  const std::uint32_t per_token = fragments ? 2u * kv_stage : kv_stage + 4u * (20u * 4u + 24u * 2u);
  for (std::uint32_t chunk : {32u, 16u}) {
    if (q_staging + chunk * per_token <= caps.shared_memory_bytes) return chunk;
  }
  return 0;
}

// At --verbose, what the driver's compiler made of a pipeline (registers,
// spills, shared memory, as far as the driver reports them): occupancy and
// spills decide these shaders' speed and are otherwise invisible.
void VulkanBackend::log_statistics(const std::string& what, const ComputePipeline& pipeline) const {
  const std::vector<std::string> stats = pipeline.statistics();
  if (stats.empty()) return;
  std::string line;
  for (const auto& s : stats) line += (line.empty() ? "" : ", ") + s;
  std::fprintf(stderr, "treeattn: Vulkan pipeline %s: %s\n", what.c_str(), line.c_str());
}

const ComputePipeline& VulkanBackend::stage1_pipeline(Variant variant, int head_dim, bool bf16) {
  auto& slot = stage1_[{variant, head_dim, bf16}];
  if (!slot) {
    const bool capture = options_.verbose && device_->caps().pipeline_statistics;
    if (variant == Variant::scalar) {
      const std::uint32_t chunk = scalar_chunk_tokens(device_->caps(), head_dim);
      slot = std::make_unique<ComputePipeline>(
          *device_, cache_, SpirvModule{spirv::tree_attn_scalar, spirv::tree_attn_scalar_words},
          std::vector<std::uint32_t>{std::uint32_t(head_dim), chunk, bf16 ? 1u : 0u}, std::uint32_t(sizeof(PushConstants)),
          0, capture);
      log_statistics(fmt::format("tree_attn_scalar (head_dim {}, {}-token stages)", head_dim, chunk), *slot);
    } else {
#ifdef TREEATTN_HAVE_VK_COOPMAT
      const bool fragments = variant == Variant::coopmat_fragments;
      const SpirvModule f16 =
          fragments ? SpirvModule{spirv::tree_attn_coopmat_fragments, spirv::tree_attn_coopmat_fragments_words}
                    : SpirvModule{spirv::tree_attn_coopmat, spirv::tree_attn_coopmat_words};
      // bf16 inputs: the same shader with its 16-bit float type declared bfloat16.
      const std::vector<std::uint32_t> bf16_words =
          bf16 ? retype_f16_as_bf16(f16.words, f16.word_count) : std::vector<std::uint32_t>{};
      const SpirvModule module = bf16 ? SpirvModule{bf16_words.data(), bf16_words.size()} : f16;
      const std::uint32_t chunk = coopmat_chunk_tokens(device_->caps(), head_dim, fragments);
      slot = std::make_unique<ComputePipeline>(*device_, cache_, module,
                                               std::vector<std::uint32_t>{std::uint32_t(head_dim), chunk},
                                               std::uint32_t(sizeof(PushConstants)), 32, capture);
      log_statistics(fmt::format("{} ({}, head_dim {}, {}-token stages)",
                                 fragments ? "tree_attn_coopmat_fragments" : "tree_attn_coopmat", bf16 ? "bf16" : "f16",
                                 head_dim, chunk),
                     *slot);
#endif
    }
  }
  return *slot;
}

const ComputePipeline& VulkanBackend::merge_pipeline(int head_dim) {
  auto& slot = merge_[head_dim];
  if (!slot) {
    slot = std::make_unique<ComputePipeline>(*device_, cache_, SpirvModule{spirv::tree_merge, spirv::tree_merge_words},
                                             std::vector<std::uint32_t>{std::uint32_t(head_dim)},
                                             std::uint32_t(sizeof(PushConstants)), 0,
                                             options_.verbose && device_->caps().pipeline_statistics);
    log_statistics(fmt::format("tree_merge (head_dim {})", head_dim), *slot);
  }
  return *slot;
}

void VulkanBackend::stage(const Plan& plan, const AttentionArgs& a, int kv_pools) {
  check_supported(plan, a);
  std::string reason;
  if (!fragment_layout_) {
    // Probed once, and only where a coopmat shader may run.
    fragment_layout_ = options_.vk_variant != "scalar" && device_->caps().coopmat_unsupported(false).empty() &&
                       coopmat_fragment_layout(*device_);
  }
  const Variant variant = choose_variant(device_->caps(), options_.vk_variant, a.q.dtype, *fragment_layout_,
                                         plan.heads.head_dim, &reason);
  if (options_.verbose && reason != logged_variant_) {
    std::fprintf(stderr, "treeattn: Vulkan shader variant: %s\n", reason.c_str());
    logged_variant_ = reason;
  }
  staged_.reset();  // frees the previous call's memory first
  auto s = std::make_unique<Staged>();
  s->variant = variant;
  s->encoded = encode_plan(plan, variant == Variant::scalar ? kScalarRowsPerPass : kCoopmatRowsPerPass);

  const DeviceCaps& caps = device_->caps();
  const std::uint64_t passes = s->encoded.passes;
  s->stage1 = runs_of(caps, options_.vk_max_dispatch_run, passes * std::uint64_t(plan.heads.heads_kv), 1,
                      fmt::format("{} passes x {} KV heads stage-1 work groups (plan with longer blocks or more queries "
                                  "per item)", passes, plan.heads.heads_kv));
  s->merge = runs_of(caps, options_.vk_max_dispatch_run, std::uint64_t(plan.num_queries), 2,
                     fmt::format("{} queries x {} query heads merge work groups", plan.num_queries, plan.heads.heads_q));
  if (std::uint32_t(plan.heads.heads_q) > caps.max_work_groups[1]) {
    throw Error(ErrorCategory::InvalidArgument, fmt::format("Vulkan backend: {} query heads exceed device {}'s {} work groups in y",
                                                            plan.heads.heads_q, caps.name, caps.max_work_groups[1]));
  }

  // KV chunks: whole slots, at most one allocation each (or the test limit).
  const std::size_t slot_bytes = a.k.bytes() / std::size_t(std::max<std::int64_t>(a.k.shape[0], 1));
  std::uint64_t chunk_limit = std::min(caps.max_allocation_bytes, caps.max_buffer_bytes);
  if (options_.vk_max_chunk_bytes > 0) chunk_limit = std::min<std::uint64_t>(chunk_limit, options_.vk_max_chunk_bytes);
  s->chunk_slots = std::uint32_t(std::max<std::uint64_t>(chunk_limit / std::max<std::size_t>(slot_bytes, 1), 1));
  const std::uint64_t slots = std::uint64_t(std::max<std::int64_t>(a.k.shape[0], 1));
  s->chunks = std::uint32_t((slots + s->chunk_slots - 1) / s->chunk_slots);

  const Device& dev = *device_;
  const std::size_t plan_bytes = s->encoded.words.size() * 4;
  const std::size_t table_bytes = std::size_t(kv_pools) * 2 * s->chunks * 8;
  const std::size_t partial_rows = std::size_t(plan.num_partials) * std::size_t(plan.heads.heads_q);
  s->plan = Buffer(dev, plan_bytes, Buffer::Kind::device_local);
  s->q = Buffer(dev, a.q.bytes(), Buffer::Kind::device_local);
  s->o = Buffer(dev, a.o.bytes(), Buffer::Kind::device_local);
  s->lse = Buffer(dev, a.lse.data ? a.lse.bytes() : 0, Buffer::Kind::device_local);
  s->partial_o = Buffer(dev, partial_rows * std::size_t(plan.heads.head_dim) * 4, Buffer::Kind::device_local);
  s->partial_lse = Buffer(dev, partial_rows * 4, Buffer::Kind::device_local);
  s->kv_table = Buffer(dev, table_bytes, Buffer::Kind::device_local);
  std::vector<std::uint64_t> table;
  for (int p = 0; p < kv_pools; ++p) {
    for (int which = 0; which < 2; ++which) {
      for (std::uint32_t c = 0; c < s->chunks; ++c) {
        const std::uint64_t first = std::uint64_t(c) * s->chunk_slots;
        s->kv_chunks.emplace_back(dev, std::size_t(std::min<std::uint64_t>(s->chunk_slots, slots - first)) * slot_bytes,
                                  Buffer::Kind::device_local);
        table.push_back(s->kv_chunks.back().address());
      }
    }
  }

  // One staging buffer carries every input up and the outputs back.
  const std::size_t q_at = align16(plan_bytes), k_at = q_at + align16(a.q.bytes());
  const std::size_t v_at = k_at + align16(a.k.bytes()), table_at = v_at + align16(a.v.bytes());
  const std::size_t staging_bytes = std::max(table_at + table_bytes, align16(a.o.bytes()) + (a.lse.data ? a.lse.bytes() : 0));
  s->readback = Buffer(dev, staging_bytes, Buffer::Kind::staging);
  auto* host = static_cast<unsigned char*>(s->readback.mapped());
  std::memcpy(host, s->encoded.words.data(), plan_bytes);
  std::memcpy(host + q_at, a.q.data, a.q.bytes());
  std::memcpy(host + k_at, a.k.data, a.k.bytes());
  std::memcpy(host + v_at, a.v.data, a.v.bytes());
  std::memcpy(host + table_at, table.data(), table_bytes);

  CommandSequence upload(dev);
  upload.begin();
  upload.copy(s->readback, s->plan, plan_bytes, 0);
  upload.copy(s->readback, s->q, a.q.bytes(), q_at);
  upload.copy(s->readback, s->kv_table, table_bytes, table_at);
  for (std::size_t i = 0; i < s->kv_chunks.size(); ++i) {
    const std::size_t which = (i / s->chunks) % 2, c = i % s->chunks;
    upload.copy(s->readback, s->kv_chunks[i], s->kv_chunks[i].bytes(), (which ? v_at : k_at) + c * s->chunk_slots * slot_bytes);
  }
  upload.end();
  upload.submit_and_wait();
  staged_ = std::move(s);
}

void VulkanBackend::record_layer(CommandSequence& sequence, const Plan& plan, const AttentionArgs& a, int pool) {
  const Staged& s = *staged_;
  PushConstants pc{};
  pc.plan = s.plan.address();
  pc.q = s.q.address();
  pc.kv_chunks = s.kv_table.address() + std::uint64_t(pool) * 2 * s.chunks * 8;
  pc.o = s.o.address();
  pc.lse = a.lse.data ? s.lse.address() : 0;
  pc.partial_o = s.partial_o.address();
  pc.partial_lse = s.partial_lse.address();
  pc.chunk_slots = s.chunk_slots;
  pc.num_chunks = s.chunks;
  pc.heads_q = std::uint32_t(plan.heads.heads_q);
  pc.heads_kv = std::uint32_t(plan.heads.heads_kv);
  pc.group = std::uint32_t(plan.heads.group_size());
  pc.out_type = out_type(a.o.dtype);
  pc.scale_log2 = plan.heads.scale * 1.4426950408889634f;
  std::copy(std::begin(s.encoded.offsets), std::end(s.encoded.offsets), pc.offsets);
  pc.merge_in_order = s.encoded.merge_in_order ? 1 : 0;
  pc.groups = s.stage1.count;
  pc.run = s.stage1.length;
  const int d = plan.heads.head_dim;
  sequence.dispatch(stage1_pipeline(s.variant, d, a.q.dtype == DType::bf16), &pc, sizeof(pc), s.stage1.length,
                    s.stage1.runs);
  if (plan.num_partials > 0) {
    sequence.compute_barrier();
    pc.groups = s.merge.count;
    pc.run = s.merge.length;
    sequence.dispatch(merge_pipeline(d), &pc, sizeof(pc), s.merge.length, std::uint32_t(plan.heads.heads_q), s.merge.runs);
  }
}

CostModel VulkanBackend::cost_model() const {
  // The coopmat shaders' coefficients, fitted to the shared-memory one's
  // timings on the H100 (docs/performance.md under Vulkan):
  // every pass runs 64 rows, so a 16-row tile costs the same, and two work
  // groups share an SM (225-231 registers). The fragments shader, 1.11x faster
  // there, plans as well with them: its tiles' costs scaled by 0.85 or 0.75
  // moved DESIGN 1.001x and 0.993x (docs/performance.md).
  //
  // A pass's fixed cost is 2 500 ns, not the fit's 1 469: the fragments
  // shader's clock counters put a work group's start at 5 000-9 000 cycles
  // (its chain of loads before the first chunk) and its end at 600-2 500.
  // Only one DESIGN plan moves, 1x1024/4x256/16x128/512x32 with flatten to
  // 512-token blocks, 1.087x (DESIGN flatten 1.009x, three rounds); four
  // greedy peer plans move, 0.97-1.07x, 1.000x over the 57
  // (benchmarks/h100/vulkan_start_latency_and_pass_cost.json).
  CostModel model = cost_model_for("h100");
  model.pass_ns = 2500.0;
  model.tile_ns_large = 3993.0;
  model.tile_ns_small = 3972.0;
  model.slots = 2.0 * model.sms;
  // partial_ns stays the CUDA kernels': the fit's 86 ns, about what the merge
  // takes per row here, made greedy keep the partials of deep trees that it
  // reads whole at 169 (0.65x on 1/2/.../1024 x 16 tokens).
  //
  // A lone work group's speedup 1.25, not the CUDA kernels' 2: of 1-2 it is
  // the value whose picks among 256-1024-token blocks came closest to the
  // best measured size per tree (DESIGN 1.078x over 256, no tree slower,
  // where the best size per tree gives 1.083x; at 1.75, 1.064x and a worst of
  // 0.96x). Each SM's freed slots are refilled in turn (refill_spread 0): the
  // other order made four greedy peer plans 0.72-0.99x under the model before,
  // and moves one of the 69 flatten block sizes picked here.
  model.solo_speedup = 1.25;
  model.split_solo_speedup = 1.25;
  model.refill_spread = 0.0;
  // auto from 192 tokens: a tree whose work groups fill under one wave (the
  // small speculative and tree-of-thought trees) runs each of them alone on
  // its SM, at the pace of its chunk chain, and shorter blocks spread it over
  // more of them (DESIGN 1.029x flatten, 1.034x greedy over 256, up to 1.19x;
  // the peer shapes 0.999x); 128 gains as much on DESIGN but loses more on
  // the small 16/1 and 32/8 peer trees (0.998x). Up to 2048 tokens: long
  // prompts under many queries and the wide 32/32 trees take longer blocks
  // (the peer shapes 1.020x over 1024, up to 1.23x; few-shot b=50 0.982x at
  // 1216 tokens instead of 384, DESIGN 0.999x; docs/performance.md).
  model.auto_block_min = 192;
  model.auto_block_max = 2048;
  // Greedy's own layouts are mispredicted more here than on CUDA, so flatten's
  // is kept unless the own one is predicted 1.4x faster: 1.095x over the 57
  // peer shapes against 1.090x at 1.2, whose worst plan (one 2 000-token pass
  // per KV head, 32/32 heads) ran 0.69x.
  model.switch_gain = 1.4;
  return model;
}

void VulkanBackend::run(const Plan& plan, const AttentionArgs& a) {
  stage(plan, a, 1);
  CommandSequence sequence(*device_);
  sequence.begin();
  record_layer(sequence, plan, a, 0);
  sequence.barrier();
  sequence.copy(staged_->o, staged_->readback, a.o.bytes());
  if (a.lse.data) sequence.copy(staged_->lse, staged_->readback, a.lse.bytes(), 0, align16(a.o.bytes()));
  sequence.end();
  sequence.submit_and_wait();
  const auto* host = static_cast<const unsigned char*>(staged_->readback.mapped());
  std::memcpy(a.o.data, host, a.o.bytes());
  if (a.lse.data) std::memcpy(a.lse.data, host + align16(a.o.bytes()), a.lse.bytes());
}

std::vector<double> VulkanBackend::time_layers(const Plan& plan, const AttentionArgs& a, int layers, int repeats) {
  if (!device_->caps().timestamps) {
    throw Error(ErrorCategory::Backend, fmt::format("Vulkan device {} has no compute timestamps", device_->caps().name));
  }
  // Each layer reads its own KV pool where half the device memory holds them.
  const std::size_t pool_bytes = std::max<std::size_t>(a.k.bytes() + a.v.bytes(), 1);
  const int pools = int(std::clamp<std::uint64_t>(device_->caps().device_local_bytes / 2 / pool_bytes, 1, std::uint64_t(layers)));
  stage(plan, a, pools);
  // Larger than any last-level cache: filled before each replay so no layer
  // starts with the previous replay's KV in cache.
  Buffer flush(*device_, std::size_t(256) << 20, Buffer::Kind::device_local);

  CommandSequence sequence(*device_, 2);
  sequence.begin();
  sequence.fill(flush, 0);
  sequence.barrier();
  sequence.timestamp(0);
  for (int l = 0; l < layers; ++l) {
    if (l > 0) sequence.compute_barrier();  // this layer's stage 1 overwrites the partials the last merge read
    record_layer(sequence, plan, a, l % pools);
  }
  sequence.timestamp(1);
  sequence.barrier();
  sequence.copy(staged_->o, staged_->readback, a.o.bytes());
  sequence.end();
  std::vector<double> us;
  // Warm-up: 200 ms of replays before any is timed. After a single one, some
  // processes timed some trees up to 1.7x slower, often for every replay, so a
  // tree's median moved between runs of one binary (H100: 1x1024/4x256/... 173
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
