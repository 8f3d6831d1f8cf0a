// The demo's Vulkan decode loop on the device path: treeattn's own device
// (vulkan::Context), the KV cache in device-local buffers, and per step one
// command buffer: the rows written since the last step and Q copied from the
// step's staging memory (only those rows), the plan uploaded, the
// step's layers recorded between two timestamps, submitted without waiting,
// so the host plans the next step meanwhile. Two steps in flight (the
// discipline vulkan.hpp documents): a frame's command buffer, staging memory
// and timestamps are reused once its fence says the step two back is done.
// The workspace and the staging memory are sized for the run's steps reserved
// ahead; staging memory still too small is replaced by one twice as large.

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <string>
#include <tuple>
#include <utility>

#include <fmt/format.h>

#include "demo_runner.hpp"
#include "treeattn/vulkan.hpp"
#include "vulkan/context_options.hpp"
#include "vulkan_functions.hpp"

namespace treeattn::cli {
namespace {

void check(VkResult result, const char* what) {
  if (result != VK_SUCCESS) throw Error(ErrorCategory::Backend, fmt::format("demo: {} failed: VkResult {}", what, int(result)));
}

std::size_t align16(std::size_t bytes) { return (bytes + 15) / 16 * 16; }

double since_us(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t).count();
}

void memory_barrier(const VulkanFunctions& vk, VkCommandBuffer commands, VkPipelineStageFlags from, VkAccessFlags from_access,
                    VkPipelineStageFlags to, VkAccessFlags to_access) {
  VkMemoryBarrier memory{VK_STRUCTURE_TYPE_MEMORY_BARRIER, nullptr, from_access, to_access};
  vk.CmdPipelineBarrier(commands, from, to, 0, 1, &memory, 0, nullptr, 0, nullptr);
}

// A buffer of the runner's device: device-local and reached by the shaders
// through its device address, or host-visible, coherent and mapped.
class Buffer {
 public:
  Buffer() = default;
  Buffer(const VulkanFunctions& vk, VkDevice device, const VkPhysicalDeviceMemoryProperties& memory, std::size_t bytes,
         bool host_visible, const char* what)
      : vk_(&vk), device_(device), bytes_(std::max<std::size_t>(bytes, 16)) {
    VkBufferCreateInfo info{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
    info.size = bytes_;
    info.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_SHADER_DEVICE_ADDRESS_BIT |
                 VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT;
    check(vk.CreateBuffer(device, &info, nullptr, &buffer_), what);
    VkMemoryRequirements needs{};
    vk.GetBufferMemoryRequirements(device, buffer_, &needs);
    const VkMemoryPropertyFlags want = host_visible
                                           ? VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT
                                           : VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT;
    std::uint32_t type = 0;
    while (type < memory.memoryTypeCount &&
           (!(needs.memoryTypeBits & (1u << type)) || (memory.memoryTypes[type].propertyFlags & want) != want)) {
      ++type;
    }
    if (type == memory.memoryTypeCount) {
      throw Error(ErrorCategory::Backend, fmt::format("demo: {}: the Vulkan device has no {} memory for it", what,
                                                      host_visible ? "host-visible coherent" : "device-local"));
    }
    VkMemoryAllocateFlagsInfo flags{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_FLAGS_INFO};
    flags.flags = VK_MEMORY_ALLOCATE_DEVICE_ADDRESS_BIT;
    VkMemoryAllocateInfo allocate{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
    allocate.pNext = &flags;
    allocate.allocationSize = needs.size;
    allocate.memoryTypeIndex = type;
    if (const VkResult r = vk.AllocateMemory(device, &allocate, nullptr, &memory_); r != VK_SUCCESS) {
      throw Error(ErrorCategory::Backend, fmt::format("demo: {}: allocating {} bytes failed: VkResult {}", what,
                                                      needs.size, int(r)));
    }
    check(vk.BindBufferMemory(device, buffer_, memory_, 0), what);
    if (host_visible) {
      check(vk.MapMemory(device, memory_, 0, VK_WHOLE_SIZE, 0, &mapped_), what);
      // Written once so that its pages are resident from the start: a driver
      // that backs it lazily (lavapipe) would page it in as steps first reach
      // its end, and the process would grow long after warm-up.
      std::memset(mapped_, 0, bytes_);
    }
  }
  ~Buffer() { release(); }
  Buffer(Buffer&& other) noexcept { *this = std::move(other); }
  Buffer& operator=(Buffer&& other) noexcept {
    if (this != &other) {
      release();
      vk_ = other.vk_;
      device_ = other.device_;
      buffer_ = std::exchange(other.buffer_, VkBuffer(VK_NULL_HANDLE));
      memory_ = std::exchange(other.memory_, VkDeviceMemory(VK_NULL_HANDLE));
      mapped_ = std::exchange(other.mapped_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
  }

  VkBuffer handle() const noexcept { return buffer_; }
  unsigned char* mapped() const noexcept { return static_cast<unsigned char*>(mapped_); }
  std::size_t bytes() const noexcept { return bytes_; }

 private:
  void release() noexcept {
    if (buffer_ != VK_NULL_HANDLE) vk_->DestroyBuffer(device_, buffer_, nullptr);
    if (memory_ != VK_NULL_HANDLE) vk_->FreeMemory(device_, memory_, nullptr);  // unmaps it
    buffer_ = VK_NULL_HANDLE;
    memory_ = VK_NULL_HANDLE;
  }

  const VulkanFunctions* vk_ = nullptr;
  VkDevice device_ = VK_NULL_HANDLE;
  VkBuffer buffer_ = VK_NULL_HANDLE;
  VkDeviceMemory memory_ = VK_NULL_HANDLE;
  void* mapped_ = nullptr;
  std::size_t bytes_ = 0;
};

class VulkanRunner final : public StepRunner {
 public:
  VulkanRunner(const BackendOptions& options, const HeadConfig& heads, HostArray& k, HostArray& v, std::int64_t max_queries,
               const AttentionOptions& variants)
      : context_(vulkan::context_options(options)),
        vk_(context_.device()),
        device_(context_.device()),
        k_host_(k),
        v_host_(v),
        row_bytes_(k.bytes.size() / std::size_t(std::max<std::int64_t>(k.shape[0], 1))),
        workspace_(context_, DType::f16) {
    try {
      allocate(heads, max_queries, variants);
    } catch (...) {
      release();
      throw;
    }
  }
  ~VulkanRunner() override { release(); }

  const char* name() const noexcept override { return "Vulkan device path"; }
  bool overlaps() const noexcept override { return true; }

  // The rows are staged by the next run(), once its frame is free: the host
  // writes no K/V row between a step's kv_written() and its run().
  void kv_written(const std::vector<std::int64_t>& slots) override {
    written_.insert(written_.end(), slots.begin(), slots.end());
  }

  bool reserves_ahead() const noexcept override { return true; }

  // The plan uploaded to the workspace into the spare command buffer, never
  // submitted, twice (each of its two staging buffers takes it): its buffers
  // grow as the run's uploads would grow them. And room in every frame's
  // staging for the step's rows and Q.
  void reserve(const Plan& plan, std::size_t written_rows) override {
    for (int staging_buffer = 0; staging_buffer < 2; ++staging_buffer) {
      record_once([&](VkCommandBuffer commands) { workspace_.upload(plan, commands); });
    }
    reserved_staging_ = std::max(reserved_staging_, align16(2 * row_bytes_ * written_rows) + q_.bytes());
  }

  HostTimes run(const Plan& plan, const HostArray& q, int layers) override {
    if (q.bytes.size() > q_.bytes()) {
      throw Error(ErrorCategory::InvalidArgument, fmt::format("demo: Q of {} bytes exceeds the {} bytes the runner was sized for",
                                                              q.bytes.size(), q_.bytes()));
    }
    HostTimes times;
    const auto w0 = std::chrono::steady_clock::now();
    Frame& f = begin_frame();
    times.waited_us = since_us(w0);
    stage_written_rows(f);
    const auto t0 = std::chrono::steady_clock::now();
    workspace_.upload(plan, f.commands);
    times.upload_us = since_us(t0);

    const std::size_t at = stage(f, q.bytes.size());
    std::memcpy(f.staging.mapped() + at, q.bytes.data(), q.bytes.size());
    const VkBufferCopy q_region{at, 0, q.bytes.size()};
    vk_.CmdCopyBuffer(f.commands, f.staging.handle(), q_.handle(), 1, &q_region);
    // The rows and Q copied, for the layers' shaders.
    memory_barrier(vk_, f.commands, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT,
                   VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_READ_BIT);

    const HeadConfig& h = plan.heads;
    const std::int64_t nq = plan.num_queries;
    const vulkan::Tensors tensors{{q_.handle(), 0, DType::f16, q.shape},
                                  {k_.handle(), 0, k_host_.dtype, k_host_.shape},
                                  {v_.handle(), 0, v_host_.dtype, v_host_.shape},
                                  {o_.handle(), 0, DType::f32, {nq, h.heads_q, h.value_dim()}},
                                  {lse_.handle(), 0, DType::f32, {nq, h.heads_q}},
                                  variants_};
    vk_.CmdWriteTimestamp(f.commands, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, queries_, f.first_query);
    for (int layer = 0; layer < layers; ++layer) workspace_.record(f.commands, tensors);
    vk_.CmdWriteTimestamp(f.commands, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, queries_, f.first_query + 1);
    check(vk_.EndCommandBuffer(f.commands), "vkEndCommandBuffer");

    VkSubmitInfo submit{VK_STRUCTURE_TYPE_SUBMIT_INFO};
    submit.commandBufferCount = 1;
    submit.pCommandBuffers = &f.commands;
    check(vk_.ResetFences(device_, 1, &f.done), "vkResetFences");
    check(vk_.QueueSubmit(context_.queue(), 1, &submit, f.done), "vkQueueSubmit");
    f.in_flight = true;
    pending_.push_back(next_);
    next_ = 1 - next_;
    o_shape_ = tensors.o.shape;
    lse_shape_ = tensors.lse.shape;
    return times;
  }

  // This process's use of the device-local heaps where the device reports it
  // (VK_EXT_memory_budget: treeattn's workspace included), else the bytes of
  // the runner's own buffers.
  MemoryUse device_memory() const override {
    if (memory_budget_) {
      VkPhysicalDeviceMemoryBudgetPropertiesEXT budget{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_BUDGET_PROPERTIES_EXT};
      VkPhysicalDeviceMemoryProperties2 properties{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_PROPERTIES_2, &budget};
      vk_.GetPhysicalDeviceMemoryProperties2(context_.physical_device(), &properties);
      std::int64_t used = 0;
      for (std::uint32_t h = 0; h < properties.memoryProperties.memoryHeapCount; ++h) {
        if (properties.memoryProperties.memoryHeaps[h].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) {
          used += std::int64_t(budget.heapUsage[h]);
        }
      }
      return {used, "VK_EXT_memory_budget (this process's device-local heap usage)"};
    }
    std::size_t bytes = 0;
    for (const Buffer* b : {&k_, &v_, &q_, &o_, &lse_, &readback_}) bytes += b->bytes();
    for (const Frame& f : frames_) {
      bytes += f.staging.bytes();
      for (const Buffer& b : f.retired) bytes += b.bytes();
    }
    return {std::int64_t(bytes), "the runner's own buffers (treeattn's workspace not counted)"};
  }

  std::vector<double> finished(bool wait) override {
    harvest(wait);
    return std::exchange(done_, {});
  }

  void outputs(HostArray& o, HostArray& lse) override {
    harvest(true);
    o = HostArray(DType::f32, o_shape_);
    lse = HostArray(DType::f32, lse_shape_);
    const std::size_t lse_at = align16(o.bytes.size());
    submit_once([&](VkCommandBuffer commands) {
      memory_barrier(vk_, commands, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_WRITE_BIT,
                     VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_READ_BIT);
      const VkBufferCopy o_region{0, 0, o.bytes.size()};
      const VkBufferCopy lse_region{0, lse_at, lse.bytes.size()};
      vk_.CmdCopyBuffer(commands, o_.handle(), readback_.handle(), 1, &o_region);
      vk_.CmdCopyBuffer(commands, lse_.handle(), readback_.handle(), 1, &lse_region);
    });
    std::memcpy(o.bytes.data(), readback_.mapped(), o.bytes.size());
    std::memcpy(lse.bytes.data(), readback_.mapped() + lse_at, lse.bytes.size());
  }

 private:
  // A step's command buffer, its staging memory (filled from the start of the
  // step), its fence and its pair of timestamps.
  struct Frame {
    VkCommandBuffer commands = VK_NULL_HANDLE;
    VkFence done = VK_NULL_HANDLE;
    std::uint32_t first_query = 0;
    Buffer staging;
    std::vector<Buffer> retired;  // staging it outgrew during the step: recorded copies still read it
    std::size_t staged = 0;       // bytes of staging the step has taken
    bool in_flight = false;
  };

  // The device buffers, command buffers, fences and timestamps; the KV pool
  // and the variants' tensors copied up.
  void allocate(const HeadConfig& heads, std::int64_t max_queries, const AttentionOptions& variants) {
    read_device_properties();
    const std::size_t q_bytes = std::size_t(max_queries * heads.heads_q * heads.head_dim) * 2;  // f16
    const std::size_t o_bytes = std::size_t(max_queries * heads.heads_q * heads.value_dim()) * 4;  // f32
    const std::size_t lse_bytes = std::size_t(max_queries * heads.heads_q) * 4;
    k_ = device_buffer(k_host_.bytes.size(), false, "K pool");
    v_ = device_buffer(v_host_.bytes.size(), false, "V pool");
    q_ = device_buffer(q_bytes, false, "Q");
    o_ = device_buffer(o_bytes, false, "O");
    lse_ = device_buffer(lse_bytes, false, "LSE");
    readback_ = device_buffer(align16(o_bytes) + lse_bytes, true, "O and LSE readback");

    VkCommandPoolCreateInfo pool_info{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
    pool_info.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
    pool_info.queueFamilyIndex = context_.queue_family();
    check(vk_.CreateCommandPool(device_, &pool_info, nullptr, &pool_), "vkCreateCommandPool");
    VkCommandBuffer buffers[3] = {};
    VkCommandBufferAllocateInfo allocate{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
    allocate.commandPool = pool_;
    allocate.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    allocate.commandBufferCount = 3;
    check(vk_.AllocateCommandBuffers(device_, &allocate, buffers), "vkAllocateCommandBuffers");
    frames_[0].commands = buffers[0];
    frames_[1].commands = buffers[1];
    once_ = buffers[2];
    VkFenceCreateInfo fence_info{VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    for (Frame& f : frames_) check(vk_.CreateFence(device_, &fence_info, nullptr, &f.done), "vkCreateFence");
    check(vk_.CreateFence(device_, &fence_info, nullptr, &once_done_), "vkCreateFence");
    VkQueryPoolCreateInfo query_info{VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO};
    query_info.queryType = VK_QUERY_TYPE_TIMESTAMP;
    query_info.queryCount = 4;  // each frame's start and stop
    check(vk_.CreateQueryPool(device_, &query_info, nullptr, &queries_), "vkCreateQueryPool");
    frames_[1].first_query = 2;
    upload(k_, k_host_.bytes.data(), k_host_.bytes.size(), "K pool");
    upload(v_, v_host_.bytes.data(), v_host_.bytes.size(), "V pool");
    variants_.logit_softcap = variants.logit_softcap;
    variants_.k_scale = variants.k_scale;
    variants_.v_scale = variants.v_scale;
    for (auto [name, from, to] : {std::tuple{"sinks", &variants.sinks, &variants_.sinks},
                                  {"k_scales", &variants.k_scales, &variants_.k_scales},
                                  {"v_scales", &variants.v_scales, &variants_.v_scales}}) {
      if (from->data == nullptr) continue;
      Buffer& copy = option_tensors_.emplace_back(device_buffer(from->bytes(), false, name));
      upload(copy, from->data, from->bytes(), name);
      *to = vulkan::Tensor{copy.handle(), 0, from->dtype, from->shape};
    }
  }

  // The Vulkan objects the runner made itself, once the GPU is done with them.
  void release() noexcept {
    vk_.DeviceWaitIdle(device_);
    if (queries_ != VK_NULL_HANDLE) vk_.DestroyQueryPool(device_, queries_, nullptr);
    for (Frame& f : frames_) {
      if (f.done != VK_NULL_HANDLE) vk_.DestroyFence(device_, f.done, nullptr);
    }
    if (once_done_ != VK_NULL_HANDLE) vk_.DestroyFence(device_, once_done_, nullptr);
    if (pool_ != VK_NULL_HANDLE) vk_.DestroyCommandPool(device_, pool_, nullptr);  // frees the command buffers
  }

  void read_device_properties() {
    VkPhysicalDeviceProperties properties{};
    vk_.GetPhysicalDeviceProperties(context_.physical_device(), &properties);
    std::uint32_t count = 0;
    vk_.GetPhysicalDeviceQueueFamilyProperties(context_.physical_device(), &count, nullptr);
    std::vector<VkQueueFamilyProperties> families(count);
    vk_.GetPhysicalDeviceQueueFamilyProperties(context_.physical_device(), &count, families.data());
    const std::uint32_t valid_bits = families.at(context_.queue_family()).timestampValidBits;
    if (valid_bits == 0) {
      throw Error(ErrorCategory::Backend, fmt::format("demo: Vulkan device {} has no timestamps on queue family {}",
                                                      properties.deviceName, context_.queue_family()));
    }
    timestamp_ns_ = double(properties.limits.timestampPeriod);
    timestamp_mask_ = valid_bits >= 64 ? ~std::uint64_t(0) : (std::uint64_t(1) << valid_bits) - 1;
    vk_.GetPhysicalDeviceMemoryProperties(context_.physical_device(), &memory_);
    std::uint32_t extensions = 0;
    check(vk_.EnumerateDeviceExtensionProperties(context_.physical_device(), nullptr, &extensions, nullptr),
          "vkEnumerateDeviceExtensionProperties");
    std::vector<VkExtensionProperties> names(extensions);
    check(vk_.EnumerateDeviceExtensionProperties(context_.physical_device(), nullptr, &extensions, names.data()),
          "vkEnumerateDeviceExtensionProperties");
    for (const VkExtensionProperties& e : names) {
      memory_budget_ = memory_budget_ || std::string(e.extensionName) == VK_EXT_MEMORY_BUDGET_EXTENSION_NAME;
    }
  }

  Buffer device_buffer(std::size_t bytes, bool host_visible, const char* what) {
    return Buffer(vk_, device_, memory_, bytes, host_visible, what);
  }

  // Records commands into the spare command buffer.
  template <typename Record>
  void record_once(Record&& record) {
    check(vk_.ResetCommandBuffer(once_, 0), "vkResetCommandBuffer");
    VkCommandBufferBeginInfo begin{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
    begin.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
    check(vk_.BeginCommandBuffer(once_, &begin), "vkBeginCommandBuffer");
    record(once_);
    check(vk_.EndCommandBuffer(once_), "vkEndCommandBuffer");
  }

  // Records commands into the spare command buffer, submits them and waits.
  template <typename Record>
  void submit_once(Record&& record) {
    record_once(std::forward<Record>(record));
    VkSubmitInfo submit{VK_STRUCTURE_TYPE_SUBMIT_INFO};
    submit.commandBufferCount = 1;
    submit.pCommandBuffers = &once_;
    check(vk_.ResetFences(device_, 1, &once_done_), "vkResetFences");
    check(vk_.QueueSubmit(context_.queue(), 1, &submit, once_done_), "vkQueueSubmit");
    check(vk_.WaitForFences(device_, 1, &once_done_, VK_TRUE, UINT64_MAX), "vkWaitForFences");
  }

  // `size` bytes of host memory copied into `buffer` through staging of at most 64 MiB at a time.
  void upload(Buffer& buffer, const void* host, std::size_t size, const char* what) {
    const std::size_t chunk = std::min<std::size_t>(size, std::size_t(64) << 20);
    if (chunk == 0) return;
    Buffer staging = device_buffer(chunk, true, what);
    for (std::size_t at = 0; at < size; at += chunk) {
      const std::size_t bytes = std::min(chunk, size - at);
      std::memcpy(staging.mapped(), static_cast<const unsigned char*>(host) + at, bytes);
      submit_once([&](VkCommandBuffer commands) {
        const VkBufferCopy region{0, at, bytes};
        vk_.CmdCopyBuffer(commands, staging.handle(), buffer.handle(), 1, &region);
      });
    }
  }

  // The frame of the next step, recording: it waits for the step two back,
  // collects its time and opens the recording with a barrier (earlier steps'
  // reads and writes before this one's copies).
  Frame& begin_frame() {
    Frame& f = frames_[next_];
    if (f.in_flight) {
      check(vk_.WaitForFences(device_, 1, &f.done, VK_TRUE, UINT64_MAX), "vkWaitForFences");
      harvest(false);
    }
    f.retired.clear();
    f.staged = 0;
    check(vk_.ResetCommandBuffer(f.commands, 0), "vkResetCommandBuffer");
    VkCommandBufferBeginInfo begin{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
    begin.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
    check(vk_.BeginCommandBuffer(f.commands, &begin), "vkBeginCommandBuffer");
    vk_.CmdResetQueryPool(f.commands, queries_, f.first_query, 2);
    memory_barrier(vk_, f.commands, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                   VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT, VK_PIPELINE_STAGE_TRANSFER_BIT,
                   VK_ACCESS_TRANSFER_WRITE_BIT);
    return f;
  }

  // The rows written since the last step, staged and their copies recorded
  // (consecutive slots, a page's tokens, in one region per pool).
  void stage_written_rows(Frame& f) {
    if (written_.empty()) return;
    std::sort(written_.begin(), written_.end());
    std::size_t offset = stage(f, 2 * row_bytes_ * written_.size());
    k_regions_.clear();
    v_regions_.clear();
    for (std::size_t a = 0; a < written_.size();) {
      std::size_t b = a + 1;
      while (b < written_.size() && written_[b] == written_[b - 1] + 1) ++b;
      const std::size_t first = std::size_t(written_[a]) * row_bytes_, bytes = row_bytes_ * (b - a);
      std::memcpy(f.staging.mapped() + offset, k_host_.bytes.data() + first, bytes);
      std::memcpy(f.staging.mapped() + offset + bytes, v_host_.bytes.data() + first, bytes);
      k_regions_.push_back({offset, first, bytes});
      v_regions_.push_back({offset + bytes, first, bytes});
      offset += 2 * bytes;
      a = b;
    }
    vk_.CmdCopyBuffer(f.commands, f.staging.handle(), k_.handle(), std::uint32_t(k_regions_.size()), k_regions_.data());
    vk_.CmdCopyBuffer(f.commands, f.staging.handle(), v_.handle(), std::uint32_t(v_regions_.size()), v_regions_.data());
    written_.clear();
  }

  // `bytes` more of the frame's staging memory (16-byte aligned): its offset.
  std::size_t stage(Frame& f, std::size_t bytes) {
    const std::size_t at = align16(f.staged);
    if (at + bytes > f.staging.bytes()) {
      Buffer larger = device_buffer(std::max({at + bytes, 2 * f.staging.bytes(), reserved_staging_}), true, "staging");
      if (f.staged > 0) f.retired.push_back(std::move(f.staging));
      f.staging = std::move(larger);
    }
    f.staged = at + bytes;
    return at;
  }

  // Collects the GPU time of the submitted steps that are done (all of them
  // with `wait`), oldest first.
  void harvest(bool wait) {
    while (!pending_.empty()) {
      Frame& f = frames_[pending_.front()];
      if (wait) {
        check(vk_.WaitForFences(device_, 1, &f.done, VK_TRUE, UINT64_MAX), "vkWaitForFences");
      } else {
        const VkResult status = vk_.GetFenceStatus(device_, f.done);
        if (status == VK_NOT_READY) break;
        check(status, "vkGetFenceStatus");
      }
      std::uint64_t ticks[2] = {};
      check(vk_.GetQueryPoolResults(device_, queries_, f.first_query, 2, sizeof ticks, ticks, sizeof ticks[0],
                                    VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT),
            "vkGetQueryPoolResults");
      done_.push_back(double((ticks[1] - ticks[0]) & timestamp_mask_) * timestamp_ns_ / 1e3);
      f.in_flight = false;
      pending_.pop_front();
    }
  }

  // Declared in the order of their dependencies: destroyed in reverse.
  vulkan::Context context_;
  VulkanFunctions vk_;
  VkDevice device_ = VK_NULL_HANDLE;
  VkPhysicalDeviceMemoryProperties memory_{};
  bool memory_budget_ = false;  // the device reports its heaps' usage (VK_EXT_memory_budget)
  double timestamp_ns_ = 1.0;
  std::uint64_t timestamp_mask_ = ~std::uint64_t(0);
  HostArray &k_host_, &v_host_;
  std::size_t row_bytes_;
  std::size_t reserved_staging_ = 0;  // a frame's staging for the largest step reserved ahead
  Buffer k_, v_, q_, o_, lse_, readback_;
  vulkan::AttentionOptions variants_;  // the calls' attention variants, their tensors in option_tensors_
  std::deque<Buffer> option_tensors_;
  vulkan::Workspace workspace_;
  VkCommandPool pool_ = VK_NULL_HANDLE;
  VkCommandBuffer once_ = VK_NULL_HANDLE;  // the initial KV upload, the reserved plans and the outputs' readback
  VkFence once_done_ = VK_NULL_HANDLE;
  VkQueryPool queries_ = VK_NULL_HANDLE;
  Frame frames_[2];
  int next_ = 0;               // the frame of the next step
  std::deque<int> pending_;    // frames submitted, oldest first
  std::vector<double> done_;   // GPU microseconds of steps collected, not yet reported
  std::vector<std::int64_t> written_;  // slots whose rows the next step copies up
  std::vector<VkBufferCopy> k_regions_, v_regions_;
  std::vector<std::int64_t> o_shape_, lse_shape_;
};

}  // namespace

std::unique_ptr<StepRunner> make_vulkan_step_runner(const BackendOptions& options, const HeadConfig& heads, HostArray& k,
                                                    HostArray& v, std::int64_t max_queries, const AttentionOptions& variants) {
  return std::make_unique<VulkanRunner>(options, heads, k, v, max_queries, variants);
}

}  // namespace treeattn::cli
