#pragma once
// A recorded command buffer and the fence that waits for it: copies, compute
// dispatches with their push constants, barriers and GPU timestamps. Recorded
// once, it can be submitted many times (the benchmark replays a decode step).

#include <cstddef>
#include <cstdint>
#include <vector>

#include "vk_buffer.hpp"
#include "vk_pipeline.hpp"

namespace treeattn::vulkan {

// Commands recorded into any command buffer: an application's, or a CommandSequence's.
// A dispatch with its push constants (nothing when a count is 0).
void record_dispatch(VkCommandBuffer commands, const ComputePipeline& pipeline, const void* push_constants,
                     std::uint32_t push_bytes, std::uint32_t groups_x, std::uint32_t groups_y = 1, std::uint32_t groups_z = 1);
// Earlier dispatches' writes made visible to later dispatches' reads and writes.
void record_compute_barrier(VkCommandBuffer commands);
// Earlier copies' writes made visible to later dispatches' reads.
void record_transfer_to_compute_barrier(VkCommandBuffer commands);

class CommandSequence {
 public:
  explicit CommandSequence(const Device& device, std::uint32_t timestamps = 0);
  ~CommandSequence();
  CommandSequence(const CommandSequence&) = delete;
  CommandSequence& operator=(const CommandSequence&) = delete;

  VkCommandBuffer handle() const noexcept { return commands_; }
  void begin();  // starts a new recording (the previous one must have completed)
  void copy(const Buffer& from, const Buffer& to, std::size_t bytes, std::size_t from_offset = 0, std::size_t to_offset = 0);
  void fill(const Buffer& buffer, std::uint32_t value);
  void dispatch(const ComputePipeline& pipeline, const void* push_constants, std::uint32_t push_bytes,
                std::uint32_t groups_x, std::uint32_t groups_y = 1, std::uint32_t groups_z = 1);
  // Makes every earlier transfer or shader write visible to later commands.
  void barrier();
  // Makes earlier dispatches' writes visible to later dispatches only: no
  // transfer stage to drain, so back-to-back dispatches wait less.
  void compute_barrier();
  void timestamp(std::uint32_t index);
  void end();
  // Submits the recording and waits for it.
  void submit_and_wait();
  // Nanoseconds between two timestamps of the last completed submission.
  double elapsed_ns(std::uint32_t first, std::uint32_t second);

 private:
  struct Empty {};
  CommandSequence(const Device& device, Empty) noexcept : device_(device) {}  // nothing created yet
  const Device& device_;
  VkCommandPool pool_ = VK_NULL_HANDLE;
  VkCommandBuffer commands_ = VK_NULL_HANDLE;
  VkFence fence_ = VK_NULL_HANDLE;
  VkQueryPool queries_ = VK_NULL_HANDLE;
  std::uint32_t timestamp_count_ = 0;
  bool submitted_ = false;  // submitted, its completion not yet seen
};

}  // namespace treeattn::vulkan
