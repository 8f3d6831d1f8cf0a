// Device faults: the Nth device allocation, pinned host allocation or driver
// call of a decode step fails (fault_injection.hpp), for every N until the
// step makes no more. The one C call it reaches fails with the fault's status
// (TREEATTN_ERROR_OUT_OF_MEMORY for an allocation, TREEATTN_ERROR_BACKEND for
// any other driver call) and a message, every other call succeeds; made again
// at once, the failed call succeeds, and the step's outputs are the fault-free
// step's bitwise; then a fresh plan's step on the same context is too. Leaks:
// the validation layer (TREEATTN_VK_VALIDATION=1) reports the Vulkan objects a
// device still holds when it is destroyed, which fails the program;
// compute-sanitizer --leak-check full reports CUDA's.
//
// Two sweeps a way of running and site: a context made under faults and its
// first step (the device, the pipelines, the first buffers), and later steps
// on one context (buffers grown and reused, the plan each workspace holds).
// The ways: host arrays; on CUDA also the device path on the test's stream; on
// Vulkan also an application's device, its command buffers recorded by the
// test. Two findings the step cannot reach (commands of an earlier step still
// in flight) have cases of their own at the end.

#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "backend.hpp"
#include "fault_injection.hpp"
#include "support/c_tensor.hpp"
#include "support/harness_options.hpp"
#include "treeattn/error.hpp"
#include "treeattn/planner.hpp"
#include "treeattn/treeattn.h"

#ifdef TREEATTN_TEST_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "treeattn/cuda.hpp"
#endif
#ifdef TREEATTN_TEST_HAVE_VULKAN
#include "backends/vulkan/context_options.hpp"
#include "backends/vulkan/vk_sequence.hpp"
#include "backends/vulkan/workspace_state.hpp"
#include "support/app_vulkan_device.hpp"
#endif

namespace {

namespace faults = treeattn::fault_injection;
using treeattn::test::c_tensor;

constexpr int kHq = 4, kHkv = 2, kD = 64, kSlots = 512, kQueries = 3;

struct Site {
  faults::Site site;
  const char* name;
  treeattn_status status;  // what a call failing there returns
};
constexpr Site kSites[] = {
    {faults::device_allocation, "device allocation", TREEATTN_ERROR_OUT_OF_MEMORY},
    {faults::pinned_allocation, "pinned host allocation", TREEATTN_ERROR_OUT_OF_MEMORY},
    {faults::driver_call, "driver call", TREEATTN_ERROR_BACKEND},
};

// The step's inputs, and its outputs on the host.
struct Arrays {
  std::vector<std::uint16_t> q = std::vector<std::uint16_t>(kQueries * kHq * kD), k, v;
  std::vector<float> o = std::vector<float>(kQueries * kHq * kD), lse = std::vector<float>(kQueries * kHq);
  Arrays() : k(std::size_t(kSlots) * kHkv * kD), v(std::size_t(kSlots) * kHkv * kD) {
    for (std::size_t i = 0; i < q.size(); ++i) q[i] = std::uint16_t(0x3000 + (i * 37) % 1024);  // f16 in [0.125, 0.25)
    for (std::size_t i = 0; i < k.size(); ++i) k[i] = std::uint16_t(0x3400 + (i * 53) % 1024);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = std::uint16_t(0x3800 + (i * 71) % 1024);
  }
};


// Each call either succeeds or fails as the armed site's failures do, with a
// message; a failed call is made again at once, with nothing armed, and must
// then succeed: the library recovers in place (a plan it failed to upload is
// uploaded again, buffers it failed to allocate are allocated), so the step
// goes on and its outputs must still be the reference's.
class Calls {
 public:
  explicit Calls(treeattn_status failure) : failure_(failure) {}
  template <typename Call>
  void operator()(Call&& call) {
    const treeattn_status s = call();
    if (s == TREEATTN_OK) return;
    ++failures_;
    const std::string message = treeattn_last_error();
    CHECK_MESSAGE(s == failure_, "status ", int(s), " (expected ", int(failure_), "): ", message);
    CHECK_MESSAGE(!message.empty(), "status ", int(s), " without a message");
    faults::disarm();
    const treeattn_status again = call();
    REQUIRE_MESSAGE(again == TREEATTN_OK, "made again: status ", int(again), ": ", std::string(treeattn_last_error()));
  }
  int failures() const { return failures_; }

