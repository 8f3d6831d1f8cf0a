#pragma once
// The CUDA device path: attention on the caller's device memory, enqueued on
// the caller's stream, capturable in a CUDA graph. Declared only; available
// when treeattn was built with the CUDA backend (TREEATTN_HAS_CUDA in
// treeattn/config.h). Includes no CUDA header: a stream is a cudaStream_t.
//
//   treeattn::cuda::Context ctx(/*device=*/0);
//   treeattn::PlanOptions options;
//   options.cost = ctx.cost_model();
//   treeattn::cuda::Workspace ws(ctx, limits);          // graph-stable capacities
//   for each decode step:
//     treeattn::Plan plan = planner.plan(tree, options);
//     ws.upload(plan, stream);                          // one kernel, no wait
//     for each layer: ws.enqueue({q, k[l], v[l], o, lse}, stream);   // or replay a graph
//
// Threads: a Context is immutable after construction and may be shared by any
// number of threads. A Workspace is one stream's: calls on one Workspace must
// not overlap (use one per thread or stream); different Workspaces, on one
// Context or several, run concurrently. Every call sets the context's device
// for its duration and restores the caller's current device.
//
// Memory ordering: upload() and enqueue() are ordered on the stream given;
// give one Workspace one stream (upload on another stream would race with the
// kernels that read the plan). Tensors must be device memory of the context's
// device (cudaMalloc, or a framework's allocator), valid until the kernels ran.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "treeattn/cost_model.hpp"
#include "treeattn/log.hpp"
#include "treeattn/plan.hpp"
#include "treeattn/tensor.hpp"

struct CUstream_st;  // cudaStream_t is CUstream_st*

namespace treeattn::cuda {

using Stream = CUstream_st*;

// CUDA devices this process can use (0 without a driver or a GPU).
int device_count() noexcept;

struct DeviceInfo {
  int index = 0;
  std::string name;
  std::string uuid;        // the device's UUID, 32 hex digits
  int driver_version = 0;  // cudaDriverGetVersion: 13000 is 13.0
  int sm_major = 0, sm_minor = 0;
  int sms = 0;
  double peak_gbps = 0.0;  // HBM peak from the memory clock and bus width
  int stage1_ctas_per_sm = 0;  // at head_dim 128: the cost model's slots are sms x this
};

struct ContextOptions {
  // A JSON file that keeps calibrated cost models between processes, keyed by
  // device UUID and driver version ("": this process only).
  std::string model_cache_path;
  bool verbose = false;  // log where the cost model comes from
  LogSink log;           // where messages go (none: dropped)
};

// A CUDA device bound by index (never an implicit device 0). Throws
// Error(Backend) naming the device and the reason when it cannot be used.
class Context {
 public:
  explicit Context(int device, const ContextOptions& options = {});
  const DeviceInfo& info() const noexcept { return info_; }
  int device() const noexcept { return info_.index; }
  // The planner's cost model for this device (plan with it: PlanOptions::cost):
  // the H100 fit on an H100 or H200 (sm_90, "H100" or "H200" in its name),
  // with its slots;
  // elsewhere calibrated at the first call (eleven timed plans on a stream of
  // its own: call it outside a graph capture; kept per device and driver in
  // this process and in options.model_cache_path), or, where that fails, the
  // H100 fit on this device's slots. CostModel::source says which.
  CostModel cost_model() const;

