#include "vk_sequence.hpp"

#include <fmt/format.h>

#include "vk_check.hpp"

namespace treeattn::vulkan {

void record_dispatch(VkCommandBuffer commands, const ComputePipeline& pipeline, const void* push_constants,
                     std::uint32_t push_bytes, std::uint32_t groups_x, std::uint32_t groups_y, std::uint32_t groups_z) {
  if (groups_x == 0 || groups_y == 0 || groups_z == 0) return;
  vkCmdBindPipeline(commands, VK_PIPELINE_BIND_POINT_COMPUTE, pipeline.handle());
  vkCmdPushConstants(commands, pipeline.layout(), VK_SHADER_STAGE_COMPUTE_BIT, 0, push_bytes, push_constants);
  vkCmdDispatch(commands, groups_x, groups_y, groups_z);
}

void record_compute_barrier(VkCommandBuffer commands) {
  VkMemoryBarrier memory{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
  memory.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT;
  memory.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT;
  vkCmdPipelineBarrier(commands, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, 1,
                       &memory, 0, nullptr, 0, nullptr);
}

void record_transfer_to_compute_barrier(VkCommandBuffer commands) {
  VkMemoryBarrier memory{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
  memory.srcAccessMask = VK_ACCESS_TRANSFER_WRITE_BIT;
  memory.dstAccessMask = VK_ACCESS_SHADER_READ_BIT;
  vkCmdPipelineBarrier(commands, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, 1, &memory, 0,
                       nullptr, 0, nullptr);
}

// Delegates first so that the object exists when a step below throws: its
// destructor then destroys what the steps before made.
CommandSequence::CommandSequence(const Device& device, std::uint32_t timestamps) : CommandSequence(device, Empty{}) {
  timestamp_count_ = timestamps;
  VkCommandPoolCreateInfo pool_info{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
  pool_info.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
  pool_info.queueFamilyIndex = device.queue_family();
  TREEATTN_VK_CHECK(vkCreateCommandPool(device.handle(), &pool_info, nullptr, &pool_));
  VkCommandBufferAllocateInfo allocate{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
  allocate.commandPool = pool_;
  allocate.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
  allocate.commandBufferCount = 1;
  TREEATTN_VK_CHECK(vkAllocateCommandBuffers(device.handle(), &allocate, &commands_));
  VkFenceCreateInfo fence_info{VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
  TREEATTN_VK_CHECK(vkCreateFence(device.handle(), &fence_info, nullptr, &fence_));
  if (timestamps > 0) {
    VkQueryPoolCreateInfo query_info{VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO};
    query_info.queryType = VK_QUERY_TYPE_TIMESTAMP;
    query_info.queryCount = timestamps;
    TREEATTN_VK_CHECK(vkCreateQueryPool(device.handle(), &query_info, nullptr, &queries_));
  }
}

CommandSequence::~CommandSequence() {
  // A submission whose wait failed may still run: its commands and the
  // buffers they use outlive it.
  if (submitted_) vkWaitForFences(device_.handle(), 1, &fence_, VK_TRUE, UINT64_MAX);
  if (queries_ != VK_NULL_HANDLE) vkDestroyQueryPool(device_.handle(), queries_, nullptr);
  if (fence_ != VK_NULL_HANDLE) vkDestroyFence(device_.handle(), fence_, nullptr);
  if (pool_ != VK_NULL_HANDLE) vkDestroyCommandPool(device_.handle(), pool_, nullptr);  // frees the buffer
}

void CommandSequence::begin() {
  if (submitted_) TREEATTN_VK_CHECK(vkWaitForFences(device_.handle(), 1, &fence_, VK_TRUE, UINT64_MAX));
  submitted_ = false;
  TREEATTN_VK_CHECK(vkResetCommandBuffer(commands_, 0));
  VkCommandBufferBeginInfo info{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
  TREEATTN_VK_CHECK(vkBeginCommandBuffer(commands_, &info));
  if (queries_ != VK_NULL_HANDLE) vkCmdResetQueryPool(commands_, queries_, 0, timestamp_count_);
}

void CommandSequence::copy(const Buffer& from, const Buffer& to, std::size_t bytes, std::size_t from_offset,
                           std::size_t to_offset) {
  if (bytes == 0) return;
  const VkBufferCopy region{from_offset, to_offset, bytes};
  vkCmdCopyBuffer(commands_, from.handle(), to.handle(), 1, &region);
}

void CommandSequence::fill(const Buffer& buffer, std::uint32_t value) {
  vkCmdFillBuffer(commands_, buffer.handle(), 0, VK_WHOLE_SIZE, value);
}

void CommandSequence::dispatch(const ComputePipeline& pipeline, const void* push_constants, std::uint32_t push_bytes,
                               std::uint32_t groups_x, std::uint32_t groups_y, std::uint32_t groups_z) {
  record_dispatch(commands_, pipeline, push_constants, push_bytes, groups_x, groups_y, groups_z);
}

void CommandSequence::barrier() {
  VkMemoryBarrier memory{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
  memory.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
  memory.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_READ_BIT |
                         VK_ACCESS_TRANSFER_WRITE_BIT;
  const VkPipelineStageFlags stages = VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT;
  vkCmdPipelineBarrier(commands_, stages, stages, 0, 1, &memory, 0, nullptr, 0, nullptr);
}

void CommandSequence::compute_barrier() { record_compute_barrier(commands_); }

void CommandSequence::timestamp(std::uint32_t index) {
  vkCmdWriteTimestamp(commands_, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, queries_, index);
}

void CommandSequence::end() { TREEATTN_VK_CHECK(vkEndCommandBuffer(commands_)); }

void CommandSequence::submit_and_wait() {
  VkSubmitInfo submit{VK_STRUCTURE_TYPE_SUBMIT_INFO};
  submit.commandBufferCount = 1;
  submit.pCommandBuffers = &commands_;
  TREEATTN_VK_CHECK(vkResetFences(device_.handle(), 1, &fence_));
  TREEATTN_VK_CHECK(vkQueueSubmit(device_.queue(), 1, &submit, fence_));
  submitted_ = true;
  TREEATTN_VK_CHECK(vkWaitForFences(device_.handle(), 1, &fence_, VK_TRUE, UINT64_MAX));
  submitted_ = false;
}

double CommandSequence::elapsed_ns(std::uint32_t first, std::uint32_t second) {
  std::uint64_t ticks[2] = {};
  TREEATTN_VK_CHECK(vkGetQueryPoolResults(device_.handle(), queries_, first, 1, sizeof(ticks[0]), &ticks[0], 8,
                                          VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT));
  TREEATTN_VK_CHECK(vkGetQueryPoolResults(device_.handle(), queries_, second, 1, sizeof(ticks[1]), &ticks[1], 8,
                                          VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT));
  return double(ticks[1] - ticks[0]) * double(device_.caps().timestamp_period_ns);
}

}  // namespace treeattn::vulkan
