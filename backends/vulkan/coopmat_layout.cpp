#include "coopmat_layout.hpp"

#include <cstring>
#include <vector>

#include "shaders.hpp"
#include "vk_buffer.hpp"
#include "vk_pipeline.hpp"
#include "vk_sequence.hpp"

namespace treeattn::vulkan {

bool coopmat_fragment_layout(const Device& device) {
#ifdef TREEATTN_HAVE_VK_COOPMAT
  constexpr int kLanes = 32, kElements = 8, kWords = kLanes * kElements * 2 + 2;
  Buffer out(device, kWords * sizeof(float), Buffer::Kind::device_local);
  Buffer readback(device, kWords * sizeof(float), Buffer::Kind::staging);
  ComputePipeline probe(device, VK_NULL_HANDLE, SpirvModule{spirv::coopmat_layout, spirv::coopmat_layout_words}, {},
                        sizeof(VkDeviceAddress), kLanes);
  const VkDeviceAddress address = out.address();
  CommandSequence sequence(device);
  sequence.begin();
  sequence.fill(out, 0xffffffffu);  // NaN where the probe writes nothing
  sequence.barrier();
  sequence.dispatch(probe, &address, sizeof(address), 1);
  sequence.barrier();
  sequence.copy(out, readback, out.bytes());
  sequence.end();
  sequence.submit_and_wait();
  std::vector<float> words(kWords);
  std::memcpy(words.data(), readback.mapped(), words.size() * sizeof(float));
  if (words[kLanes * kElements * 2] != kElements || words[kLanes * kElements * 2 + 1] != kElements) return false;
  for (int lane = 0; lane < kLanes; ++lane) {
    for (int i = 0; i < kElements; ++i) {
      const float expected = float(fragment_row(lane, i) * 16 + fragment_column(lane, i));
      const float* accumulator_and_a = &words[(lane * kElements + i) * 2];
      if (accumulator_and_a[0] != expected || accumulator_and_a[1] != expected) return false;
    }
  }
  return true;
#else
  (void)device;
  return false;
#endif
}

}  // namespace treeattn::vulkan
