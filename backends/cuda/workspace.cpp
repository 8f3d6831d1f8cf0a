// treeattn::cuda::Workspace: a plan's arrays on the device at offsets fixed by
// the workspace's limits, padded so that a grid of the limits' size finds
// nothing to do past the plan; the partial buffers; and two pinned staging
// buffers for the uploads.

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <utility>

#include "../../cuda/attn_launch.hpp"
#include "device_buffer.hpp"
#include "device_scope.hpp"
#include "lowering.hpp"
#include "backend.hpp"
#include "treeattn/cuda.hpp"

namespace treeattn::cuda {

static_assert(kRowsPerPass == kLargeTileRows && kSmallTileRows <= 16,
              "a stage-1 CTA takes a large tile's 64 rows; small tiles run its 16-row split-KV path");
static_assert(kTileTokens == kKvTileTokens, "the kernels' KV tile is the one the cost model prices");

namespace {

// Each array starts on a 256-byte boundary: a 32-byte pass record or a
// 768-byte tile map never straddles more cache sectors than it fills,
// whatever the sizes of the arrays before it.
std::size_t align256(std::size_t bytes) { return (bytes + 255) / 256 * 256; }

// A growing workspace's room beyond the plan that outgrew it (Workspace::upload).
constexpr double kGrowthHeadroom = 1.5;

// The arrays of an uploaded plan. The first four are in the workspace and in
// the staging buffers at the same offsets (the upload kernel copies them
// across); then the workspace holds the tile maps, which the upload kernel
// builds from the arrays the staging buffers hold there instead (read where
// the host wrote them).
enum Array {
  kTileQuery, kTilePartial, kMergeBegin, kPasses,                           // both
  kTileMap,                                                                 // the workspace's
  kTokenSlot, kSegmentBegin, kSegmentOffset, kSegmentMask, kTileSource,     // the staging buffers'
  kArrays
};
constexpr int kShared = kTileMap;  // arrays in both

struct Layout {
  std::size_t offset[kArrays] = {};
  std::size_t finished_ctas = 0;  // the upload kernel's CTA counter (PlanUpload), after the device's arrays
  std::size_t device_total = 0, staged_total = 0;

  explicit Layout(const WorkspaceLimits& l) {
    const std::size_t bytes[kArrays] = {
        std::size_t(l.tile_entries) * 4,
        std::size_t(l.tile_entries) * 4,
        std::size_t(l.queries + 1) * 4,
        std::size_t(l.passes) * sizeof(PassInfo),
        std::size_t(l.kv_tiles) * sizeof(TileMap),
        std::size_t(l.tokens) * 4,
        std::size_t(l.segments) * 4,
        std::size_t(l.segments) * 4,
        std::size_t(l.masks) * 8,
        std::size_t(l.kv_tiles) * sizeof(TileSource),
    };
    std::size_t at = 0;
    for (int a = 0; a < kShared; ++a) offset[a] = std::exchange(at, at + align256(bytes[a]));
    offset[kTileMap] = at;
    finished_ctas = at + align256(bytes[kTileMap]);
    device_total = finished_ctas + 256;
    for (int a = kTileMap + 1; a < kArrays; ++a) offset[a] = std::exchange(at, at + align256(bytes[a]));
    staged_total = at;
  }
};

std::size_t partial_bytes(const WorkspaceLimits& l) {
  const std::size_t rows = std::size_t(l.partials) * std::size_t(l.heads.heads_q);
  return std::max<std::size_t>(rows * std::size_t(l.heads.value_dim() + 1) * 4, 16);
}

ElementType element_type(DType dtype) {
  switch (dtype) {
    case DType::f16: return ElementType::f16;
    case DType::bf16: return ElementType::bf16;
    case DType::f32: return ElementType::f32;
    case DType::fp8_e4m3: return ElementType::fp8_e4m3;
    case DType::fp8_e5m2: return ElementType::fp8_e5m2;
  }
  throw Error(ErrorCategory::InvalidArgument,
              fmt::format("CUDA backend: the kernels take f16, bf16, f32 or fp8 elements, not {}", to_string(dtype)));
}

// The call's attention variants into the kernels' parameters (check_args has
// checked them: dense f32 tensors of the right lengths, in device memory here).
void set_options(KernelParams& p, const AttentionOptions& o) {
  p.softcap_log2 = o.logit_softcap * 1.4426950408889634f;
  p.k_scale = o.k_scale;
  p.v_scale = o.v_scale;
  p.k_scales = static_cast<const float*>(o.k_scales.data);
  p.v_scales = static_cast<const float*>(o.v_scales.data);
  p.sinks = static_cast<const float*>(o.sinks.data);
}

}  // namespace

// --- WorkspaceLimits (the counts: engine/src/workspace_limits.cpp) ---------

std::size_t WorkspaceLimits::device_bytes() const noexcept {
  return Layout(*this).device_total + partial_bytes(*this);
}

// --- Workspace ---------------------------------------------------------------

struct Workspace::State {
  explicit State(const Context& c) : context(c) {}
  // Released on the buffers' device, once the last uploads have read them;
  // the caller's current device given back.
  ~State() {
    int previous = 0;
    cudaGetDevice(&previous);
    cudaSetDevice(context.device());
    for (int b = 0; b < 2; ++b) {
      if (copy_pending[b]) cudaEventSynchronize(copied[b]);
      if (copied[b]) cudaEventDestroy(copied[b]);
      staging[b] = MappedBuffer();
    }
    done = MappedBuffer();
    arrays = DeviceBuffer();
    partials = DeviceBuffer();
    cudaSetDevice(previous);
  }
  State(const State&) = delete;
  State& operator=(const State&) = delete;