 private:
  DeviceInfo info_;
  ContextOptions options_;
};

// What a plan needs of a workspace: the arrays the kernels read and the
// partial buffers. A graph-stable Workspace is created with limits that cover
// every plan it will be given (take the maximum over representative trees
// with include(), then with_headroom()); a larger plan is refused.
struct WorkspaceLimits {
  HeadConfig heads;                // heads_q, heads_kv, head_dim and the scale every plan must have
  std::int32_t queries = 0;        // Plan::num_queries
  std::int32_t tile_entries = 0;   // (work item, query) entries: Plan::tile_query.size()
  std::int32_t partials = 0;       // Plan::num_partials
  std::int32_t passes = 0;         // stage-1 passes per KV head: each item's rows / its tile rows
  std::int32_t kv_tiles = 0;       // 64-token tiles over the work items' blocks
  std::int32_t tokens = 0;         // Plan::num_tokens()
  std::int32_t segments = 0;       // Plan::num_segments()
  std::int32_t masks = 0;          // Plan::segment_mask.size(): (work item, segment) masks
  // The most partials one query merges: not a capacity (any plan merges
  // correctly) but the choice of the merge kernel, whose lean variant is
  // faster up to 4 partials a query (Plan::max_merge_fanin()).
  std::int32_t merge_fanin = 0;

  // Exactly what `plan` needs.
  static WorkspaceLimits of(const Plan& plan);
  // Each count raised to `other`'s where that is larger (heads must agree).
  WorkspaceLimits& include(const WorkspaceLimits& other);
  // Each count times `factor` (rounded up).
  WorkspaceLimits with_headroom(double factor) const;
  // "" when `need` fits these limits; else the first count that does not,
  // with both values ("plan has 70 queries, the workspace holds 64").
  std::string first_excess(const WorkspaceLimits& need) const;
  // Device bytes a workspace of these limits allocates.
  std::size_t device_bytes() const noexcept;
};

// A plan on the device, the partial-result buffers and the host staging of
// its upload (two mapped pinned buffers: the host fills one while the GPU may
// still be reading the other).
//
// Graph-stable (constructed with limits): every buffer is allocated once, the
// kernels' grids are the limits' (the CTAs past the plan's work find empty
// records and return), so enqueue() records the same launches for every plan: capture a decode step's layers in a CUDA graph once, then each
// step upload() the new plan and replay the graph. No allocation and no
// cudaFuncSetAttribute happen after construction.
//
// Growing (constructed without limits): buffers grow to each plan at
// upload() (an allocation, so not inside a capture), and the grids are the
// plan's own. What the host-array API runs on.
class Workspace {
 public:
  Workspace(const Context& context, const WorkspaceLimits& limits);
  explicit Workspace(const Context& context);
  ~Workspace();
  Workspace(Workspace&&) noexcept;
  Workspace& operator=(Workspace&&) noexcept;

  // Encodes `plan` into the next of two mapped pinned staging buffers on the
  // host and enqueues, on `stream`, one kernel that copies the arrays the
  // attention kernels read into the workspace and builds the 64-token tile
  // maps there from the plan's slots, segments and masks, read in the staging
  // buffer over the bus. Returns without waiting for the GPU, unless the
  // kernel of two uploads back has not finished reading the buffer it fills,
  // which it then waits for. Throws InvalidArgument when the plan's
  // heads differ from the limits', InvalidPlan (graph-stable) naming the count
  // that exceeds the limits, OutOfMemory when a growing workspace cannot
  // allocate, Backend for another CUDA error; after any of them the workspace
  // holds no plan: enqueue() refuses until an upload succeeds. Call it outside
  // any graph capture.
  void upload(const Plan& plan, Stream stream);

  // Enqueues stage 1 and the merge of the last uploaded plan on `stream`;
  // returns without waiting, allocates nothing, may be captured in a graph.
  // `tensors` hold device pointers (AttentionArgs layouts; Q and O may have a
  // row stride, LSE optional) and are checked against the plan's shape: a
  // mismatch throws InvalidArgument naming the tensor.
  void enqueue(const AttentionArgs& tensors, Stream stream) const;

  bool graph_stable() const noexcept;
  const WorkspaceLimits& limits() const noexcept;  // current capacities
  const Context& context() const noexcept;

  struct State;

 private:
  std::unique_ptr<State> state_;
};

}  // namespace treeattn::cuda
