// The demo's CUDA decode loop on the device path: the KV cache lives on the
// GPU (new tokens' rows copied as they are written), each step's plan goes up
// through a graph-stable Workspace's double-buffered staging, and the step's
// layers are one CUDA graph, captured once and replayed on one stream without
// waiting, so the host plans the next step meanwhile. The workspace and the
// K/V rows' staging are sized for the run's steps reserved ahead; a plan that
// outgrows the workspace gets one with half as much room again, and the graph
// is captured again for it. Host buffers the copies read are pinned and reused
// only after their copy.

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <memory>
#include <utility>

#include <fmt/format.h>

#include "demo_runner.hpp"
#include "treeattn/cuda.hpp"

namespace treeattn::cli {
namespace {

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw Error(ErrorCategory::Backend, fmt::format("demo: {}: {}", what, cudaGetErrorString(err)));
}

// Pinned host memory the stream copies from, and when its last copy is done.
class Staging {
 public:
  Staging() { check(cudaEventCreateWithFlags(&copied_, cudaEventDisableTiming), "cudaEventCreate"); }
  ~Staging() {
    if (pending_) cudaEventSynchronize(copied_);
    cudaEventDestroy(copied_);
    if (data_ != nullptr) cudaFreeHost(data_);
  }
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;

  // `bytes` of it, free to write: its last copy has completed.
  unsigned char* take(std::size_t bytes) {
    if (pending_) check(cudaEventSynchronize(copied_), "cudaEventSynchronize");
    pending_ = false;
    if (bytes > capacity_) {
      if (data_ != nullptr) check(cudaFreeHost(data_), "cudaFreeHost");
      capacity_ = std::max(bytes, 2 * capacity_);
      check(cudaMallocHost(&data_, capacity_), "cudaMallocHost");
    }
    return static_cast<unsigned char*>(data_);
  }
  // The copies from it are queued on `stream`.
  void queued(cudaStream_t stream) {
    check(cudaEventRecord(copied_, stream), "cudaEventRecord");
    pending_ = true;
  }

 private:
  void* data_ = nullptr;
  std::size_t capacity_ = 0;
  cudaEvent_t copied_ = nullptr;
  bool pending_ = false;
};

class DeviceMemory {
 public:
  explicit DeviceMemory(std::size_t bytes) { check(cudaMalloc(&data_, std::max<std::size_t>(bytes, 16)), "cudaMalloc"); }
  ~DeviceMemory() { cudaFree(data_); }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  unsigned char* get() const { return static_cast<unsigned char*>(data_); }

 private:
  void* data_ = nullptr;
};

class CudaRunner final : public StepRunner {
 public:
  CudaRunner(const BackendOptions& options, const HeadConfig& heads, HostArray& k, HostArray& v, std::int64_t max_queries,
             const AttentionOptions& variants)
      : context_(options.device < 0 ? 0 : options.device),
        device_(select(context_.device())),
        k_host_(k),
        v_host_(v),
        q_bytes_(std::size_t(max_queries * heads.heads_q * heads.head_dim) * 2),  // f16
        k_(k.bytes.size()),
        v_(v.bytes.size()),
        q_(q_bytes_),
        o_(std::size_t(max_queries * heads.heads_q * heads.value_dim()) * 4),  // f32
        lse_(std::size_t(max_queries * heads.heads_q) * 4),
        variants_(variants) {
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    for (cudaEvent_t& e : queued_) check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
    check(cudaMemcpy(k_.get(), k.bytes.data(), k.bytes.size(), cudaMemcpyHostToDevice), "K upload");
    check(cudaMemcpy(v_.get(), v.bytes.data(), v.bytes.size(), cudaMemcpyHostToDevice), "V upload");
    // The variants' tensors (sinks, per-head scales) copied up once, as the layers' options.
    for (auto [name, t] : {std::pair{"sinks", &variants_.sinks}, {"k_scales", &variants_.k_scales}, {"v_scales", &variants_.v_scales}}) {
      if (t->data == nullptr) continue;
      const DeviceMemory& copy = option_tensors_.emplace_back(t->bytes());
      check(cudaMemcpy(copy.get(), t->data, t->bytes(), cudaMemcpyHostToDevice), name);
      t->data = copy.get();
    }
  }
  ~CudaRunner() override {
    cudaStreamSynchronize(stream_);
    if (graph_ != nullptr) cudaGraphExecDestroy(graph_);
    for (const Pending& p : pending_) {
      cudaEventDestroy(p.start);
      cudaEventDestroy(p.stop);
    }
    for (cudaEvent_t e : queued_) cudaEventDestroy(e);
    cudaStreamDestroy(stream_);
  }

  const char* name() const noexcept override { return "CUDA device path"; }
  bool overlaps() const noexcept override { return true; }

