#include "vk_buffer.hpp"

#include <algorithm>
#include <utility>

#include "vk_check.hpp"

namespace treeattn::vulkan {

namespace {

// vkAllocateMemory, or a fault test's injected failure of it (the driver's own
// result: out of device memory for device-local memory, else out of host memory).
VkResult allocate_memory(VkDevice device, const VkMemoryAllocateInfo& info, Buffer::Kind kind, VkDeviceMemory* memory) {
  namespace faults = fault_injection;
  const bool device_local = kind == Buffer::Kind::device_local;
  if (faults::fails(device_local ? faults::device_allocation : faults::pinned_allocation)) {
    return device_local ? VK_ERROR_OUT_OF_DEVICE_MEMORY : VK_ERROR_OUT_OF_HOST_MEMORY;
  }
  return vkAllocateMemory(device, &info, nullptr, memory);
}

}  // namespace

// Delegates to the default constructor first so that the object exists when a
// step below throws: its destructor then releases what the steps before made.
Buffer::Buffer(const Device& device, std::size_t bytes, Kind kind) : Buffer() {
  device_ = device.handle();
  bytes_ = bytes;
  VkBufferCreateInfo info{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
  info.size = std::max<std::size_t>(bytes, 16);
  info.usage = VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT;
  const bool addressed = kind != Kind::staging;
  if (addressed) info.usage |= VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_SHADER_DEVICE_ADDRESS_BIT;
  info.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
  TREEATTN_VK_CHECK(vkCreateBuffer(device_, &info, nullptr, &buffer_));

  VkMemoryRequirements needs{};
  vkGetBufferMemoryRequirements(device_, buffer_, &needs);
  VkMemoryAllocateFlagsInfo flags{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_FLAGS_INFO};
  flags.flags = VK_MEMORY_ALLOCATE_DEVICE_ADDRESS_BIT;
  VkMemoryAllocateInfo allocate{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
  allocate.allocationSize = needs.size;
  if (addressed) allocate.pNext = &flags;
  if (kind == Kind::device_local) {
    allocate.memoryTypeIndex = device.memory_type(needs.memoryTypeBits, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT);
  } else if (kind == Kind::host_written) {
    allocate.memoryTypeIndex = device.memory_type(needs.memoryTypeBits,
                                                  VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT,
                                                  VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT);
  } else {
    allocate.memoryTypeIndex = device.memory_type(needs.memoryTypeBits,
                                                  VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT,
                                                  VK_MEMORY_PROPERTY_HOST_CACHED_BIT);
  }
  TREEATTN_VK_CHECK(allocate_memory(device_, allocate, kind, &memory_));
  TREEATTN_VK_CHECK(vkBindBufferMemory(device_, buffer_, memory_, 0));
  if (addressed) {
    VkBufferDeviceAddressInfo address{VK_STRUCTURE_TYPE_BUFFER_DEVICE_ADDRESS_INFO};
    address.buffer = buffer_;
    address_ = vkGetBufferDeviceAddress(device_, &address);
  }
  if (kind != Kind::device_local) TREEATTN_VK_CHECK(vkMapMemory(device_, memory_, 0, VK_WHOLE_SIZE, 0, &mapped_));
}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    release();
    device_ = std::exchange(other.device_, VK_NULL_HANDLE);
    buffer_ = std::exchange(other.buffer_, VK_NULL_HANDLE);
    memory_ = std::exchange(other.memory_, VK_NULL_HANDLE);
    bytes_ = std::exchange(other.bytes_, 0);
    address_ = std::exchange(other.address_, 0);
    mapped_ = std::exchange(other.mapped_, nullptr);
  }
  return *this;
}

void Buffer::release() noexcept {
  if (buffer_ != VK_NULL_HANDLE) vkDestroyBuffer(device_, buffer_, nullptr);
  if (memory_ != VK_NULL_HANDLE) vkFreeMemory(device_, memory_, nullptr);  // unmaps too
  buffer_ = VK_NULL_HANDLE;
  memory_ = VK_NULL_HANDLE;
  mapped_ = nullptr;
}

}  // namespace treeattn::vulkan
