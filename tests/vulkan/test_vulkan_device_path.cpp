// The public Vulkan device path (treeattn/vulkan.hpp) beyond what the
// vulkan_embed example proves end to end: the features an application enabled
// are the ones used, a device without what the shaders need is refused by
// name, a workspace's errors name the tensor, and the C API records into an
// application's command buffer, its planner's plans included.

#include <doctest/doctest.h>

#include "../backends/vulkan/context_state.hpp"
#include "../backends/vulkan/vk_buffer.hpp"
#include "../backends/vulkan/vk_sequence.hpp"
#include "../backends/vulkan/vulkan_backend.hpp"
#include <cstring>

#include "support/app_vulkan_device.hpp"
#include "support/c_replay.hpp"
#include "support/c_tensor.hpp"
#include "support/conformance.hpp"
#include "support/harness_options.hpp"
#include "support/oracle.hpp"
#include "treeattn/error.hpp"
#include "treeattn/treeattn_vulkan.h"
#include "treeattn/vulkan.hpp"

using namespace treeattn;
using treeattn::test::harness_options;

namespace {

// A device as a coopmat-capable GPU reports it.
vulkan::DeviceCaps full_caps() {
  vulkan::DeviceCaps c;
  c.api_version = VK_API_VERSION_1_3;
  c.buffer_device_address = c.shader_int64 = c.storage_16bit = c.shader_float16 = true;
  c.vulkan_memory_model = c.memory_model_device_scope = c.subgroup_size_control = c.compute_full_subgroups = true;
  c.maintenance4 = c.coopmat = c.bfloat16_coopmat = c.subgroup_shuffle = c.subgroup_vote = true;
  c.min_subgroup_size = 8;
  c.max_subgroup_size = 32;
  c.shared_memory_bytes = 49152;
  c.coopmat_shapes = {{16, 16, 16, VK_COMPONENT_TYPE_FLOAT16_KHR, VK_COMPONENT_TYPE_FLOAT32_KHR}};
  return c;
}

// Host arrays copied into device-local buffers of `device` by one staging
// buffer: record() records the copies, address(i) is array i's for the C API.
struct DeviceArrays {
  DeviceArrays(const vulkan::Device& device, const std::vector<const HostArray*>& arrays) {
    std::size_t total = 0;
    for (const HostArray* a : arrays) total += a->bytes.size();
    staging = vulkan::Buffer(device, total, vulkan::Buffer::Kind::staging);
    auto* host = static_cast<unsigned char*>(staging.mapped());
    for (const HostArray* a : arrays) {
      buffers.emplace_back(device, a->bytes.size(), vulkan::Buffer::Kind::device_local);
      std::memcpy(host + used, a->bytes.data(), a->bytes.size());
      offsets.push_back(used);
      used += a->bytes.size();
    }
  }
  void record(vulkan::CommandSequence& sequence) {
    for (std::size_t i = 0; i < buffers.size(); ++i) sequence.copy(staging, buffers[i], buffers[i].bytes(), offsets[i]);
  }
  void* address(std::size_t i) const { return reinterpret_cast<void*>(static_cast<std::uintptr_t>(buffers[i].address())); }

  vulkan::Buffer staging;
  std::vector<vulkan::Buffer> buffers;
  std::vector<std::size_t> offsets;
  std::size_t used = 0;
};

}  // namespace