  Context context;
  bool graph_stable;
  WorkspaceLimits limits;
  DeviceBuffer arrays;    // Layout(limits): the device's arrays, then the upload kernel's counter
  DeviceBuffer partials;  // partial O, then partial LSE
  MappedBuffer staging[2];
  unsigned char* staging_device[2] = {nullptr, nullptr};  // their device addresses
  // Per staging buffer: the ticket of its last upload, which that upload's
  // kernel writes into its word of `done` once it has read the buffer; and an
  // event after that kernel, waited for only while the word says otherwise.
  MappedBuffer done;
  std::uint64_t* done_device = nullptr;  // its device address
  std::uint64_t ticket[2] = {0, 0}, tickets = 0;
  cudaEvent_t copied[2] = {nullptr, nullptr};
  bool copy_pending[2] = {false, false};
  int next = 0;
  std::size_t passes_filled = 0;  // pass records on the device that are not empty
  Lowering lowered;                // upload's, its vectors kept for the next plan
  KernelParams params{};      // the plan's part; enqueue adds the tensors
  LaunchGeometry geometry;
  CallShape shape;            // of the uploaded plan, for enqueue's checks
  bool allocated = false;     // the buffers and params are those of `limits`
  bool uploaded = false;      // the last upload succeeded: there is a plan to enqueue

  // What both constructors make: the events and the done words.
  void create() {
    for (cudaEvent_t& e : copied) TREEATTN_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    done.reserve(2 * sizeof(std::uint64_t));
    std::fill_n(done.as<std::uint64_t>(), 2, 0);
    void* device = nullptr;
    TREEATTN_CUDA_CHECK(cudaHostGetDevicePointer(&device, done.data(), 0));
    done_device = static_cast<std::uint64_t*>(device);
  }