  void kv_written(const std::vector<std::int64_t>& slots) override {
    if (slots.empty()) return;
    std::vector<std::int64_t> sorted = slots;
    std::sort(sorted.begin(), sorted.end());
    const std::size_t row = k_host_.bytes.size() / std::size_t(k_host_.shape[0]);
    Staging& staging = kv_staging_[next_kv_];
    next_kv_ = 1 - next_kv_;
    // Room for the most rows a reserved step writes: pinned once, not at each new most.
    unsigned char* host = staging.take(2 * row * std::max(sorted.size(), reserved_rows_));
    // Consecutive slots (a page's tokens) go in one copy per pool.
    for (std::size_t a = 0; a < sorted.size();) {
      std::size_t b = a + 1;
      while (b < sorted.size() && sorted[b] == sorted[b - 1] + 1) ++b;
      const std::size_t first = std::size_t(sorted[a]), bytes = row * (b - a);
      unsigned char* k_rows = host + 2 * row * a;
      unsigned char* v_rows = k_rows + bytes;
      std::memcpy(k_rows, k_host_.bytes.data() + first * row, bytes);
      std::memcpy(v_rows, v_host_.bytes.data() + first * row, bytes);
      check(cudaMemcpyAsync(k_.get() + first * row, k_rows, bytes, cudaMemcpyHostToDevice, stream_), "K rows");
      check(cudaMemcpyAsync(v_.get() + first * row, v_rows, bytes, cudaMemcpyHostToDevice, stream_), "V rows");
      a = b;
    }
    staging.queued(stream_);
  }

  bool reserves_ahead() const noexcept override { return true; }
  void reserve(const Plan& plan, std::size_t written_rows) override {
    largest_.include(cuda::WorkspaceLimits::of(plan));
    reserved_rows_ = std::max(reserved_rows_, written_rows);
    reserved_ = true;
  }

  HostTimes run(const Plan& plan, const HostArray& q, int layers) override {
    // The plan and Q staging buffers this step fills were last copied from two
    // steps back: a host that far ahead waits here for that step to start,
    // timed apart from the upload's own host work.
    HostTimes times;
    const auto w0 = std::chrono::steady_clock::now();
    if (queued_pending_[next_q_]) check(cudaEventSynchronize(queued_[next_q_]), "cudaEventSynchronize");
    const auto t0 = std::chrono::steady_clock::now();
    times.waited_us = std::chrono::duration<double, std::micro>(t0 - w0).count();
    const bool regrown = fit_workspace(plan);
    workspace_->upload(plan, stream_);
    times.upload_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();

    Staging& staging = q_staging_[next_q_];
    next_q_ = 1 - next_q_;
    unsigned char* host = staging.take(std::max(q.bytes.size(), q_bytes_));  // pinned once: Q of the most queries
    std::memcpy(host, q.bytes.data(), q.bytes.size());
    check(cudaMemcpyAsync(q_.get(), host, q.bytes.size(), cudaMemcpyHostToDevice, stream_), "Q");
    staging.queued(stream_);
    check(cudaEventRecord(queued_[1 - next_q_], stream_), "cudaEventRecord");  // the step's copies are done
    queued_pending_[1 - next_q_] = true;

    const HeadConfig& h = plan.heads;
    const std::int64_t nq = plan.num_queries;
    last_ = AttentionArgs{TensorRef{q_.get(), q.dtype, q.shape},
                          TensorRef{k_.get(), k_host_.dtype, k_host_.shape},
                          TensorRef{v_.get(), v_host_.dtype, v_host_.shape},
                          TensorRef{o_.get(), DType::f32, {nq, h.heads_q, h.value_dim()}},
                          TensorRef{lse_.get(), DType::f32, {nq, h.heads_q}},
                          variants_};
    ++runs_;
    if (regrown || layers != graph_layers_) capture(layers);
    Pending p;
    check(cudaEventCreate(&p.start), "cudaEventCreate");
    check(cudaEventCreate(&p.stop), "cudaEventCreate");
    check(cudaEventRecord(p.start, stream_), "cudaEventRecord");
    check(cudaGraphLaunch(graph_, stream_), "cudaGraphLaunch");
    check(cudaEventRecord(p.stop, stream_), "cudaEventRecord");
    pending_.push_back(p);
    return times;
  }

  // Device-wide, other processes' memory included, as the driver counts it.
  MemoryUse device_memory() const override {
    std::size_t free = 0, total = 0;
    check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
    return {std::int64_t(total - free), "cudaMemGetInfo (device-wide used)"};
  }
  Captures graph_captures() const noexcept override { return captures_; }