TEST_CASE("an application's device: only the features it enabled count, from core or extension structs") {
  const vulkan::DeviceCaps caps = full_caps();
  REQUIRE(caps.coopmat_unsupported(false).empty());

  // Nothing enabled: not even the scalar shaders, and the message names the first missing feature.
  const vulkan::DeviceCaps none = vulkan::enabled_caps(caps, nullptr, nullptr, 0);
  CHECK(none.scalar_unsupported() == "needs the bufferDeviceAddress feature");

  // What treeattn asks for, as its own device enables it: everything, coopmat included.
  const vulkan::FeatureChain chain(caps);
  std::vector<const char*> extensions = chain.extensions;
  const vulkan::DeviceCaps all = vulkan::enabled_caps(caps, &chain.features, extensions.data(), std::uint32_t(extensions.size()));
  CHECK(all.scalar_unsupported().empty());
  CHECK(all.coopmat_unsupported(false).empty());

  // The coopmat feature without its extension's name: the scalar shaders only, saying why.
  const vulkan::DeviceCaps no_extension = vulkan::enabled_caps(caps, &chain.features, nullptr, 0);
  CHECK(no_extension.scalar_unsupported().empty());
  CHECK(no_extension.coopmat_unsupported(false) == "no VK_KHR_cooperative_matrix");
  CHECK(vulkan::choose_variant(no_extension, "auto", DType::f16, true, 128, 128) == vulkan::Variant::scalar);

  // The Vulkan 1.1/1.2 features given as their extension structs count the same.
  VkPhysicalDeviceFeatures2 core{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2};
  VkPhysicalDeviceBufferDeviceAddressFeatures bda{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_BUFFER_DEVICE_ADDRESS_FEATURES};
  VkPhysicalDevice16BitStorageFeatures storage{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES};
  core.features.shaderInt64 = VK_TRUE;
  bda.bufferDeviceAddress = VK_TRUE;
  storage.storageBuffer16BitAccess = VK_TRUE;
  core.pNext = &bda;
  bda.pNext = &storage;
  const vulkan::DeviceCaps separate = vulkan::enabled_caps(caps, &core, nullptr, 0);
  CHECK(separate.scalar_unsupported().empty());
  CHECK(separate.storage_16bit);
  CHECK_FALSE(separate.shader_float16);
  CHECK(separate.coopmat_unsupported(false) == "no VK_KHR_cooperative_matrix");
}

TEST_CASE("a Context on an application's device without bufferDeviceAddress is refused by name") {
  const std::shared_ptr<vulkan::Instance> instance = vulkan::Instance::get();
  const std::vector<vulkan::DeviceCaps> devices = vulkan::probe_devices(*instance);
  const vulkan::DeviceCaps& caps = vulkan::select_device(devices, harness_options().vk_device);
  vulkan::FeatureChain chain(caps);
  chain.v12.bufferDeviceAddress = VK_FALSE;  // what the application forgot
  const float priority = 1.0f;
  VkDeviceQueueCreateInfo queue_info{VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO};
  queue_info.queueCount = 1;
  queue_info.pQueuePriorities = &priority;
  VkDeviceCreateInfo info{VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO};
  info.pNext = &chain.features;
  info.queueCreateInfoCount = 1;
  info.pQueueCreateInfos = &queue_info;
  info.enabledExtensionCount = std::uint32_t(chain.extensions.size());
  info.ppEnabledExtensionNames = chain.extensions.data();
  VkDevice device = VK_NULL_HANDLE;
  REQUIRE(vkCreateDevice(caps.physical, &info, nullptr, &device) == VK_SUCCESS);
  volkLoadDevice(device);  // treeattn's volk: its device functions (vkDestroyDevice below) from this device
  vulkan::ExternalDevice external;
  external.instance = instance->handle();
  external.physical_device = caps.physical;
  external.device = device;
  external.get_instance_proc_addr = vkGetInstanceProcAddr;
  external.enabled_features = &chain.features;
  external.enabled_extensions = chain.extensions.data();
  external.enabled_extension_count = std::uint32_t(chain.extensions.size());
  CHECK_THROWS_WITH_AS(vulkan::Context{external},
                       doctest::Contains("as the application enabled it) cannot run treeattn's shaders: needs the "
                                         "bufferDeviceAddress feature"),
                       Error);
  vkDestroyDevice(device, nullptr);
}

