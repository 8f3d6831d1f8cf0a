#pragma once
// A compute pipeline from embedded SPIR-V: specialization constants, one push
// constant block (the shaders reach every buffer by device address, so there
// are no descriptor sets), an optional required subgroup size, and the
// backend's pipeline cache.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "vk_device.hpp"

namespace treeattn::vulkan {

struct SpirvModule {
  const std::uint32_t* words;
  std::size_t word_count;
};

class ComputePipeline {
 public:
  // capture_statistics: keep the compiler's figures for statistics() (needs
  // DeviceCaps::pipeline_statistics).
  ComputePipeline(const Device& device, VkPipelineCache cache, SpirvModule module,
                  const std::vector<std::uint32_t>& specialization,  // constant_id 0, 1, ...
                  std::uint32_t push_constant_bytes, std::uint32_t required_subgroup_size = 0,
                  bool capture_statistics = false);
  ~ComputePipeline();
  ComputePipeline(const ComputePipeline&) = delete;
  ComputePipeline& operator=(const ComputePipeline&) = delete;

  VkPipeline handle() const noexcept { return pipeline_; }
  VkPipelineLayout layout() const noexcept { return layout_; }
  // What the driver's compiler reports of the pipeline ("Register Count 96", ...),
  // one entry per statistic; empty unless captured.
  std::vector<std::string> statistics() const;

 private:
  void destroy() noexcept;
  VkDevice device_;
  bool captured_ = false;
  VkShaderModule module_ = VK_NULL_HANDLE;
  VkPipelineLayout layout_ = VK_NULL_HANDLE;
  VkPipeline pipeline_ = VK_NULL_HANDLE;
};

}  // namespace treeattn::vulkan