  std::vector<double> finished(bool wait) override {
    std::vector<double> us;
    while (!pending_.empty()) {
      Pending& p = pending_.front();
      if (wait) check(cudaEventSynchronize(p.stop), "cudaEventSynchronize");
      else if (cudaEventQuery(p.stop) == cudaErrorNotReady) break;
      float ms = 0.0f;
      check(cudaEventElapsedTime(&ms, p.start, p.stop), "cudaEventElapsedTime");
      us.push_back(double(ms) * 1e3);
      cudaEventDestroy(p.start);
      cudaEventDestroy(p.stop);
      pending_.pop_front();
    }
    return us;
  }

  void outputs(HostArray& o, HostArray& lse) override {
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    o = HostArray(DType::f32, last_.o.shape);
    lse = HostArray(DType::f32, last_.lse.shape);
    check(cudaMemcpy(o.bytes.data(), o_.get(), o.bytes.size(), cudaMemcpyDeviceToHost), "O");
    check(cudaMemcpy(lse.bytes.data(), lse_.get(), lse.bytes.size(), cudaMemcpyDeviceToHost), "LSE");
  }

 private:
  // A graph-stable workspace that holds `plan`: the one in use, or a new one
  // made after the steps queued on the old one: at the first step, exactly
  // the limits of the steps reserved ahead; else (none reserved, or a plan
  // beyond them) half as much room again as the largest plan so far. True
  // when it is new: the graph of the layers is then captured again.
  bool fit_workspace(const Plan& plan) {
    const cuda::WorkspaceLimits need = cuda::WorkspaceLimits::of(plan);
    if (workspace_ && workspace_->limits().first_excess(need).empty()) return false;
    const bool sized_ahead = !workspace_ && reserved_;
    if (workspace_) check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");  // its last steps still read it
    largest_.include(need);
    workspace_.reset();
    workspace_ = std::make_unique<cuda::Workspace>(context_, sized_ahead ? largest_ : largest_.with_headroom(1.5));
    return true;
  }

  // The step's layers as one graph on the current workspace, Q, O and LSE
  // (sized for the most queries a step has; each replay reads the uploaded
  // plan's count).
  void capture(int layers) {
    if (graph_ != nullptr) check(cudaGraphExecDestroy(graph_), "cudaGraphExecDestroy");
    graph_ = nullptr;
    cudaGraph_t captured = nullptr;
    check(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    try {
      for (int layer = 0; layer < layers; ++layer) workspace_->enqueue(last_, stream_);
    } catch (...) {
      cudaStreamEndCapture(stream_, &captured);
      if (captured != nullptr) cudaGraphDestroy(captured);
      throw;
    }
    check(cudaStreamEndCapture(stream_, &captured), "cudaStreamEndCapture");
    const cudaError_t made = cudaGraphInstantiate(&graph_, captured, 0);
    cudaGraphDestroy(captured);
    check(made, "cudaGraphInstantiate");
    graph_layers_ = layers;
    ++captures_.count;
    captures_.last_step = runs_;
  }

  // Makes the context's device current for the allocations that follow.
  static int select(int device) {
    check(cudaSetDevice(device), "cudaSetDevice");
    return device;
  }

  struct Pending {
    cudaEvent_t start = nullptr, stop = nullptr;
  };
  cuda::Context context_;
  int device_;
  std::unique_ptr<cuda::Workspace> workspace_;  // graph-stable (fit_workspace)
  cuda::WorkspaceLimits largest_;                // the largest counts of the plans reserved and run so far
  bool reserved_ = false;                        // plans were reserved ahead
  std::size_t reserved_rows_ = 0;                // the most K/V rows a step reserved ahead writes
  cudaGraphExec_t graph_ = nullptr;              // a step's layers on it (capture)
  int graph_layers_ = 0;
  std::int64_t runs_ = 0;
  Captures captures_{0, 0};
  HostArray &k_host_, &v_host_;
  std::size_t q_bytes_;  // Q of the most queries a step has
  DeviceMemory k_, v_, q_, o_, lse_;
  AttentionOptions variants_;                // the calls' attention variants, their tensors in device memory
  std::deque<DeviceMemory> option_tensors_;  // those tensors (a deque: they do not move)
  cudaStream_t stream_ = nullptr;
  Staging kv_staging_[2], q_staging_[2];
  int next_kv_ = 0, next_q_ = 0;
  cudaEvent_t queued_[2] = {nullptr, nullptr};  // per Q staging buffer: its step's plan and Q copies done
  bool queued_pending_[2] = {false, false};
  AttentionArgs last_;
  std::deque<Pending> pending_;
};

}  // namespace

std::unique_ptr<StepRunner> make_cuda_step_runner(const BackendOptions& options, const HeadConfig& heads, HostArray& k,
                                                  HostArray& v, std::int64_t max_queries, const AttentionOptions& variants) {
  return std::make_unique<CudaRunner>(options, heads, k, v, max_queries, variants);
}

}  // namespace treeattn::cli