TEST_CASE("a workspace's errors: record before upload, tensors that do not match, misaligned offsets") {
  const vulkan::Context context(vulkan::context_options(harness_options()));
  vulkan::Workspace workspace(context, DType::f16);
  CHECK_THROWS_AS(vulkan::Workspace(context, DType::f32), Error);
  Tree tree({8, 2, 64});
  tree.add_node_range(0, kNoParent, 0, 100);
  tree.add_query(0);
  const Plan plan = treeattn::plan(tree, PlanOptions{});
  const vulkan::Device& device = *state_of(context).device;
  vulkan::Buffer q(device, 8 * 64 * 2, vulkan::Buffer::Kind::device_local);
  vulkan::Buffer kv(device, 128 * 2 * 64 * 2, vulkan::Buffer::Kind::device_local);
  vulkan::Buffer o(device, 8 * 64 * 4 + 16, vulkan::Buffer::Kind::device_local);
  using vulkan::Tensor;
  const Tensor tq{q.handle(), 0, DType::f16, {1, 8, 64}}, tkv{kv.handle(), 0, DType::f16, {128, 2, 64}};
  const Tensor to{o.handle(), 0, DType::f32, {1, 8, 64}};
  vulkan::CommandSequence sequence(device);
  sequence.begin();
  CHECK_THROWS_WITH_AS(workspace.record(sequence.handle(), {tq, tkv, tkv, to, {}}),
                       doctest::Contains("record before any plan was uploaded"), Error);
  workspace.upload(plan, sequence.handle());
  CHECK_THROWS_WITH_AS(workspace.record(sequence.handle(), {Tensor{q.handle(), 0, DType::f16, {2, 8, 64}}, tkv, tkv, to, {}}),
                       doctest::Contains("Q is [2, 8, 64] f16, expected [1, 8, 64]"), Error);
  CHECK_THROWS_WITH_AS(workspace.record(sequence.handle(), {tq, Tensor{kv.handle(), 0, DType::f16, {50, 2, 64}}, tkv, to, {}}),
                       doctest::Contains("K has 50 slots but the tree reads slot 99"), Error);
  CHECK_THROWS_WITH_AS(workspace.record(sequence.handle(), {tq, tkv, tkv, Tensor{o.handle(), 8, DType::f32, {1, 8, 64}}, {}}),
                       doctest::Contains("O starts at offset 8: it must be 16-byte aligned"), Error);
  CHECK_NOTHROW(workspace.record(sequence.handle(), {tq, tkv, tkv, to, {}}));
  sequence.end();
  sequence.submit_and_wait();
}

namespace {

void* address_of(const vulkan::Buffer& b) { return reinterpret_cast<void*>(static_cast<std::uintptr_t>(b.address())); }

}  // namespace

