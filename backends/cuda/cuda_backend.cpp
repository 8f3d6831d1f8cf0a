#include "cuda_backend.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "../../cuda/attn_launch.hpp"
#include "device_scope.hpp"

namespace treeattn::cuda {
namespace {

// Copies `rows` rows of `row_bytes` between memories whose rows are `from_pitch` and `to_pitch` bytes apart.
void copy_rows(void* to, std::size_t to_pitch, const void* from, std::size_t from_pitch, std::size_t row_bytes,
               std::size_t rows, cudaMemcpyKind kind, cudaStream_t stream) {
  if (rows == 0) return;
  TREEATTN_CUDA_CHECK(cudaMemcpy2DAsync(to, to_pitch, from, from_pitch, row_bytes, rows, kind, stream));
}

std::size_t pitch_bytes(const TensorRef& t) { return std::size_t(t.row_pitch()) * dtype_size(t.dtype); }
std::size_t row_bytes(const TensorRef& t) { return std::size_t(t.row_elements()) * dtype_size(t.dtype); }
std::size_t rows(const TensorRef& t) { return t.shape.empty() ? 0 : std::size_t(t.shape[0]); }

// A host option tensor (sinks, scales: dense, check_args says) copied into
// `to`; the device tensor, or none where the call gives none.
TensorRef stage_option(DeviceBuffer& to, const TensorRef& t, cudaStream_t stream) {
  if (t.data == nullptr) return t;
  to.reserve(std::max<std::size_t>(t.bytes(), 16));
  TREEATTN_CUDA_CHECK(cudaMemcpyAsync(to.data(), t.data, t.bytes(), cudaMemcpyHostToDevice, stream));
  TensorRef device = t;
  device.data = to.data();
  return device;
}

}  // namespace

CudaBackend::CudaBackend(const BackendOptions& options)
    : options_(options),
      context_(options.device >= 0 ? options.device : 0, ContextOptions{options.model_cache, options.verbose, options.log}),
      workspace_(context_) {
  DeviceScope scope(context_.device());
  TREEATTN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  if (options.verbose) {
    const DeviceInfo& d = context_.info();
    log_to(options.log, LogLevel::info,
           fmt::format("treeattn: CUDA device {}: {} (sm_{}{}, {} SMs, {:.0f} GB/s)", d.index, d.name, d.sm_major,
                       d.sm_minor, d.sms, d.peak_gbps));
    const Stage1Occupancy stage1 = stage1_occupancy(128, 128);
    log_to(options.log, LogLevel::info,
           fmt::format("treeattn: CUDA stage 1 (head_dim 128): {}, code for sm_{} from compute_{}, {} registers, {} bytes "
                       "spilled, {} KiB shared memory, {} CTAs an SM",
                       stage1.wgmma ? "wgmma" : "mma.sync", stage1.binary_arch, stage1.ptx_arch, stage1.registers,
                       stage1.spill_bytes, (stage1.shared_bytes + 1023) / 1024, stage1.ctas_per_sm));
  }
}

CudaBackend::~CudaBackend() {
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

void CudaBackend::put(const Plan& plan, cudaStream_t stream) {
  uploaded_ = 0;  // a failed upload leaves no plan to trust
  workspace_.upload(plan, stream);
  uploaded_ = plan.id;
}

void CudaBackend::upload_if_new(const Plan& plan, cudaStream_t stream) {
  if (plan.id == 0 || plan.id != uploaded_) put(plan, stream);
}

void CudaBackend::settle_device_calls() {
  if (!device_calls_) return;
  TREEATTN_CUDA_CHECK(cudaDeviceSynchronize());
  device_calls_ = false;
}

void CudaBackend::upload(const Plan& plan, void* stream) {
  DeviceScope scope(context_.device());
  const auto s = static_cast<cudaStream_t>(stream);
  // An upload captured into a graph would replay this step's staging forever.
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  TREEATTN_CUDA_CHECK(cudaStreamIsCapturing(s, &capturing));
  if (capturing != cudaStreamCaptureStatusNone) {
    throw Error(ErrorCategory::InvalidArgument,
                "a plan the workspace does not hold cannot be uploaded inside a graph capture: upload(plan) before "
                "capturing");
  }
  put(plan, s);
  device_calls_ = true;
}

void CudaBackend::enqueue(const Plan& plan, const AttentionArgs& device_tensors, void* stream) {
  DeviceScope scope(context_.device());
  if (plan.id == 0 || plan.id != uploaded_) upload(plan, stream);
  workspace_.enqueue(device_tensors, static_cast<cudaStream_t>(stream));
  device_calls_ = true;
}

void CudaBackend::graph_stable(const WorkspaceLimits& limits) {
  DeviceScope scope(context_.device());
  settle_device_calls();
  TREEATTN_CUDA_CHECK(cudaStreamSynchronize(stream_));
  workspace_ = Workspace(context_, limits);
  uploaded_ = 0;
}

AttentionArgs CudaBackend::stage_inputs(const Plan& plan, const AttentionArgs& a) {
  check_args(plan, a);
  check_host_scale_values(a.options);
  settle_device_calls();
  upload_if_new(plan, stream_);
  q_.reserve(std::max<std::size_t>(a.q.bytes(), 16));
  k_.reserve(std::max<std::size_t>(a.k.bytes(), 16));
  v_.reserve(std::max<std::size_t>(a.v.bytes(), 16));
  o_.reserve(std::max<std::size_t>(a.o.bytes(), 16));
  lse_.reserve(std::max<std::size_t>(a.lse.data ? a.lse.bytes() : 0, 16));
  copy_rows(q_.data(), row_bytes(a.q), a.q.data, pitch_bytes(a.q), row_bytes(a.q), rows(a.q), cudaMemcpyHostToDevice,
            stream_);
  copy_rows(k_.data(), row_bytes(a.k), a.k.data, pitch_bytes(a.k), row_bytes(a.k), rows(a.k), cudaMemcpyHostToDevice,
            stream_);
  copy_rows(v_.data(), row_bytes(a.v), a.v.data, pitch_bytes(a.v), row_bytes(a.v), rows(a.v), cudaMemcpyHostToDevice,
            stream_);
  AttentionArgs device = a;  // dense on the device
  device.q.data = q_.data();
  device.q.row_stride = 0;
  device.k.data = k_.data();
  device.k.row_stride = 0;
  device.v.data = v_.data();
  device.v.row_stride = 0;
  device.o.data = o_.data();
  device.o.row_stride = 0;
  device.lse.data = a.lse.data ? lse_.data() : nullptr;
  device.options.sinks = stage_option(sinks_, a.options.sinks, stream_);
  device.options.k_scales = stage_option(k_scales_, a.options.k_scales, stream_);
  device.options.v_scales = stage_option(v_scales_, a.options.v_scales, stream_);
  return device;
}

void CudaBackend::run(const Plan& plan, const AttentionArgs& a) {
  DeviceScope scope(context_.device());
  const AttentionArgs device = stage_inputs(plan, a);
  workspace_.enqueue(device, stream_);
  copy_rows(a.o.data, pitch_bytes(a.o), o_.data(), row_bytes(a.o), row_bytes(a.o), rows(a.o), cudaMemcpyDeviceToHost,
            stream_);
  if (a.lse.data) {
    TREEATTN_CUDA_CHECK(cudaMemcpyAsync(a.lse.data, lse_.data(), a.lse.bytes(), cudaMemcpyDeviceToHost, stream_));
  }
  TREEATTN_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

std::vector<double> CudaBackend::time_uploads(const Plan& plan, int repeats) {
  DeviceScope scope(context_.device());
  Workspace workspace(context_);
  workspace.upload(plan, stream_);  // sized once, as a decode loop's workspace is
  std::vector<double> us;
  for (int r = 0; r < repeats; ++r) {
    // In a decode loop a step's layers run between two uploads, so the copy
    // whose staging buffer an upload refills has long finished (as the Vulkan
    // backend's timing waits for each submission): waited for untimed here.
    TREEATTN_CUDA_CHECK(cudaStreamSynchronize(stream_));
    const auto t0 = std::chrono::steady_clock::now();
    workspace.upload(plan, stream_);
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  TREEATTN_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return us;
}

std::vector<double> CudaBackend::time_layers(const Plan& plan, const AttentionArgs& a, int layers, int repeats) {
  DeviceScope scope(context_.device());
  const AttentionArgs staged = stage_inputs(plan, a);
  // The layers run on the growing workspace staged_inputs uploaded to, or on a
  // graph-stable one of the plan's limits times the headroom.
  std::unique_ptr<Workspace> fixed;
  if (options_.cuda_graph_headroom >= 1.0) {
    fixed = std::make_unique<Workspace>(context_, WorkspaceLimits::of(plan).with_headroom(options_.cuda_graph_headroom));
    fixed->upload(plan, stream_);
  }
  const Workspace& workspace = fixed ? *fixed : workspace_;
  // Each layer reads its own copy of the KV pool, as a model's layers do, so L2
  // carries nothing from one layer to the next; as many pools as fit in 80 % of
  // free memory, the layers cycling over them beyond that.
  std::size_t free_bytes = 0, total_bytes = 0;
  TREEATTN_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  const std::size_t pool_bytes = a.k.bytes() + a.v.bytes();
  const int pools = int(std::clamp<std::size_t>(free_bytes * 8 / 10 / std::max<std::size_t>(pool_bytes, 1), 1, std::size_t(layers)));
  std::vector<DeviceBuffer> kv;
  for (int l = 0; l < pools; ++l) {
    kv.emplace_back(pool_bytes);
    TREEATTN_CUDA_CHECK(cudaMemcpyAsync(kv.back().data(), k_.data(), a.k.bytes(), cudaMemcpyDeviceToDevice, stream_));
    TREEATTN_CUDA_CHECK(cudaMemcpyAsync(kv.back().as<unsigned char>() + a.k.bytes(), v_.data(), a.v.bytes(),
                                        cudaMemcpyDeviceToDevice, stream_));
  }

  // Graph, executable graph and events are released on every path out.
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  struct Release {
    cudaGraph_t& graph;
    cudaGraphExec_t& exec;
    cudaEvent_t& start;
    cudaEvent_t& stop;
    ~Release() {
      if (exec) cudaGraphExecDestroy(exec);
      if (graph) cudaGraphDestroy(graph);
      if (start) cudaEventDestroy(start);
      if (stop) cudaEventDestroy(stop);
    }
  } release{graph, exec, start, stop};
  TREEATTN_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  for (int l = 0; l < layers; ++l) {
    AttentionArgs device = staged;
    device.k.data = kv[std::size_t(l % pools)].data();
    device.v.data = kv[std::size_t(l % pools)].as<unsigned char>() + a.k.bytes();
    device.lse.data = nullptr;
    workspace.enqueue(device, stream_);
  }
  TREEATTN_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
  TREEATTN_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));

  DeviceBuffer flush(std::size_t(256) << 20);  // larger than any L2: evicts the previous replay's data
  TREEATTN_CUDA_CHECK(cudaEventCreate(&start));
  TREEATTN_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<double> us;
  TREEATTN_CUDA_CHECK(cudaGraphLaunch(exec, stream_));  // warm-up
  for (int r = 0; r < repeats; ++r) {
    TREEATTN_CUDA_CHECK(cudaMemsetAsync(flush.data(), r & 0xff, flush.bytes(), stream_));
    TREEATTN_CUDA_CHECK(cudaEventRecord(start, stream_));
    TREEATTN_CUDA_CHECK(cudaGraphLaunch(exec, stream_));
    TREEATTN_CUDA_CHECK(cudaEventRecord(stop, stream_));
    TREEATTN_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0.0f;
    TREEATTN_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    us.push_back(double(ms) * 1e3);
  }
  copy_rows(a.o.data, pitch_bytes(a.o), o_.data(), row_bytes(a.o), row_bytes(a.o), rows(a.o), cudaMemcpyDeviceToHost,
            stream_);
  TREEATTN_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return us;
}

}  // namespace treeattn::cuda