  // (Re)allocates everything for `limits` and points the params at it; the
  // arrays are zeroed on `stream`, ahead of any upload ordered after it.
  void allocate(cudaStream_t stream) {
    const Layout layout(limits);
    arrays.reserve(layout.device_total);
    // Zero pass records are empty: a graph-stable grid's CTAs past a plan's
    // passes return at once; and the upload kernel's counter starts at 0.
    TREEATTN_CUDA_CHECK(cudaMemsetAsync(arrays.data(), 0, layout.device_total, stream));
    passes_filled = 0;
    partials.reserve(partial_bytes(limits));
    for (int b = 0; b < 2; ++b) {
      wait_for_copy(b);
      staging[b].reserve(layout.staged_total);
      void* device = nullptr;
      TREEATTN_CUDA_CHECK(cudaHostGetDevicePointer(&device, staging[b].data(), 0));
      staging_device[b] = static_cast<unsigned char*>(device);
    }
    const auto at = [&](Array a) { return arrays.as<unsigned char>() + layout.offset[a]; };
    params.tile_query = reinterpret_cast<const std::int32_t*>(at(kTileQuery));
    params.tile_partial = reinterpret_cast<const std::int32_t*>(at(kTilePartial));
    params.merge_begin = reinterpret_cast<const std::int32_t*>(at(kMergeBegin));
    params.tile_map = reinterpret_cast<const TileMap*>(at(kTileMap));
    params.passes = reinterpret_cast<const PassInfo*>(at(kPasses));
    const std::size_t partial_rows = std::size_t(limits.partials) * std::size_t(limits.heads.heads_q);
    params.partial_o = partials.as<float>();
    params.partial_lse = partials.as<float>() + partial_rows * std::size_t(limits.heads.value_dim());
    params.max_queries = std::max(limits.queries, 1);
    params.heads_q = limits.heads.heads_q;
    params.heads_kv = limits.heads.heads_kv;
    params.group = limits.heads.group_size();
    params.scale_log2 = limits.heads.effective_scale() * 1.4426950408889634f;
    allocated = true;
  }

