#include "cuda_backend.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "../../cuda/attn_launch.hpp"

namespace treeattn::cuda {

void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line) {
  throw Error(ErrorCategory::Backend, fmt::format("CUDA: {} failed: {} ({}) at {}:{}", call, cudaGetErrorName(err),
                                                  cudaGetErrorString(err), file, line));
}

int device_count() noexcept {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess ? count : 0;
}

namespace {

// HBM peak from the memory clock and bus width (double data rate).
double device_peak_gbps(int device) {
  int clock_khz = 0, bus_bits = 0;
  if (cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, device) != cudaSuccess) {
    cudaGetLastError();
    return 0.0;
  }
  return 2.0 * double(clock_khz) * 1e3 * double(bus_bits) / 8.0 / 1e9;
}

OutType out_type(DType dtype) {
  switch (dtype) {
    case DType::f16: return OutType::f16;
    case DType::bf16: return OutType::bf16;
    case DType::f32: return OutType::f32;
  }
  return OutType::f32;
}

void check_supported(const Plan& plan, const AttentionArgs& args) {
  check_args(plan, args);
  if (args.q.dtype == DType::f32) {
    throw Error(ErrorCategory::InvalidArgument, "CUDA backend: Q, K and V must be f16 or bf16 (got f32)");
  }
}

}  // namespace

CudaBackend::CudaBackend(const BackendOptions& options) {
  const int count = device_count();
  if (count == 0) {
    int runtime = 0, driver = 0;
    cudaRuntimeGetVersion(&runtime);
    cudaDriverGetVersion(&driver);
    cudaGetLastError();
    throw Error(ErrorCategory::Backend,
                fmt::format("no CUDA device (runtime {}, driver {}): use --backend cpu", runtime, driver));
  }
  TREEATTN_CUDA_CHECK(cudaSetDevice(0));
  TREEATTN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  peak_gbps_ = device_peak_gbps(0);
  int sms = 0;
  TREEATTN_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  sms_ = double(sms);
  const Stage1Occupancy stage1 = stage1_occupancy(128);
  slots_ = double(sms) * double(stage1.ctas_per_sm);
  if (options.verbose) {
    cudaDeviceProp prop{};
    TREEATTN_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    std::fprintf(stderr, "treeattn: CUDA device 0: %s (sm_%d%d, %d SMs, %.0f GB/s)\n", prop.name, prop.major,
                 prop.minor, sms, peak_gbps_);
    std::fprintf(stderr,
                 "treeattn: CUDA stage 1 (head_dim 128): %s, code for sm_%d from compute_%d, %d registers, %d bytes "
                 "spilled, %d KiB shared memory, %d CTAs an SM\n",
                 stage1.wgmma ? "wgmma" : "mma.sync", stage1.binary_arch, stage1.ptx_arch, stage1.registers,
                 stage1.spill_bytes, (stage1.shared_bytes + 1023) / 1024, stage1.ctas_per_sm);
  }
}

CostModel CudaBackend::cost_model() const {
  CostModel model = cost_model_for("h100");  // fitted on the H100 (docs/greedy.md); other GPUs scale by their slots
  if (slots_ > 0.0) {
    model.slots = slots_;
    model.sms = sms_;
  }
  return model;
}

CudaBackend::~CudaBackend() {
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

void CudaBackend::enqueue(const DevicePlan& plan, const AttentionArgs& a, cudaStream_t stream) {
  KernelParams p = plan.params();
  p.q = a.q.data;
  p.k = a.k.data;
  p.v = a.v.data;
  p.o = a.o.data;
  p.lse = static_cast<float*>(a.lse.data);
  p.out_type = out_type(a.o.dtype);
  TREEATTN_CUDA_CHECK(launch_tree_attention(p, plan.head_dim(), a.q.dtype == DType::bf16, stream));
}

void CudaBackend::stage_inputs(const Plan& plan, const AttentionArgs& a) {
  plan_.upload(plan, stream_);
  q_.reserve(a.q.bytes());
  k_.reserve(a.k.bytes());
  v_.reserve(a.v.bytes());
  o_.reserve(std::max<std::size_t>(a.o.bytes(), 16));
  lse_.reserve(std::max<std::size_t>(a.lse.data ? a.lse.bytes() : 0, 16));
  TREEATTN_CUDA_CHECK(cudaMemcpyAsync(q_.data(), a.q.data, a.q.bytes(), cudaMemcpyHostToDevice, stream_));
  TREEATTN_CUDA_CHECK(cudaMemcpyAsync(k_.data(), a.k.data, a.k.bytes(), cudaMemcpyHostToDevice, stream_));
  TREEATTN_CUDA_CHECK(cudaMemcpyAsync(v_.data(), a.v.data, a.v.bytes(), cudaMemcpyHostToDevice, stream_));
}

void CudaBackend::run(const Plan& plan, const AttentionArgs& a) {
  check_supported(plan, a);
  stage_inputs(plan, a);
  AttentionArgs device = a;
  device.q.data = q_.data();
  device.k.data = k_.data();
  device.v.data = v_.data();
  device.o.data = o_.data();
  device.lse.data = a.lse.data ? lse_.data() : nullptr;
  enqueue(plan_, device, stream_);
  TREEATTN_CUDA_CHECK(cudaMemcpyAsync(a.o.data, o_.data(), a.o.bytes(), cudaMemcpyDeviceToHost, stream_));
  if (a.lse.data) {
    TREEATTN_CUDA_CHECK(cudaMemcpyAsync(a.lse.data, lse_.data(), a.lse.bytes(), cudaMemcpyDeviceToHost, stream_));
  }
  TREEATTN_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

std::vector<double> CudaBackend::time_layers(const Plan& plan, const AttentionArgs& a, int layers, int repeats) {
  check_supported(plan, a);
  stage_inputs(plan, a);
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
    AttentionArgs device = a;
    device.q.data = q_.data();
    device.k.data = kv[std::size_t(l % pools)].data();
    device.v.data = kv[std::size_t(l % pools)].as<unsigned char>() + a.k.bytes();
    device.o.data = o_.data();
    device.lse.data = nullptr;
    enqueue(plan_, device, stream_);
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
  TREEATTN_CUDA_CHECK(cudaMemcpyAsync(a.o.data, o_.data(), a.o.bytes(), cudaMemcpyDeviceToHost, stream_));
  TREEATTN_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return us;
}

}  // namespace treeattn::cuda
