#include "spirv_bf16.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <set>

#include "treeattn/error.hpp"

namespace treeattn::vulkan {
namespace {

// The few SPIR-V opcodes and enums this needs (SPIR-V 1.6 and SPV_KHR_bfloat16).
constexpr std::uint32_t kMagic = 0x07230203;
constexpr std::uint32_t kHeaderWords = 5;
enum Op : std::uint32_t {
  OpUndef = 1, OpExtension = 10, OpCapability = 17, OpTypeFloat = 22, OpConstantTrue = 41, OpSpecConstantOp = 52,
  OpFunction = 54, OpFunctionParameter = 55, OpFunctionEnd = 56, OpFunctionCall = 57, OpVariable = 59, OpLoad = 61,
  OpStore = 62, OpCopyMemory = 63, OpAccessChain = 65, OpInBoundsAccessChain = 66, OpPtrAccessChain = 67,
  OpVectorExtractDynamic = 77, OpVectorInsertDynamic = 78, OpVectorShuffle = 79, OpCompositeConstruct = 80,
  OpCompositeExtract = 81, OpCompositeInsert = 82, OpCopyObject = 83, OpConvertFToU = 109, OpBitcast = 124,
  OpSelect = 169, OpPhi = 245, OpReturnValue = 254, OpCopyLogical = 400, OpTypeCooperativeMatrixKHR = 4456,
  OpCooperativeMatrixLoadKHR = 4457, OpCooperativeMatrixStoreKHR = 4458, OpCooperativeMatrixMulAddKHR = 4459,
  OpCooperativeMatrixLengthKHR = 4460,
};
constexpr std::uint32_t kCapabilityBFloat16Type = 5116;
constexpr std::uint32_t kCapabilityBFloat16CooperativeMatrix = 5118;
constexpr std::uint32_t kEncodingBFloat16 = 0;

bool is_type(std::uint32_t op) { return (op >= 19 && op <= 39) || op == OpTypeCooperativeMatrixKHR; }

// What SPV_KHR_bfloat16 lets a bfloat16 value meet: memory, function,
// conversion and composite instructions, select, phi and the cooperative-matrix
// ones (its Dot needs a capability this does not declare).
bool bf16_allowed(std::uint32_t op) {
  switch (op) {
    case OpUndef: case OpFunctionParameter: case OpFunctionCall: case OpVariable: case OpLoad: case OpStore:
    case OpCopyMemory: case OpAccessChain: case OpInBoundsAccessChain: case OpPtrAccessChain:
    case OpVectorExtractDynamic: case OpVectorInsertDynamic: case OpVectorShuffle: case OpCompositeConstruct:
    case OpCompositeExtract: case OpCompositeInsert: case OpCopyObject: case OpCopyLogical: case OpSelect:
    case OpPhi: case OpReturnValue: case OpCooperativeMatrixLoadKHR: case OpCooperativeMatrixStoreKHR:
    case OpCooperativeMatrixMulAddKHR: case OpCooperativeMatrixLengthKHR:
      return true;
    default:
      return (op >= OpConvertFToU && op <= OpBitcast);  // the conversion instructions
  }
}

// A module's instructions as (offset, word count, opcode).
struct Instruction {
  std::size_t at;
  std::uint32_t words, op;
};

std::vector<Instruction> instructions(const std::uint32_t* words, std::size_t count) {
  std::vector<Instruction> out;
  for (std::size_t at = kHeaderWords; at < count;) {
    const std::uint32_t n = words[at] >> 16, op = words[at] & 0xffffu;
    if (n == 0 || at + n > count) {
      throw Error(ErrorCategory::Backend, fmt::format("SPIR-V: malformed instruction at word {}", at));
    }
    out.push_back({at, n, op});
    at += n;
  }
  return out;
}

std::vector<std::uint32_t> string_operand(const char* text) {
  std::vector<std::uint32_t> out((std::strlen(text) + 4) / 4, 0u);  // nul-terminated, zero-padded
  std::memcpy(out.data(), text, std::strlen(text));
  return out;
}

}  // namespace

std::vector<std::uint32_t> retype_f16_as_bf16(const std::uint32_t* words, std::size_t count) {
  if (count < kHeaderWords || words[0] != kMagic) throw Error(ErrorCategory::Backend, "SPIR-V: not a SPIR-V module");
  const std::vector<Instruction> list = instructions(words, count);

  // The 16-bit float type, and every type and value built on it.
  std::set<std::uint32_t> types, values;
  for (const Instruction& i : list) {
    if (i.op == OpTypeFloat && words[i.at + 2] == 16) {
      if (i.words != 3) throw Error(ErrorCategory::Backend, "SPIR-V: the 16-bit float type already has an encoding");
      types.insert(words[i.at + 1]);
    }
  }
  if (types.size() != 1) {
    throw Error(ErrorCategory::Backend, fmt::format("SPIR-V: {} 16-bit float types (one expected)", types.size()));
  }
  for (const Instruction& i : list) {
    const std::uint32_t* w = words + i.at;
    if (is_type(i.op)) {
      if (std::any_of(w + 2, w + i.words, [&](std::uint32_t id) { return types.count(id) != 0; })) types.insert(w[1]);
      continue;
    }
    if (i.words < 3 || types.count(w[1]) == 0) continue;
    // A value of a 16-bit float type: a constant's bits would mean another number.
    if ((i.op >= OpConstantTrue && i.op <= OpSpecConstantOp) || !bf16_allowed(i.op)) {
      throw Error(ErrorCategory::Backend, fmt::format("SPIR-V: opcode {} makes a 16-bit float value, which a "
                                                      "bfloat16 one cannot be", i.op));
    }
    values.insert(w[2]);
  }
  // Inside functions, the values may only meet the instructions above.
  bool in_function = false;
  for (const Instruction& i : list) {
    if (i.op == OpFunction) in_function = true;
    if (i.op == OpFunctionEnd) in_function = false;
    if (!in_function || bf16_allowed(i.op) || i.op == OpFunction) continue;
    const std::uint32_t* w = words + i.at;
    if (std::any_of(w + 1, w + i.words, [&](std::uint32_t id) { return values.count(id) != 0; })) {
      throw Error(ErrorCategory::Backend, fmt::format("SPIR-V: opcode {} takes a 16-bit float value, which a "
                                                      "bfloat16 one cannot be", i.op));
    }
  }

  // Rewrite: the capabilities after the module's own, the extension after its
  // extensions (the order SPIR-V's logical layout requires), the type retyped.
  std::vector<std::uint32_t> out(words, words + kHeaderWords);
  std::size_t last_capability = 0, last_extension = 0;
  for (std::size_t n = 0; n < list.size(); ++n) {
    if (list[n].op == OpCapability) last_capability = n;
    if (list[n].op == OpExtension) last_extension = n;
  }
  const std::size_t extension_after = std::max(last_capability, last_extension);
  for (std::size_t n = 0; n < list.size(); ++n) {
    const Instruction& i = list[n];
    const std::uint32_t* w = words + i.at;
    if (i.op == OpTypeFloat && types.count(w[1]) != 0 && w[2] == 16) {
      out.insert(out.end(), {(4u << 16) | OpTypeFloat, w[1], 16u, kEncodingBFloat16});
    } else {
      out.insert(out.end(), w, w + i.words);
    }
    if (n == last_capability) {
      for (std::uint32_t capability : {kCapabilityBFloat16Type, kCapabilityBFloat16CooperativeMatrix}) {
        out.insert(out.end(), {(2u << 16) | OpCapability, capability});
      }
    }
    if (n == extension_after) {
      const std::vector<std::uint32_t> name = string_operand("SPV_KHR_bfloat16");
      out.push_back(std::uint32_t(1 + name.size()) << 16 | OpExtension);
      out.insert(out.end(), name.begin(), name.end());
    }
  }
  return out;
}

}  // namespace treeattn::vulkan