  // Staging buffer b may be written once the upload kernel that read it has
  // finished: its done word says so without a driver call, else the event waits.
  void wait_for_copy(int b) {
    if (!copy_pending[b]) return;
    const volatile std::uint64_t* word = done.as<std::uint64_t>() + b;
    if (*word != ticket[b]) TREEATTN_CUDA_CHECK(cudaEventSynchronize(copied[b]));
    std::atomic_thread_fence(std::memory_order_acquire);  // the buffer's writes come after the kernel's reads
    copy_pending[b] = false;
  }
};

Workspace::Workspace(const Context& context, const WorkspaceLimits& limits) : state_(std::make_unique<State>(context)) {
  if (limits.heads.heads_q <= 0 || limits.heads.heads_kv <= 0 || limits.heads.head_dim <= 0) {
    throw Error(ErrorCategory::InvalidArgument,
                fmt::format("workspace limits: heads {} are not set (take them from WorkspaceLimits::of(plan))",
                            describe(limits.heads)));
  }
  State& s = *state_;
  s.graph_stable = true;
  s.limits = limits;
  DeviceScope scope(context.device());
  s.create();
  // A stream of its own for the zeroing, waited for here: the caller's streams
  // are not touched. Destroyed on every path out, a failed allocation's too.
  struct OwnStream {
    cudaStream_t stream = nullptr;
    ~OwnStream() {
      if (stream != nullptr) {
        cudaStreamSynchronize(stream);
        cudaStreamDestroy(stream);
      }
    }
  } own;
  TREEATTN_CUDA_CHECK(cudaStreamCreateWithFlags(&own.stream, cudaStreamNonBlocking));
  s.allocate(own.stream);
  TREEATTN_CUDA_CHECK(cudaStreamSynchronize(own.stream));
  s.geometry = LaunchGeometry{limits.passes, limits.queries, limits.merge_fanin <= kMergeLeanBatch};
}

Workspace::Workspace(const Context& context) : state_(std::make_unique<State>(context)) {
  State& s = *state_;
  s.graph_stable = false;
  DeviceScope scope(context.device());
  s.create();
}

Workspace::~Workspace() = default;

Workspace::Workspace(Workspace&&) noexcept = default;
Workspace& Workspace::operator=(Workspace&&) noexcept = default;

bool Workspace::graph_stable() const noexcept { return state_->graph_stable; }
const WorkspaceLimits& Workspace::limits() const noexcept { return state_->limits; }
const Context& Workspace::context() const noexcept { return state_->context; }

void Workspace::upload(const Plan& plan, Stream stream) {
  State& s = *state_;
  // A failure below leaves no plan to run: enqueue refuses until an upload succeeds.
  s.uploaded = false;
  DeviceScope scope(s.context.device());
  const WorkspaceLimits need = WorkspaceLimits::of(plan);
  if (s.graph_stable) {
    if (!s.limits.heads.same_as(plan.heads)) {
      throw Error(ErrorCategory::InvalidArgument, fmt::format("plan has heads {}, the workspace was made for {}",
                                                              describe(plan.heads), describe(s.limits.heads)));
    }
    if (const std::string excess = s.limits.first_excess(need); !excess.empty()) {
      throw Error(ErrorCategory::InvalidPlan, fmt::format("graph-stable workspace: {}", excess));
    }
  } else if (!s.allocated || !s.limits.heads.same_as(plan.heads) || !s.limits.first_excess(need).empty()) {
    // A decode loop's plans grow a little every step: room for half as much
    // again, so the buffers are replaced (waiting for the stream) only as
    // often as the tree grows by half, not at every step.
    WorkspaceLimits grown = s.limits.heads.same_as(plan.heads) ? s.limits : WorkspaceLimits{};
    grown.include(need.with_headroom(kGrowthHeadroom));
    // Kernels of an earlier call may still read the buffers being replaced.
    if (s.arrays.data() != nullptr) TREEATTN_CUDA_CHECK(cudaStreamSynchronize(stream));
    s.allocated = false;  // until allocate() has made buffers of these limits
    s.limits = grown;
    s.allocate(stream);
  }

  // The staging buffer filled now was last read two uploads back.
  const int b = s.next;
  s.wait_for_copy(b);
  unsigned char* host = s.staging[b].as<unsigned char>();
  const Layout layout(s.limits);

  // The plan's passes, tiles and partials as every backend's kernels take
  // them (lowering.hpp), in the layout of attn_params.hpp.
  lower(plan, kRowsPerPass, s.lowered);
  const Lowering& lowered = s.lowered;
  auto put = [&](Array a, const auto& values) {
    std::memcpy(host + layout.offset[a], values.data(), values.size() * sizeof(values[0]));
  };
  put(kTileQuery, plan.tile_query);
  put(kTilePartial, lowered.tile_partial);
  // merge_begin up to the workspace's queries: the queries past the plan's
  // have no partials (the merge's grid may reach them).
  auto* merge_begin = reinterpret_cast<std::int32_t*>(host + layout.offset[kMergeBegin]);
  std::copy(plan.merge_begin.begin(), plan.merge_begin.end(), merge_begin);
  std::fill(merge_begin + plan.merge_begin.size(), merge_begin + s.limits.queries + 1, plan.merge_begin.back());

  // The plan's tokens, segments and masks as they are, each segment's first
  // token counted in its block, and one source record per 64-token tile of
  // each item: the device builds the tile maps from them (tile_maps.cu).
  put(kTokenSlot, plan.token_slot);
  put(kSegmentBegin, plan.segment_token_begin);
  put(kSegmentMask, plan.segment_mask);
  put(kSegmentOffset, lowered.segment_offset);
  auto* sources = reinterpret_cast<TileSource*>(host + layout.offset[kTileSource]);
  const std::int32_t tiles = std::int32_t(lowered.tiles.size());
  for (std::int32_t t = 0; t < tiles; ++t) {
    const LoweredTile& l = lowered.tiles[std::size_t(t)];
    sources[t] = TileSource{l.segment_first, l.segment_end, l.mask_first, l.first_token, l.block_tokens, {}};
  }
  auto* passes = reinterpret_cast<PassInfo*>(host + layout.offset[kPasses]);
  const std::size_t pass = lowered.passes.size();
  for (std::size_t k = 0; k < pass; ++k) {
    const LoweredPass& p = lowered.passes[k];
    const std::size_t item = std::size_t(p.item);
    passes[k] = PassInfo{p.query_begin, lowered.item_tile[item], lowered.item_tile[item + 1], p.row_begin, p.row_end, {}};
  }

  // The records past this plan's that an earlier plan filled are emptied (a
  // graph-stable grid reaches them; the rest were zeroed at allocation).
  const std::size_t filled = std::max(pass, s.passes_filled);
  std::fill(passes + pass, passes + filled, PassInfo{});

  // One kernel: the arrays the attention kernels read, each its used bytes,
  // copied across (a graph-stable layout leaves room between them), and the
  // tile maps built from the staged arrays where they are.
  PlanUpload u{};
  const std::size_t used[kShared] = {plan.tile_query.size() * 4, plan.tile_partial.size() * 4,
                                     std::size_t(s.limits.queries + 1) * 4, filled * sizeof(PassInfo)};
  std::int64_t words = 0;
  for (int a = 0; a < kShared; ++a) {
    u.copies[a] = CopyRange{s.staging_device[b] + layout.offset[a], s.arrays.as<unsigned char>() + layout.offset[a],
                            std::int64_t((used[a] + 15) / 16)};  // within the array's 256-byte aligned room
    words += u.copies[a].words;
  }
  const auto staged = [&](Array a) { return s.staging_device[b] + layout.offset[a]; };
  u.sources = reinterpret_cast<const TileSource*>(staged(kTileSource));
  u.token_slot = reinterpret_cast<const std::int32_t*>(staged(kTokenSlot));
  u.segment_token_begin = reinterpret_cast<const std::int32_t*>(staged(kSegmentBegin));
  u.segment_offset = reinterpret_cast<const std::int32_t*>(staged(kSegmentOffset));
  u.segment_mask = reinterpret_cast<const std::uint64_t*>(staged(kSegmentMask));
  u.tile_map = reinterpret_cast<TileMap*>(s.arrays.as<unsigned char>() + layout.offset[kTileMap]);
  u.finished_ctas = reinterpret_cast<std::uint32_t*>(s.arrays.as<unsigned char>() + layout.finished_ctas);
  u.done = s.done_device + b;
  u.ticket = s.ticket[b] = ++s.tickets;
  u.tiles = tiles;
  // A CTA copies 64 x 16 bytes a step: about four steps each, up to 64 CTAs.
  u.copy_ctas = std::int32_t(std::clamp<std::int64_t>((words + 255) / 256, 1, 64));
  TREEATTN_CUDA_CHECK(launch_upload_plan(u, stream));
  s.passes_filled = pass;  // once the kernel that empties the records past it is on the stream
  try {
    TREEATTN_CUDA_CHECK(cudaEventRecord(s.copied[b], stream));
  } catch (const Error&) {
    // No event tells when the kernel has read staging buffer b: it has, once the stream is idle.
    cudaStreamSynchronize(stream);
    throw;
  }
  s.copy_pending[b] = true;
  s.next = 1 - b;

  if (!s.graph_stable) {
    s.geometry = LaunchGeometry{need.passes, plan.num_partials > 0 ? plan.num_queries : 0,
                                plan.max_merge_fanin() <= kMergeLeanBatch};
  }
  s.shape = CallShape::of(plan);
  s.uploaded = true;
}

void Workspace::enqueue(const AttentionArgs& a, Stream stream) const {
  const State& s = *state_;
  if (!s.uploaded) throw Error(ErrorCategory::InvalidArgument, "enqueue before any plan was uploaded to the workspace");
  check_args(s.shape, a);
  DeviceScope scope(s.context.device());
  KernelParams p = s.params;
  p.q = a.q.data;
  p.k = a.k.data;
  p.v = a.v.data;
  p.o = a.o.data;
  p.lse = static_cast<float*>(a.lse.data);
  p.q_row_stride = a.q.row_pitch();
  p.o_row_stride = a.o.row_pitch();
  // One stride for K and V (one multiply a row) where their rows are equally
  // wide; V's own where they are narrower than K's (head_dim_v < head_dim).
  const HeadConfig& heads = s.limits.heads;
  if (heads.value_dim() == heads.head_dim && a.k.row_pitch() != a.v.row_pitch()) {
    throw Error(ErrorCategory::InvalidArgument,
                fmt::format("CUDA backend: K and V rows must be equally far apart (got K {}, V {})", describe(a.k),
                            describe(a.v)));
  }
  p.kv_row_stride = a.k.row_pitch();
  p.v_row_stride = a.v.row_pitch();
  p.out_type = element_type(a.o.dtype);
  set_options(p, a.options);
  TREEATTN_CUDA_CHECK(launch_tree_attention(p, s.geometry, heads.head_dim, heads.value_dim(), element_type(a.q.dtype),
                                            element_type(a.k.dtype), stream));
}

}  // namespace treeattn::cuda