TEST_CASE("the C API's planner on an application's Vulkan device: a decode replay recorded step by step") {
  const vulkan::Context own(vulkan::context_options(harness_options()));  // stands in for the application's device
  const vulkan::Device& device = *state_of(own).device;
  test::AppDevice app(own);
  treeattn_context* context = nullptr;
  REQUIRE_MESSAGE(treeattn_context_create_vulkan(&app.app, nullptr, &context) == TREEATTN_OK, treeattn_last_error());
  // Each call: the inputs copied up, treeattn_enqueue recorded between barriers, O and LSE read back.
  const test::CallPlan call = [&](treeattn_context* ctx, const treeattn_plan* plan, test::Inputs& in, test::Outputs& out) {
    const std::size_t qb = in.q.bytes.size(), kb = in.k.bytes.size(), ob = out.o.bytes.size(), lb = out.lse.bytes.size();
    vulkan::Buffer q(device, qb, vulkan::Buffer::Kind::device_local), k(device, kb, vulkan::Buffer::Kind::device_local);
    vulkan::Buffer v(device, kb, vulkan::Buffer::Kind::device_local), o(device, ob, vulkan::Buffer::Kind::device_local);
    vulkan::Buffer lse(device, lb, vulkan::Buffer::Kind::device_local);
    vulkan::Buffer staging(device, qb + 2 * kb + ob + lb, vulkan::Buffer::Kind::staging);
    auto* host = static_cast<unsigned char*>(staging.mapped());
    std::memcpy(host, in.q.bytes.data(), qb);
    std::memcpy(host + qb, in.k.bytes.data(), kb);
    std::memcpy(host + qb + kb, in.v.bytes.data(), kb);
    const treeattn_tensor tq = test::c_tensor(address_of(q), TREEATTN_DTYPE_F16, 3, in.q.shape[0], in.q.shape[1], in.q.shape[2]);
    const treeattn_tensor tk = test::c_tensor(address_of(k), TREEATTN_DTYPE_F16, 3, in.k.shape[0], in.k.shape[1], in.k.shape[2]);
    const treeattn_tensor tv = test::c_tensor(address_of(v), TREEATTN_DTYPE_F16, 3, in.v.shape[0], in.v.shape[1], in.v.shape[2]);
    const treeattn_tensor to = test::c_tensor(address_of(o), TREEATTN_DTYPE_F32, 3, out.o.shape[0], out.o.shape[1], out.o.shape[2]);
    const treeattn_tensor tl = test::c_tensor(address_of(lse), TREEATTN_DTYPE_F32, 2, out.lse.shape[0], out.lse.shape[1]);
    vulkan::CommandSequence sequence(device);
    sequence.begin();
    sequence.copy(staging, q, qb, 0);
    sequence.copy(staging, k, kb, qb);
    sequence.copy(staging, v, kb, qb + kb);
    sequence.barrier();
    REQUIRE_MESSAGE(treeattn_enqueue(ctx, plan, &tq, &tk, &tv, &to, &tl, sequence.handle()) == TREEATTN_OK,
                    treeattn_last_error());
    sequence.barrier();
    sequence.copy(o, staging, ob, 0, 0);
    sequence.copy(lse, staging, lb, 0, ob);
    sequence.end();
    sequence.submit_and_wait();
    std::memcpy(out.o.bytes.data(), host, ob);
    std::memcpy(out.lse.bytes.data(), host + ob, lb);
  };
  test::CReplayOptions options;
  options.steps = 12;
  CHECK(test::check_c_planner_replay(context, call, options) == 0);
  options.bitwise_updates = false;
  test::check_c_planner_replay(context, call, options);
  treeattn_context_destroy(context);
}

TEST_CASE("the C API on an application's Vulkan device: treeattn_enqueue records by buffer address into its command buffer") {
  const vulkan::Context own(vulkan::context_options(harness_options()));  // stands in for the application's device
  const vulkan::Device& device = *state_of(own).device;
  test::AppDevice app(own);
  treeattn_context* context = nullptr;
  REQUIRE_MESSAGE(treeattn_context_create_vulkan(&app.app, nullptr, &context) == TREEATTN_OK, treeattn_last_error());
  CHECK(std::string(treeattn_context_backend(context)) == "vulkan");

  treeattn_tree* tree = nullptr;
  REQUIRE(treeattn_tree_create(8, 2, 64, 0.0f, &tree) == TREEATTN_OK);
  REQUIRE(treeattn_tree_add_node_range(tree, 0, -1, 0, 300) == TREEATTN_OK);
  REQUIRE(treeattn_tree_add_node_range(tree, 1, 0, 300, 12) == TREEATTN_OK);
  REQUIRE(treeattn_tree_add_node_range(tree, 2, 0, 312, 12) == TREEATTN_OK);
  REQUIRE(treeattn_tree_add_query(tree, 1, -1) == TREEATTN_OK);
  REQUIRE(treeattn_tree_add_query(tree, 2, 5) == TREEATTN_OK);
  treeattn_plan* plan = nullptr;
  REQUIRE(treeattn_plan_create(context, tree, nullptr, &plan) == TREEATTN_OK);

  Tree same({8, 2, 64});
  same.add_node_range(0, kNoParent, 0, 300);
  same.add_node_range(1, 0, 300, 12);
  same.add_node_range(2, 0, 312, 12);
  same.add_query(1);
  same.add_query(2, 5);
  test::Inputs in = test::make_inputs(same, DType::f16, 3);
  DeviceArrays arrays(device, {&in.q, &in.k, &in.v});
  vulkan::Buffer o(device, 2 * 8 * 64 * 4, vulkan::Buffer::Kind::device_local);
  vulkan::Buffer readback(device, o.bytes(), vulkan::Buffer::Kind::staging);
  const treeattn_tensor tq = test::c_tensor(arrays.address(0), TREEATTN_DTYPE_F16, 3, 2, 8, 64);
  const treeattn_tensor tk = test::c_tensor(arrays.address(1), TREEATTN_DTYPE_F16, 3, in.k.shape[0], 2, 64);
  const treeattn_tensor tv = test::c_tensor(arrays.address(2), TREEATTN_DTYPE_F16, 3, in.v.shape[0], 2, 64);
  const treeattn_tensor to = test::c_tensor(reinterpret_cast<void*>(static_cast<std::uintptr_t>(o.address())),
                                            TREEATTN_DTYPE_F32, 3, 2, 8, 64);

  vulkan::CommandSequence sequence(device);
  sequence.begin();
  arrays.record(sequence);
  sequence.barrier();
  REQUIRE_MESSAGE(treeattn_enqueue(context, plan, &tq, &tk, &tv, &to, nullptr, sequence.handle()) == TREEATTN_OK,
                  treeattn_last_error());
  sequence.barrier();
  sequence.copy(o, readback, o.bytes());
  sequence.end();
  sequence.submit_and_wait();
  HostArray got(DType::f32, {2, 8, 64});
  std::memcpy(got.bytes.data(), readback.mapped(), got.bytes.size());
  const test::OracleResult want = test::oracle_attention(same, in.q.view(), in.k.view(), in.v.view());
  CHECK(test::max_abs_error(got.view(), want.o) <= test::tolerance(DType::f16));

  treeattn_tensor host_q = tq;
  CHECK(treeattn_run(context, plan, &host_q, &tk, &tv, &to, nullptr) == TREEATTN_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(treeattn_last_error()).find("records into its command buffers only") != std::string::npos);
  treeattn_plan_destroy(plan);
  treeattn_tree_destroy(tree);
  treeattn_context_destroy(context);
}

