#include "attention_flags.hpp"

#include <fmt/format.h>

#include "cli_support.hpp"
#include "treeattn/error.hpp"
#include "treeattn/npy.hpp"

namespace treeattn::cli {

void AttentionFlags::add_to(CLI::App& sub, const char* kv_dtype_help) {
  sub.add_option("--kv-dtype", kv_dtype, kv_dtype_help)->check(CLI::IsMember({"fp8_e4m3", "fp8_e5m2"}));
  sub.add_option("--softcap", softcap, "Logit soft-cap: s = cap * tanh(s / cap) on the scaled scores (Gemma 2; 0: off)")
      ->check(nonnegative());
  sub.add_option("--sinks", sinks_path,
                 "A .npy of one sink logit per query head ([heads_q] <f4): it joins each softmax's denominator and "
                 "the LSE, with no value (gpt-oss)")
      ->check(CLI::ExistingFile);
}

std::optional<DType> AttentionFlags::fp8() const {
  if (kv_dtype.empty()) return std::nullopt;
  return kv_dtype == "fp8_e4m3" ? DType::fp8_e4m3 : DType::fp8_e5m2;
}

PlanOptions AttentionFlags::planned_for(PlanOptions plan) const {
  if (const std::optional<DType> kind = fp8()) plan.kv_dtype = *kind;
  return plan;
}

HostArray AttentionFlags::read_sinks() const {
  if (sinks_path.empty()) return HostArray{};
  try {
    return read_npy(sinks_path);
  } catch (const Error& e) {  // the reader names the file; say which flag gave it and what it takes
    throw Error(e.category(), fmt::format("--sinks takes one <f4 sink logit per query head: {}", e.what()));
  }
}

AttentionOptions AttentionFlags::options(HostArray& sinks) const {
  AttentionOptions o;
  o.logit_softcap = softcap;
  if (!sinks.bytes.empty()) o.sinks = sinks.view();
  return o;
}

std::string AttentionFlags::describe() const {
  std::string text = kv_dtype.empty() ? "" : kv_dtype + " K/V";
  const auto add = [&](const std::string& part) { text += (text.empty() ? "" : ", ") + part; };
  if (softcap != 0.0f) add(fmt::format("soft-cap {}", softcap));
  if (!sinks_path.empty()) add("sinks");
  return text;
}

}  // namespace treeattn::cli
