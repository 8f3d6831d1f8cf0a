#pragma once
// Whether a device's cooperative matrices keep their elements where mma.sync's
// m16n8k16 fragments do, which tree_attn_coopmat_fragments.comp relies on to
// run the softmax in registers. The Vulkan spec leaves the layout to the
// implementation, so it is probed on the device (shaders/coopmat_layout.comp).

#include "vk_device.hpp"

namespace treeattn::vulkan {

// Element i of lane `lane`'s 16x16 accumulator and A matrix (subgroups of 32)
// sits at row lane / 4 + 8 (i / 4), column 8 ((i / 2) % 2) + 2 (lane % 4) + i % 2.
constexpr int fragment_row(int lane, int i) { return lane / 4 + 8 * (i / 4); }
constexpr int fragment_column(int lane, int i) { return 8 * ((i / 2) % 2) + 2 * (lane % 4) + i % 2; }

// Runs the probe once on `device` (which must support the coopmat variant's
// 16x16x16 f16 shape with subgroups of 32). False when the layout differs, or
// when this build has no cooperative-matrix shaders.
bool coopmat_fragment_layout(const Device& device);

}  // namespace treeattn::vulkan