TEST_CASE("fp8 K and V, per-head scales, sinks and soft-cap in an application's buffers: treeattn_enqueue_with and vulkan::Workspace::record") {
  const vulkan::Context own(vulkan::context_options(harness_options()));  // stands in for the application's device
  const vulkan::Device& device = *state_of(own).device;
  test::AppDevice app(own);
  treeattn_context* context = nullptr;
  REQUIRE_MESSAGE(treeattn_context_create_vulkan(&app.app, nullptr, &context) == TREEATTN_OK, treeattn_last_error());
  treeattn_tree* tree = nullptr;
  REQUIRE(treeattn_tree_create(8, 2, 64, 0.0f, &tree) == TREEATTN_OK);
  REQUIRE(treeattn_tree_add_node_range(tree, 0, -1, 0, 200) == TREEATTN_OK);
  REQUIRE(treeattn_tree_add_node_range(tree, 1, 0, 200, 9) == TREEATTN_OK);
  REQUIRE(treeattn_tree_add_query(tree, 1, -1) == TREEATTN_OK);
  REQUIRE(treeattn_tree_add_query(tree, 0, 3) == TREEATTN_OK);
  treeattn_plan* plan = nullptr;
  REQUIRE(treeattn_plan_create(context, tree, nullptr, &plan) == TREEATTN_OK);
  Tree same({8, 2, 64});
  same.add_node_range(0, kNoParent, 0, 200);
  same.add_node_range(1, 0, 200, 9);
  same.add_query(1);
  same.add_query(0, 3);

  test::Variant variant;
  for (const test::Variant& v : test::all_variants()) {
    if (std::string(v.name) == "fp8_e4m3 + sinks + soft-cap 30") variant = v;
  }
  REQUIRE(variant.per_head_scales);
  test::Inputs in = test::make_variant_inputs(same, variant, 4);
  DeviceArrays arrays(device, {&in.q, &in.k, &in.v, &in.sinks, &in.k_scales, &in.v_scales});
  // O of the C call, then O of the C++ call.
  vulkan::Buffer o(device, 2 * 2 * 8 * 64 * 2, vulkan::Buffer::Kind::device_local);
  vulkan::Buffer readback(device, o.bytes(), vulkan::Buffer::Kind::staging);
  const treeattn_tensor tq = test::c_tensor(arrays.address(0), TREEATTN_DTYPE_F16, 3, 2, 8, 64);
  const treeattn_tensor tk = test::c_tensor(arrays.address(1), TREEATTN_DTYPE_FP8_E4M3, 3, in.k.shape[0], 2, 64);
  const treeattn_tensor tv = test::c_tensor(arrays.address(2), TREEATTN_DTYPE_FP8_E4M3, 3, in.v.shape[0], 2, 64);
  const treeattn_tensor sinks = test::c_tensor(arrays.address(3), TREEATTN_DTYPE_F32, 1, 8);
  const treeattn_tensor k_scales = test::c_tensor(arrays.address(4), TREEATTN_DTYPE_F32, 1, 2);
  const treeattn_tensor v_scales = test::c_tensor(arrays.address(5), TREEATTN_DTYPE_F32, 1, 2);
  const treeattn_tensor to = test::c_tensor(reinterpret_cast<void*>(static_cast<std::uintptr_t>(o.address())),
                                            TREEATTN_DTYPE_F16, 3, 2, 8, 64);
  treeattn_attention_options options;
  treeattn_attention_options_init(&options);
  options.logit_softcap = in.logit_softcap;
  options.sinks = &sinks;
  options.k_scales = &k_scales;
  options.v_scales = &v_scales;

  vulkan::CommandSequence sequence(device);
  sequence.begin();
  arrays.record(sequence);
  sequence.barrier();
  REQUIRE_MESSAGE(treeattn_enqueue_with(context, plan, &tq, &tk, &tv, &to, nullptr, &options, sequence.handle()) ==
                      TREEATTN_OK,
                  treeattn_last_error());
  // The same call through the C++ device path, on the buffers themselves.
  vulkan::Workspace workspace(own, DType::f16);
  workspace.upload(treeattn::plan(same, PlanOptions{}), sequence.handle());
  using vulkan::Tensor;
  const std::int64_t slots = in.k.shape[0];
  vulkan::Tensors tensors{Tensor{arrays.buffers[0].handle(), 0, DType::f16, {2, 8, 64}},
                          Tensor{arrays.buffers[1].handle(), 0, DType::fp8_e4m3, {slots, 2, 64}},
                          Tensor{arrays.buffers[2].handle(), 0, DType::fp8_e4m3, {slots, 2, 64}},
                          Tensor{o.handle(), 2 * 8 * 64 * 2, DType::f16, {2, 8, 64}},
                          {}};
  tensors.options.logit_softcap = in.logit_softcap;
  tensors.options.sinks = Tensor{arrays.buffers[3].handle(), 0, DType::f32, {8}};
  tensors.options.k_scales = Tensor{arrays.buffers[4].handle(), 0, DType::f32, {2}};
  tensors.options.v_scales = Tensor{arrays.buffers[5].handle(), 0, DType::f32, {3}};
  CHECK_THROWS_WITH_AS(workspace.record(sequence.handle(), tensors), doctest::Contains("v_scales"), Error);
  tensors.options.v_scales.shape = {2};
  workspace.record(sequence.handle(), tensors);
  sequence.barrier();
  sequence.copy(o, readback, o.bytes());
  sequence.end();
  sequence.submit_and_wait();
  const test::OracleResult want = test::oracle_attention(same, in.q.view(), in.k.view(), in.v.view(), in.options());
  for (int call = 0; call < 2; ++call) {
    CAPTURE(call);
    HostArray got(DType::f16, {2, 8, 64});
    std::memcpy(got.bytes.data(), static_cast<const unsigned char*>(readback.mapped()) + call * got.bytes.size(), got.bytes.size());
    CHECK(test::max_abs_error(got.view(), want.o) <= test::tolerance(DType::f16));
  }
  treeattn_plan_destroy(plan);
  treeattn_tree_destroy(tree);
  treeattn_context_destroy(context);
}
