// The public Vulkan device path (treeattn/vulkan.hpp) beyond what the
// vulkan_embed example proves end to end: the features an application enabled
// are the ones used, a device without what the shaders need is refused by
// name, and a workspace's errors name the tensor.

#include <doctest/doctest.h>

#include "../backends/vulkan/context_state.hpp"
#include "../backends/vulkan/vk_buffer.hpp"
#include "../backends/vulkan/vk_sequence.hpp"
#include "support/conformance.hpp"
#include "treeattn/error.hpp"
#include "treeattn/vulkan.hpp"

using namespace treeattn;

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
  CHECK(vulkan::choose_variant(no_extension, "auto", DType::f16, true, 128) == vulkan::Variant::scalar);

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
  const vulkan::DeviceCaps& caps = vulkan::select_device(devices, -1);
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
  const vulkan::Context context;
  vulkan::Workspace workspace(context, DType::f16);
  CHECK_THROWS_AS(vulkan::Workspace(context, DType::f32), Error);
  Tree tree({8, 2, 64});
  tree.add_node_range(0, kNoParent, 0, 100);
  tree.add_query(0);
  const Plan plan = treeattn::plan(tree, PlanOptions{});
  const vulkan::Device& device = *context.state().device;
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