 private:
  treeattn_status failure_;
  int failures_ = 0;
};

// One way of running a step's plan: its outputs appended to `out`.
using RunPlan = std::function<void(treeattn_context*, const treeattn_plan*, Calls&, std::vector<float>& out)>;

// On host arrays.
RunPlan on_host(Arrays& a) {
  return [&a](treeattn_context* context, const treeattn_plan* plan, Calls& call, std::vector<float>& out) {
    const treeattn_tensor q = c_tensor(a.q.data(), TREEATTN_DTYPE_F16, 3, kQueries, kHq, kD);
    const treeattn_tensor k = c_tensor(a.k.data(), TREEATTN_DTYPE_F16, 3, kSlots, kHkv, kD);
    const treeattn_tensor v = c_tensor(a.v.data(), TREEATTN_DTYPE_F16, 3, kSlots, kHkv, kD);
    const treeattn_tensor o = c_tensor(a.o.data(), TREEATTN_DTYPE_F32, 3, kQueries, kHq, kD);
    const treeattn_tensor lse = c_tensor(a.lse.data(), TREEATTN_DTYPE_F32, 2, kQueries, kHq);
    call([&] { return treeattn_run(context, plan, &q, &k, &v, &o, &lse); });
    out.insert(out.end(), a.o.begin(), a.o.end());
    out.insert(out.end(), a.lse.begin(), a.lse.end());
  };
}

// The step's tensors given by `data` pointers (device memory: CUDA pointers,
// Vulkan buffer addresses).
struct StepTensors {
  treeattn_tensor q, k, v, o, lse;
  StepTensors(void* q_data, void* k_data, void* v_data, void* o_data, void* lse_data)
      : q(c_tensor(q_data, TREEATTN_DTYPE_F16, 3, kQueries, kHq, kD)),
        k(c_tensor(k_data, TREEATTN_DTYPE_F16, 3, kSlots, kHkv, kD)),
        v(c_tensor(v_data, TREEATTN_DTYPE_F16, 3, kSlots, kHkv, kD)),
        o(c_tensor(o_data, TREEATTN_DTYPE_F32, 3, kQueries, kHq, kD)),
        lse(c_tensor(lse_data, TREEATTN_DTYPE_F32, 2, kQueries, kHq)) {}
};

#ifdef TREEATTN_TEST_HAVE_CUDA
// The CUDA device path's tensors and stream, the test's own (its allocations
// are no library call, so no fault reaches them).
struct DeviceArrays {
  void *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr, *lse = nullptr;
  cudaStream_t stream = nullptr;
  explicit DeviceArrays(const Arrays& a) {
    REQUIRE(cudaMalloc(&q, a.q.size() * 2) == cudaSuccess);
    REQUIRE(cudaMalloc(&k, a.k.size() * 2) == cudaSuccess);
    REQUIRE(cudaMalloc(&v, a.v.size() * 2) == cudaSuccess);
    REQUIRE(cudaMalloc(&o, a.o.size() * 4) == cudaSuccess);
    REQUIRE(cudaMalloc(&lse, a.lse.size() * 4) == cudaSuccess);
    REQUIRE(cudaMemcpy(q, a.q.data(), a.q.size() * 2, cudaMemcpyHostToDevice) == cudaSuccess);
    REQUIRE(cudaMemcpy(k, a.k.data(), a.k.size() * 2, cudaMemcpyHostToDevice) == cudaSuccess);
    REQUIRE(cudaMemcpy(v, a.v.data(), a.v.size() * 2, cudaMemcpyHostToDevice) == cudaSuccess);
    REQUIRE(cudaStreamCreate(&stream) == cudaSuccess);
  }
  ~DeviceArrays() {
    for (void* p : {q, k, v, o, lse}) cudaFree(p);
    cudaStreamDestroy(stream);
  }
  DeviceArrays(const DeviceArrays&) = delete;
  DeviceArrays& operator=(const DeviceArrays&) = delete;

