#pragma once
// A buffer with its own memory: device-local (what shaders read, by device
// address), host-visible and mapped (staging), or both mapped and reached by
// device address (small tables the host writes and shaders read; device-local
// where the device has such memory). Move-only.

#include <cstddef>
#include <cstdint>

#include "vk_device.hpp"

namespace treeattn::vulkan {

class Buffer {
 public:
  enum class Kind { device_local, staging, host_written };

  Buffer() = default;
  Buffer(const Device& device, std::size_t bytes, Kind kind);
  ~Buffer() { release(); }
  Buffer(Buffer&& other) noexcept { *this = std::move(other); }
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  VkBuffer handle() const noexcept { return buffer_; }
  std::size_t bytes() const noexcept { return bytes_; }
  VkDeviceAddress address() const noexcept { return address_; }
  void* mapped() const noexcept { return mapped_; }  // staging and host_written buffers

 private:
  void release() noexcept;
  VkDevice device_ = VK_NULL_HANDLE;
  VkBuffer buffer_ = VK_NULL_HANDLE;
  VkDeviceMemory memory_ = VK_NULL_HANDLE;
  std::size_t bytes_ = 0;
  VkDeviceAddress address_ = 0;
  void* mapped_ = nullptr;
};

}  // namespace treeattn::vulkan
