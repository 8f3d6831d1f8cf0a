#include "vk_pipeline.hpp"

#include <fmt/format.h>

#include "vk_check.hpp"

namespace treeattn::vulkan {

ComputePipeline::ComputePipeline(const Device& device, VkPipelineCache cache, SpirvModule module,
                                 const std::vector<std::uint32_t>& specialization, std::uint32_t push_constant_bytes,
                                 std::uint32_t required_subgroup_size, bool capture_statistics)
    : device_(device.handle()), captured_(capture_statistics) {
  struct Release {  // the partly built objects when a step throws
    ComputePipeline& p;
    bool done = false;
    ~Release() {
      if (!done) p.destroy();
    }
  } release{*this};

  VkShaderModuleCreateInfo module_info{VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO};
  module_info.codeSize = module.word_count * 4;
  module_info.pCode = module.words;
  TREEATTN_VK_CHECK(vkCreateShaderModule(device_, &module_info, nullptr, &module_));

  VkPushConstantRange range{VK_SHADER_STAGE_COMPUTE_BIT, 0, push_constant_bytes};
  VkPipelineLayoutCreateInfo layout_info{VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO};
  layout_info.pushConstantRangeCount = 1;
  layout_info.pPushConstantRanges = &range;
  TREEATTN_VK_CHECK(vkCreatePipelineLayout(device_, &layout_info, nullptr, &layout_));

  std::vector<VkSpecializationMapEntry> entries;
  for (std::uint32_t id = 0; id < specialization.size(); ++id) entries.push_back({id, id * 4, 4});
  VkSpecializationInfo spec{};
  spec.mapEntryCount = std::uint32_t(entries.size());
  spec.pMapEntries = entries.data();
  spec.dataSize = specialization.size() * 4;
  spec.pData = specialization.data();

  VkPipelineShaderStageRequiredSubgroupSizeCreateInfo subgroup{
      VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_REQUIRED_SUBGROUP_SIZE_CREATE_INFO};
  subgroup.requiredSubgroupSize = required_subgroup_size;
  VkComputePipelineCreateInfo info{VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO};
  info.stage.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO;
  info.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
  info.stage.module = module_;
  info.stage.pName = "main";
  info.stage.pSpecializationInfo = &spec;
  if (required_subgroup_size != 0) {
    info.stage.pNext = &subgroup;
    info.stage.flags = VK_PIPELINE_SHADER_STAGE_CREATE_REQUIRE_FULL_SUBGROUPS_BIT;
  }
  info.layout = layout_;
  if (capture_statistics) info.flags = VK_PIPELINE_CREATE_CAPTURE_STATISTICS_BIT_KHR;
  TREEATTN_VK_CHECK(vkCreateComputePipelines(device_, cache, 1, &info, nullptr, &pipeline_));
  release.done = true;
}

ComputePipeline::~ComputePipeline() { destroy(); }

std::vector<std::string> ComputePipeline::statistics() const {
  std::vector<std::string> lines;
  if (!captured_) return lines;
  VkPipelineInfoKHR pipeline_info{VK_STRUCTURE_TYPE_PIPELINE_INFO_KHR};
  pipeline_info.pipeline = pipeline_;
  std::uint32_t executables = 0;
  TREEATTN_VK_CHECK(vkGetPipelineExecutablePropertiesKHR(device_, &pipeline_info, &executables, nullptr));
  for (std::uint32_t e = 0; e < executables; ++e) {
    VkPipelineExecutableInfoKHR executable{VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_INFO_KHR};
    executable.pipeline = pipeline_;
    executable.executableIndex = e;
    std::uint32_t count = 0;
    TREEATTN_VK_CHECK(vkGetPipelineExecutableStatisticsKHR(device_, &executable, &count, nullptr));
    std::vector<VkPipelineExecutableStatisticKHR> stats(count, {VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_STATISTIC_KHR});
    TREEATTN_VK_CHECK(vkGetPipelineExecutableStatisticsKHR(device_, &executable, &count, stats.data()));
    for (const auto& s : stats) {
      switch (s.format) {
        case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_BOOL32_KHR: lines.push_back(fmt::format("{} {}", s.name, bool(s.value.b32))); break;
        case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_INT64_KHR: lines.push_back(fmt::format("{} {}", s.name, s.value.i64)); break;
        case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_UINT64_KHR: lines.push_back(fmt::format("{} {}", s.name, s.value.u64)); break;
        case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_FLOAT64_KHR: lines.push_back(fmt::format("{} {}", s.name, s.value.f64)); break;
        default: break;
      }
    }
  }
  return lines;
}

void ComputePipeline::destroy() noexcept {
  if (pipeline_ != VK_NULL_HANDLE) vkDestroyPipeline(device_, pipeline_, nullptr);
  if (layout_ != VK_NULL_HANDLE) vkDestroyPipelineLayout(device_, layout_, nullptr);
  if (module_ != VK_NULL_HANDLE) vkDestroyShaderModule(device_, module_, nullptr);
  pipeline_ = VK_NULL_HANDLE;
  layout_ = VK_NULL_HANDLE;
  module_ = VK_NULL_HANDLE;
}

}  // namespace treeattn::vulkan