  // treeattn_enqueue on device memory on the test's stream.
  RunPlan enqueue() {
    return [this](treeattn_context* context, const treeattn_plan* plan, Calls& call, std::vector<float>& out) {
      const StepTensors t(q, k, v, o, lse);
      const std::size_t o_floats = kQueries * kHq * kD, lse_floats = kQueries * kHq;
      REQUIRE(cudaMemsetAsync(o, 0xff, o_floats * 4, stream) == cudaSuccess);  // NaN: nothing left over
      call([&] { return treeattn_enqueue(context, plan, &t.q, &t.k, &t.v, &t.o, &t.lse, stream); });
      REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
      out.resize(out.size() + o_floats + lse_floats);
      float* at = out.data() + out.size() - o_floats - lse_floats;
      REQUIRE(cudaMemcpy(at, o, o_floats * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
      REQUIRE(cudaMemcpy(at + o_floats, lse, lse_floats * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
    };
  }
};
#endif

#ifdef TREEATTN_TEST_HAVE_VULKAN
// An application's Vulkan device, which a device treeattn opened stands in
// for: the step's tensors in its buffers (filled once, with nothing armed),
// and its command buffer, recorded and submitted with Vulkan's own calls, so
// that no fault reaches the test's side.
struct AppVulkan {
  using Kind = treeattn::vulkan::Buffer::Kind;
  const treeattn::vulkan::Context own{treeattn::vulkan::context_options(treeattn::test::harness_options())};
  const treeattn::vulkan::Device& device = *treeattn::vulkan::state_of(own).device;
  const treeattn::test::AppDevice app{own};
  treeattn::vulkan::Buffer q, k, v, o, lse, staging;
  treeattn::vulkan::CommandSequence commands{device};
  VkFence fence = VK_NULL_HANDLE;

  explicit AppVulkan(const Arrays& a)
      : q(device, a.q.size() * 2, Kind::device_local), k(device, a.k.size() * 2, Kind::device_local),
        v(device, a.v.size() * 2, Kind::device_local), o(device, a.o.size() * 4, Kind::device_local),
        lse(device, a.lse.size() * 4, Kind::device_local), staging(device, a.k.size() * 2, Kind::staging) {
    for (const auto& [to, from] : {std::pair{&q, &a.q}, std::pair{&k, &a.k}, std::pair{&v, &a.v}}) {
      std::memcpy(staging.mapped(), from->data(), from->size() * 2);
      commands.begin();
      commands.copy(staging, *to, from->size() * 2);
      commands.end();
      commands.submit_and_wait();
    }
    VkFenceCreateInfo info{VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    REQUIRE(vkCreateFence(device.handle(), &info, nullptr, &fence) == VK_SUCCESS);
  }
  ~AppVulkan() { vkDestroyFence(device.handle(), fence, nullptr); }
  AppVulkan(const AppVulkan&) = delete;
  AppVulkan& operator=(const AppVulkan&) = delete;

  treeattn_status create(const treeattn_context_options& options, treeattn_context** out) const {
    return treeattn_context_create_vulkan(&app.app, &options, out);
  }

  // treeattn_enqueue recorded into the application's command buffer between
  // its own commands: O filled with NaN first, O and LSE read back after.
  RunPlan enqueue() {
    return [this](treeattn_context* context, const treeattn_plan* plan, Calls& call, std::vector<float>& out) {
      const auto address = [](const treeattn::vulkan::Buffer& b) {
        return reinterpret_cast<void*>(static_cast<std::uintptr_t>(b.address()));
      };
      const StepTensors t(address(q), address(k), address(v), address(o), address(lse));
      const VkCommandBuffer cb = commands.handle();
      const VkCommandBufferBeginInfo begin{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
      REQUIRE(vkResetCommandBuffer(cb, 0) == VK_SUCCESS);
      REQUIRE(vkBeginCommandBuffer(cb, &begin) == VK_SUCCESS);
      vkCmdFillBuffer(cb, o.handle(), 0, VK_WHOLE_SIZE, 0xffffffffu);
      treeattn::vulkan::record_transfer_to_compute_barrier(cb);
      call([&] { return treeattn_enqueue(context, plan, &t.q, &t.k, &t.v, &t.o, &t.lse, cb); });
      VkMemoryBarrier written{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
      written.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT;
      written.dstAccessMask = VK_ACCESS_TRANSFER_READ_BIT;
      vkCmdPipelineBarrier(cb, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_PIPELINE_STAGE_TRANSFER_BIT, 0, 1, &written, 0,
                           nullptr, 0, nullptr);
      const VkBufferCopy o_region{0, 0, o.bytes()}, lse_region{0, o.bytes(), lse.bytes()};
      vkCmdCopyBuffer(cb, o.handle(), staging.handle(), 1, &o_region);
      vkCmdCopyBuffer(cb, lse.handle(), staging.handle(), 1, &lse_region);
      REQUIRE(vkEndCommandBuffer(cb) == VK_SUCCESS);
      VkSubmitInfo submit{VK_STRUCTURE_TYPE_SUBMIT_INFO};
      submit.commandBufferCount = 1;
      submit.pCommandBuffers = &cb;
      REQUIRE(vkQueueSubmit(device.queue(), 1, &submit, fence) == VK_SUCCESS);
      REQUIRE(vkWaitForFences(device.handle(), 1, &fence, VK_TRUE, UINT64_MAX) == VK_SUCCESS);
      REQUIRE(vkResetFences(device.handle(), 1, &fence) == VK_SUCCESS);
      const auto* host = static_cast<const float*>(staging.mapped());
      out.insert(out.end(), host, host + (o.bytes() + lse.bytes()) / 4);
    };
  }
};
#endif

// A decode step through the C API: a planner from a small tree and its update,
// its plan run each way of `runs`, the step's changes, the update and the runs
// again; on CUDA the first plan is also uploaded explicitly. Appends the
// outputs to `out`.
void decode_step(treeattn_context* context, const std::vector<RunPlan>& runs, void* stream, Calls& call,
                 std::vector<float>& out) {
  treeattn_tree* tree = nullptr;
  treeattn_planner* planner = nullptr;
  const treeattn_plan* plan = nullptr;
  call([&] { return treeattn_tree_create(kHq, kHkv, kD, 0.0f, &tree); });
  call([&] { return treeattn_tree_add_node_range(tree, 0, -1, 0, 200); });
  call([&] { return treeattn_tree_add_node_range(tree, 1, 0, 200, 20); });
  call([&] { return treeattn_tree_add_query(tree, 1, -1); });
  call([&] { return treeattn_tree_add_query(tree, 0, 100); });
  call([&] { return treeattn_tree_add_query(tree, 1, 5); });
  call([&] { return treeattn_planner_create(context, tree, nullptr, &planner); });
  call([&] { return treeattn_planner_update(planner, &plan); });
  if (std::string(treeattn_context_backend(context)) == "cuda") {
    call([&] { return treeattn_upload(context, plan, stream); });
  }
  for (const RunPlan& run : runs) run(context, plan, call, out);
  call([&] { return treeattn_planner_append_range(planner, 1, 220, 1); });
  call([&] { return treeattn_planner_add_node_range(planner, 2, 0, 300, 150); });
  const std::int64_t nodes[] = {1, 2, 2}, upto[] = {-1, -1, 10};
  call([&] { return treeattn_planner_set_queries(planner, nodes, upto, kQueries); });
  call([&] { return treeattn_planner_update(planner, &plan); });
  for (const RunPlan& run : runs) run(context, plan, call, out);
  treeattn_planner_destroy(planner);
  treeattn_tree_destroy(tree);
}

treeattn_context_options context_options(treeattn_backend backend) {
  treeattn_context_options options;
  treeattn_context_options_init(&options);
  options.backend = backend;
  options.vulkan_variant = "scalar";  // what lavapipe runs; one variant everywhere keeps the sweep short
  return options;
}

// Makes a context with context_options() (of the backend its maker knows).
using MakeContext = std::function<treeattn_status(const treeattn_context_options&, treeattn_context**)>;

// treeattn's own device.
treeattn_status create_own(const treeattn_context_options& options, treeattn_context** out) {
  return treeattn_context_create(&options, out);
}

treeattn_context* create_context(const MakeContext& make, treeattn_backend backend, Calls& call) {
  const treeattn_context_options options = context_options(backend);
  treeattn_context* context = nullptr;
  call([&] {
    const treeattn_status s = make(options, &context);
    if (s != TREEATTN_OK) CHECK(context == nullptr);
    return s;
  });
  return context;
}

// Runs `attempt` with the Nth call at `site` failing, for N = 0, 1, ... until
// an attempt makes fewer calls there. Every injected fault must have failed
// one call (and no call may fail otherwise). Returns the faults injected.
template <typename Attempt>
int sweep(const Site& site, Attempt&& attempt) {
  int injected = 0;
  for (long n = 0;; ++n) {
    faults::arm(site.site, n);
    Calls call(site.status);
    attempt(call);
    faults::disarm();
    const bool fired = faults::fired();
    CHECK_MESSAGE(call.failures() == (fired ? 1 : 0), std::string(site.name), " ", n, ": ", call.failures(),
                  " calls failed, ", std::string(fired ? "a fault" : "no fault"), " injected");
    if (!fired) break;
    ++injected;
    REQUIRE(n < 10000);
  }
  return injected;
}

// Both sweeps at every site for contexts `make` creates, each step running
// its plans the ways of `runs` (`stream`: the CUDA stream of an upload).
void sweep_path(const char* name, const MakeContext& make, treeattn_backend backend, const std::vector<RunPlan>& runs,
                void* stream = nullptr) {
  Calls no_faults(TREEATTN_OK);
  treeattn_context* context = create_context(make, backend, no_faults);
  std::vector<float> reference;
  decode_step(context, runs, stream, no_faults, reference);

  // A step under faults on `on`, its outputs the reference's; then, with
  // nothing armed, a fresh plan's step on the same context, bitwise too.
  const auto step_and_again = [&](treeattn_context* on, Calls& call) {
    std::vector<float> out, again;
    decode_step(on, runs, stream, call, out);
    faults::disarm();
    CHECK(out == reference);
    decode_step(on, runs, stream, no_faults, again);
    CHECK(again == reference);
  };
  for (const Site& site : kSites) {
    // A context made under faults and its first step.
    const int created = sweep(site, [&](Calls& call) {
      treeattn_context* fresh = create_context(make, backend, call);
      step_and_again(fresh, call);
      treeattn_context_destroy(fresh);
    });
    // A later step on the context that made the reference.
    const int stepped = sweep(site, [&](Calls& call) { step_and_again(context, call); });
    std::printf("test_device_faults: %s: %s: %d faults creating a context and its first step, %d in a later step, "
                "each survived\n", name, site.name, created, stepped);
    // A step on the device makes driver calls; allocations too, but where it has none of a kind.
    if (site.site == faults::driver_call) CHECK(created + stepped > 10);
  }
  CHECK(no_faults.failures() == 0);
  treeattn_context_destroy(context);
}

bool g_cuda = false, g_vulkan = false;  // the devices found

}  // namespace

TEST_CASE("cuda: every device allocation and driver call of a decode step may fail") {
#ifdef TREEATTN_TEST_HAVE_CUDA
  if (!g_cuda) return;
  Arrays a;
  DeviceArrays device(a);
  sweep_path("cuda", create_own, TREEATTN_BACKEND_CUDA, {on_host(a), device.enqueue()}, device.stream);
#endif
}

TEST_CASE("vulkan: every device allocation and driver call of a decode step may fail") {
  if (!g_vulkan) return;
  Arrays a;
  sweep_path("vulkan", create_own, TREEATTN_BACKEND_VULKAN, {on_host(a)});
}

#ifdef TREEATTN_TEST_HAVE_VULKAN
TEST_CASE("vulkan: every device allocation and driver call of a decode step on an application's device may fail") {
  if (!g_vulkan) return;
  Arrays a;
  AppVulkan app(a);
  const MakeContext make = [&](const treeattn_context_options& options, treeattn_context** out) {
    return app.create(options, out);
  };
  sweep_path("vulkan, an application's device", make, TREEATTN_BACKEND_VULKAN, {app.enqueue()});
}
#endif

// A plan of the step's heads and three queries on a node of `tokens` tokens
// (at least 100) and its child of 20.
treeattn::Plan plan_of(std::int64_t tokens, const treeattn::CostModel& cost) {
  treeattn::Tree tree({kHq, kHkv, kD, 0.0f});
  tree.add_node_range(0, treeattn::kNoParent, 0, tokens);
  tree.add_node_range(1, 0, tokens, 20);
  tree.add_query(1);
  tree.add_query(0, 100);
  tree.add_query(1, 5);
  treeattn::PlanOptions options;
  options.cost = cost;
  options.block_tokens = 64;  // many work items (and partials) on a long node
  return treeattn::plan(tree, options);
}

#ifdef TREEATTN_TEST_HAVE_CUDA
// A graph-stable workspace's grid reaches the pass records past a smaller
// plan's, which its upload empties; a failed upload must not count them empty.
TEST_CASE("cuda: a graph-stable workspace's upload that failed leaves no pass record of the plan before") {
  if (!g_cuda) return;
  using namespace treeattn;
  const cuda::Context context(0);
  const Plan big = plan_of(kSlots - 20, context.cost_model()), small = plan_of(200, context.cost_model());
  cuda::WorkspaceLimits limits = cuda::WorkspaceLimits::of(big);
  limits.include(cuda::WorkspaceLimits::of(small));
  Arrays a;
  DeviceArrays device(a);
  const auto tensor = [](void* data, DType dtype, std::vector<std::int64_t> shape) { return TensorRef{data, dtype, shape}; };
  const AttentionArgs args{tensor(device.q, DType::f16, {kQueries, kHq, kD}), tensor(device.k, DType::f16, {kSlots, kHkv, kD}),
                           tensor(device.v, DType::f16, {kSlots, kHkv, kD}), tensor(device.o, DType::f32, {kQueries, kHq, kD}),
                           tensor(device.lse, DType::f32, {kQueries, kHq})};
  const auto output = [&] {
    std::vector<float> o(a.o.size());
    REQUIRE(cudaStreamSynchronize(device.stream) == cudaSuccess);
    REQUIRE(cudaMemcpy(o.data(), device.o, o.size() * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
    return o;
  };
  std::vector<float> reference;
  {
    cuda::Workspace fresh(context, limits);
    fresh.upload(small, device.stream);
    fresh.enqueue(args, device.stream);
    reference = output();
  }
  cuda::Workspace workspace(context, limits);
  int injected = 0;
  for (long n = 0;; ++n) {
    workspace.upload(big, device.stream);
    workspace.enqueue(args, device.stream);
    faults::arm(faults::driver_call, n);
    try {
      workspace.upload(small, device.stream);
    } catch (const Error& e) {
      CHECK(e.category() == ErrorCategory::Backend);
      CHECK_THROWS_AS(workspace.enqueue(args, device.stream), Error);  // no plan to run until an upload succeeds
      workspace.upload(small, device.stream);
    }
    faults::disarm();
    workspace.enqueue(args, device.stream);
    CHECK(output() == reference);
    if (!faults::fired()) break;
    ++injected;
  }
  std::printf("test_device_faults: cuda: graph-stable upload: %d faults, each survived\n", injected);
  CHECK(injected >= 2);  // the upload kernel's launch and its event
}
#endif

#ifdef TREEATTN_TEST_HAVE_VULKAN
// Commands recorded before an upload may still read the plan and partial
// buffers it replaces: one that fails allocating must leave them in place.
TEST_CASE("vulkan: a workspace's upload that failed leaves no plan to record and the buffers earlier commands read") {
  if (!g_vulkan) return;
  using namespace treeattn;
  const vulkan::Context context(vulkan::context_options(test::harness_options()));
  const vulkan::Device& device = *vulkan::state_of(context).device;
  const Plan small = plan_of(100, context.cost_model()), big = plan_of(kSlots - 20, context.cost_model());
  vulkan::Workspace workspace(context, DType::f16);
  vulkan::Workspace::State& state = vulkan::state_of(workspace);
  vulkan::CommandSequence commands(device);
  commands.begin();
  workspace.upload(small, commands.handle());
  commands.end();
  commands.submit_and_wait();
  const VkBuffer plan_buffer = state.plan.handle(), partials = state.partials.handle();
  REQUIRE(big.num_partials > small.num_partials);

  commands.begin();
  faults::arm(faults::device_allocation, 1);  // the plan buffer grows; the partials' allocation fails
  try {
    workspace.upload(big, commands.handle());
    FAIL("the upload made fewer than two device allocations");
  } catch (const Error& e) {
    CHECK(e.category() == ErrorCategory::OutOfMemory);
  }
  faults::disarm();
  CHECK(faults::fired());
  CHECK(state.plan.handle() == plan_buffer);
  CHECK(state.partials.handle() == partials);
  CHECK_THROWS_WITH_AS(state.record_addresses(commands.handle(), AttentionArgs{}),
                       "record before any plan was uploaded to the workspace", Error);
  workspace.upload(big, commands.handle());
  CHECK(state.plan.handle() != plan_buffer);
  commands.end();
  commands.submit_and_wait();
}
#endif

int main(int argc, char** argv) {
  treeattn::BackendOptions options = treeattn::test::harness_options();
  try {
    // The process's first Vulkan call: the validation layer from here on where asked for.
    for (const treeattn::VulkanDeviceReport& d : treeattn::vulkan_devices(options)) {
      g_vulkan = g_vulkan || (d.selected && d.variant_f16.rfind("none", 0) != 0);
    }
  } catch (const treeattn::Error& e) {
    std::printf("test_device_faults: no Vulkan: %s\n", e.what());
  }
  const std::vector<treeattn::CudaDeviceReport> cuda = treeattn::cuda_devices(options);
  g_cuda = !cuda.empty() && cuda.front().error.empty();
  if (!g_cuda && !g_vulkan) {
    std::printf("test_device_faults: neither a CUDA nor a Vulkan device that runs treeattn: skipping\n");
    return 77;
  }
  std::printf("test_device_faults: CUDA %s, Vulkan %s\n", g_cuda ? "yes" : "no", g_vulkan ? "yes" : "no");
  doctest::Context context(argc, argv);
  int status = context.run();
#ifdef TREEATTN_TEST_HAVE_VULKAN
  if (const int messages = treeattn::vulkan::Instance::validation_messages(); messages > 0) {
    std::printf("test_device_faults: the validation layer reported %d message(s) (above): failing\n", messages);
    status = 1;
  }
#endif
  return status;
}
