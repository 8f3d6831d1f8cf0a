// The Vulkan backend: the conformance suite (test_conformance.cpp) once per
// shader variant this device runs (scalar everywhere, coopmat where the device
// and the build have it, and coopmat-shared too where coopmat runs the
// fragments shader), plus what is particular to Vulkan. The Khronos
// validation layer is on (ctest sets TREEATTN_VK_VALIDATION=1, which
// harness_options() passes on) and any message it reports fails the program. Without a Vulkan device the program says so and
// exits 77, which ctest reports as skipped.

#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include <unistd.h>

#include "../backends/vulkan/context_state.hpp"
#include "../backends/vulkan/coopmat_layout.hpp"
#include "../backends/vulkan/shaders.hpp"
#include "../backends/vulkan/spirv_bf16.hpp"
#include "../backends/vulkan/vk_device.hpp"
#include "../backends/vulkan/vk_pipeline.hpp"
#include "../backends/vulkan/vk_plan.hpp"
#include "../backends/vulkan/vulkan_backend.hpp"
#include "lowering.hpp"
#include "support/conformance.hpp"
#include "support/harness_options.hpp"
#include "support/oracle.hpp"
#include "support/plan_check.hpp"
#include "treeattn/error.hpp"
#include "treeattn/planner.hpp"
#include "treeattn/workloads.hpp"

using namespace treeattn;
using namespace treeattn::test;

namespace {
std::string g_variant = "scalar";  // the variant this pass of the suite forces

BackendOptions variant_options(const std::string& variant) {
  BackendOptions options = harness_options();
  options.vk_variant = variant;
  return options;
}
}  // namespace

std::unique_ptr<Backend> treeattn::test::make_test_backend() {
  return make_backend(BackendKind::vulkan, variant_options(g_variant));
}

TEST_CASE("f32 inputs are refused by name") {
  auto backend = make_test_backend();
  Tree tree({4, 2, 64});
  tree.add_node_range(0, kNoParent, 0, 100);
  tree.add_query(0);
  Inputs f32 = make_inputs(tree, DType::f32, 1);
  CHECK_THROWS_WITH_AS(run_backend(*backend, tree, f32, PlanOptions{}), doctest::Contains("must be f16 or bf16"), Error);
}

TEST_CASE("strided K and V rows (some heads of a wider pool) are refused by name") {
  auto backend = make_test_backend();
  Tree tree({2, 1, 64});
  tree.add_node_range(0, kNoParent, 0, 100);
  tree.add_query(0);
  Inputs in = make_inputs(tree, DType::f16, 1);
  HostArray pool = random_array(DType::f16, {100, 2, 64}, 2);  // two KV heads; the tree reads the first
  HostArray o(DType::f32, {1, 2, 64});
  const TensorRef k{pool.bytes.data(), DType::f16, {100, 1, 64}, 2 * 64};
  CHECK_THROWS_WITH_AS(backend->run(treeattn::plan(tree), AttentionArgs{in.q.view(), k, in.v.view(), o.view(), {}}),
                       doctest::Contains("Vulkan backend: Q, K, V and O must be dense (got Q [1, 2, 64] f16, K [100, 1, 64] "
                                         "f16 row stride 128"),
                       Error);
}

TEST_CASE("a device index that does not exist and an unknown variant are refused") {
  BackendOptions options;
  options.device = 99;
  CHECK_THROWS_WITH_AS(make_backend(BackendKind::vulkan, options), doctest::Contains("Vulkan device 99 does not exist"), Error);
  auto backend = make_backend(BackendKind::vulkan, variant_options("fastest"));
  Tree tree({4, 2, 64});
  tree.add_node_range(0, kNoParent, 0, 10);
  tree.add_query(0);
  Inputs in = make_inputs(tree, DType::f16, 1);
  CHECK_THROWS_WITH_AS(run_backend(*backend, tree, in, PlanOptions{}), doctest::Contains("unknown Vulkan variant 'fastest'"), Error);
}

TEST_CASE("the device list names every device and the variant it would run") {
  const std::vector<VulkanDeviceReport> devices = vulkan_devices();
  REQUIRE(!devices.empty());
  int selected = 0;
  for (const VulkanDeviceReport& d : devices) {
    CHECK(!d.name.empty());
    CHECK(d.subgroup_size > 0);
    CHECK(d.shared_memory_bytes > 0);
    CHECK((d.variant_f16.rfind("scalar", 0) == 0 || d.variant_f16.rfind("coopmat", 0) == 0 ||
           d.variant_f16.rfind("none", 0) == 0));
    if (d.variant_f16.rfind("none", 0) != 0) CHECK(!d.cost_model_source.empty());
    selected += d.selected;
  }
  CHECK(selected == 1);
}

TEST_CASE("the device's cost model: the H100 fit on a CPU device and an H100, calibrated once per process elsewhere") {
  const vulkan::Context first;
  const CostModel model = first.cost_model();
  CAPTURE(model.source);
  const vulkan::DeviceCaps& caps = state_of(first).device->caps();
  if (caps.type == VK_PHYSICAL_DEVICE_TYPE_CPU) {
    CHECK(model.source.rfind("cpu device: h100-vulkan", 0) == 0);
    CHECK(model.to_string() == cost_model_for("h100-vulkan").to_string());  // the same plans on every machine
  } else {
    CHECK((model.source.rfind("h100-vulkan (fitted", 0) == 0 || model.source.rfind("calibrated on " + caps.name, 0) == 0));
  }
  // A second context on the device takes the model kept in this process.
  const CostModel again = vulkan::Context().cost_model();
  CHECK(again.to_string() == model.to_string());
  CHECK(again.source == model.source);
}

TEST_CASE("a KV pool larger than one storage-buffer binding, split into several buffers") {
  // 300 000 slots x 2 KV heads x 128 dims x 2 bytes = 154 MB per pool: more than
  // lavapipe's 128 MiB maxStorageBufferRange. Read through device addresses, once
  // in one buffer and once split into 16 MiB buffers (the chunk table).
  Tree tree({8, 2, 128});
  tree.add_node_range(0, kNoParent, 0, 120);
  tree.add_node_range(1, 0, 150'000, 90);
  tree.add_node_range(2, 0, 299'800, 200);
  tree.add_node_range(3, 1, 70'000, 30);
  for (std::int64_t node : {1, 2, 3}) tree.add_query(node);
  const std::int64_t slots = 300'000;
  Inputs in{random_array(DType::f16, {3, 8, 128}, 5), random_array(DType::f16, {slots, 2, 128}, 6),
            random_array(DType::f16, {slots, 2, 128}, 7)};
  const OracleResult expected = oracle_attention(tree, in.q.view(), in.k.view(), in.v.view());
  for (std::size_t chunk_bytes : {std::size_t(0), std::size_t(16) << 20}) {
    CAPTURE(chunk_bytes);
    BackendOptions options = variant_options(g_variant);
    options.vk_max_chunk_bytes = chunk_bytes;
    auto backend = make_backend(BackendKind::vulkan, options);
    Outputs out = run_backend(*backend, tree, in, PlanOptions{});
    CHECK(max_abs_error(out.o.view(), expected.o) <= tolerance(DType::f16));
    CHECK(max_abs_error(out.lse.view(), expected.lse) <= tolerance(DType::f16));
  }
}

TEST_CASE("the variants through a KV pool split into several buffers: fp8 K and V of 192 and 128 columns, sinks, soft-cap") {
  // K rows of 2 x 192 fp8 bytes and V rows of 2 x 128: 4 KiB buffers hold 10
  // slots of K, and the chunk table, the options after it and K's and V's own
  // row sizes are all read.
  Tree tree({8, 2, 192, 0.0f, 128});
  tree.add_node_range(0, kNoParent, 0, 70);
  tree.add_node_range(1, 0, 70, 45);
  tree.add_node_range(2, 0, 115, 33);
  for (std::int64_t node : {1, 2}) tree.add_query(node);
  tree.add_query(0, 20);
  Variant variant;
  for (const Variant& v : all_variants()) {
    if (std::string(v.name) == "fp8_e4m3 + sinks + soft-cap 30") variant = v;
  }
  REQUIRE(variant.sinks);
  Inputs in = make_variant_inputs(tree, variant, 12);
  BackendOptions options = variant_options(g_variant);
  options.vk_max_chunk_bytes = 4096;
  auto backend = make_backend(BackendKind::vulkan, options);
  check_inputs_against_oracle(*backend, tree, in, tolerance(DType::f16), 16);
}

TEST_CASE("fp8 blocks ending around every chunk size, at each head dim, against the oracle") {
  // fp8 rows arrive 16 elements a load (4 to 16 loads a row, 6 and 12 where a
  // row's loads do not divide the work group) and are decoded on their way into
  // shared memory: blocks that end just before, on and just past 16, 32 and 64
  // tokens see exactly their tokens, on every shader variant.
  auto backend = make_test_backend();
  for (const HeadConfig heads : {HeadConfig{8, 2, 128, 0.0f}, HeadConfig{4, 2, 64, 0.0f}, HeadConfig{4, 2, 256, 0.0f},
                                 HeadConfig{4, 2, 96, 0.0f}, HeadConfig{4, 2, 192, 0.0f, 128}}) {
    const std::string heads_name = describe(heads);
    CAPTURE(heads_name);
    Tree tree(heads);
    tree.add_node_range(0, kNoParent, 0, 97);
    std::int64_t token = 97;
    for (const std::int64_t length : {1, 15, 31, 32, 33, 47, 63, 64, 65, 96, 127, 129}) {
      const std::int64_t node = std::int64_t(tree.node_count());
      tree.add_node_range(node, 0, token, length);
      tree.add_query(node);
      token += length;
    }
    tree.add_query(0, 40);
    for (const Variant& variant : all_variants()) {
      if (!is_fp8(variant.kv) || variant.per_head_scales) continue;
      const std::string variant_name = variant.name;
      CAPTURE(variant_name);
      Inputs in = make_variant_inputs(tree, variant, 41);
      for (const std::int32_t block_tokens : {64, 1024}) {
        CAPTURE(block_tokens);
        check_inputs_against_oracle(*backend, tree, in, tolerance(DType::f16), block_tokens);
      }
    }
  }
}

TEST_CASE("fp8 K and V beside bf16 Q: decoded into bf16 for the shaders, against the oracle") {
  auto backend = make_test_backend();
  RandomForestOptions o;
  o.seed = 31;
  o.nodes = 24;
  o.queries = 30;
  o.heads = {8, 2, 128, 0.0f};
  const Tree tree = random_forest(o);
  for (const Variant& variant : all_variants()) {
    if (!is_fp8(variant.kv)) continue;
    const std::string variant_name = variant.name;
    CAPTURE(variant_name);
    Inputs in = make_variant_inputs(tree, variant, 31);
    HostArray q(DType::bf16, in.q.shape);
    for (std::size_t i = 0; i < std::size_t(q.numel()); ++i) {
      store_from_float(q.bytes.data(), DType::bf16, i, load_as_float(in.q.bytes.data(), DType::f16, i));
    }
    in.q = std::move(q);
    check_inputs_against_oracle(*backend, tree, in, tolerance(DType::bf16));
  }
}

TEST_CASE("a call's variants run pipelines of their own; a plain call after them runs the plain ones, bit for bit") {
  auto backend = make_test_backend();
  RandomForestOptions o;
  o.seed = 21;
  o.nodes = 30;
  o.queries = 20;
  o.heads = {8, 2, 64, 0.0f};
  const Tree tree = random_forest(o);
  Inputs plain = make_inputs(tree, DType::f16, 21, 2.0f);
  Inputs capped = make_inputs(tree, DType::f16, 21, 2.0f);
  capped.logit_softcap = 3.0f;
  const Outputs before = run_backend(*backend, tree, plain, PlanOptions{});
  const Outputs with_cap = run_backend(*backend, tree, capped, PlanOptions{});
  const Outputs after = run_backend(*backend, tree, plain, PlanOptions{});
  CHECK(with_cap.lse.bytes != before.lse.bytes);
  CHECK(after.o.bytes == before.o.bytes);
  CHECK(after.lse.bytes == before.lse.bytes);
}

TEST_CASE("work groups beyond one run of a dispatch's x: further runs along y or z, the last one partly idle") {
  // A device takes at least 65 535 work groups along a dispatch's x, and a plan
  // of many short blocks, or of many queries, needs more (lavapipe's limit; the
  // H100's is 2^31 - 1). Runs of 7 here: stage 1's passes x 2 KV heads and the
  // merge's queries (each over the 8 query heads) fill several, the last one
  // not wholly, and the output is the one-run dispatches', bit for bit.
  const Tree tree = determinism_forest();
  Inputs in = make_inputs(tree, DType::f16, 3);
  const Plan plan = treeattn::plan(tree, PlanOptions{Strategy::flatten, 32, kMaxQueryTile, 0});
  REQUIRE(plan.num_items() * tree.heads.heads_kv % 7 != 0);
  REQUIRE(plan.num_partials > 0);
  REQUIRE(plan.num_queries % 7 != 0);
  auto one_run = make_backend(BackendKind::vulkan, variant_options(g_variant));
  BackendOptions options = variant_options(g_variant);
  options.vk_max_dispatch_run = 7;
  auto runs = make_backend(BackendKind::vulkan, options);
  const Outputs expected = run_plan(*one_run, tree, in, plan);
  Outputs got = run_plan(*runs, tree, in, plan);
  CHECK(got.o.bytes == expected.o.bytes);
  CHECK(got.lse.bytes == expected.lse.bytes);
  const OracleResult oracle = oracle_attention(tree, in.q.view(), in.k.view(), in.v.view());
  CHECK(max_abs_error(got.o.view(), oracle.o) <= tolerance(DType::f16));
}

TEST_CASE("a pipeline cache file carries compiled pipelines to the next backend, and foreign data is ignored") {
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("treeattn_pipeline_cache_" + std::to_string(::getpid()) + ".bin");
  std::filesystem::remove(path);
  BackendOptions cached = variant_options(g_variant);
  cached.vk_pipeline_cache = path.string();
  std::vector<std::string> ignored;  // what the backend logs
  cached.log = [&](LogLevel, const std::string& message) { ignored.push_back(message); };
  auto read_file = [&] {
    std::ifstream in(path, std::ios::binary);
    return std::vector<char>(std::istreambuf_iterator<char>(in), {});
  };
  Tree tree({8, 2, 64});
  tree.add_node_range(0, kNoParent, 0, 300);
  tree.add_query(0);
  Inputs in = make_inputs(tree, DType::f16, 5);
  Outputs first;
  {
    auto backend = make_backend(BackendKind::vulkan, cached);
    first = run_backend(*backend, tree, in, PlanOptions{});
  }
  const std::vector<char> written = read_file();
  REQUIRE(written.size() >= sizeof(VkPipelineCacheHeaderVersionOne));  // at least the header the driver validates

  const std::vector<vulkan::DeviceCaps> devices = vulkan::probe_devices(*vulkan::Instance::get());
  const vulkan::DeviceCaps& caps = vulkan::select_device(devices, harness_options().vk_device);
  CHECK(caps.pipeline_cache_matches(written));
  std::vector<char> foreign = written;
  foreign[16] ^= 0x5a;  // a byte of pipelineCacheUUID
  CHECK_FALSE(caps.pipeline_cache_matches(foreign));
  std::vector<char> other_vendor = written;
  other_vendor[8] ^= 0x01;  // vendorID
  CHECK_FALSE(caps.pipeline_cache_matches(other_vendor));
  CHECK_FALSE(caps.pipeline_cache_matches(std::vector<char>(written.begin(), written.begin() + 20)));

  // A header from another device: the next backend starts empty, computes the
  // same, and writes its own cache back.
  std::ofstream(path, std::ios::binary).write(foreign.data(), std::streamsize(foreign.size()));
  {
    auto backend = make_backend(BackendKind::vulkan, cached);
    const Outputs again = run_backend(*backend, tree, in, PlanOptions{});
    CHECK(again.o.bytes == first.o.bytes);
  }
  REQUIRE(ignored.size() == 1);  // said once, through the log sink
  CHECK(ignored[0].find("ignoring the pipeline cache") != std::string::npos);
  const std::vector<char> rewritten = read_file();
  REQUIRE(rewritten.size() >= 32);
  CHECK(std::equal(rewritten.begin(), rewritten.begin() + 32, written.begin()));
  std::filesystem::remove(path);
}

TEST_CASE("backends created and destroyed one after another keep working: the instance outlives them") {
  // Destroying the last instance unloads the driver, and reloading NVIDIA's
  // failed after about 26 cycles in a process built without CUDA ("no driver").
  Tree tree({8, 2, 64});
  tree.add_node_range(0, kNoParent, 0, 40);
  tree.add_query(0);
  Inputs in = make_inputs(tree, DType::f16, 9);
  const OracleResult expected = oracle_attention(tree, in.q.view(), in.k.view(), in.v.view());
  for (int i = 0; i < 40; ++i) {
    CAPTURE(i);
    auto backend = make_test_backend();
    Outputs out = run_backend(*backend, tree, in, PlanOptions{});
    REQUIRE(max_abs_error(out.o.view(), expected.o) <= tolerance(DType::f16));
  }
  CHECK(vulkan::Instance::get().use_count() >= 2);  // held beyond this caller's reference, for the process
}

TEST_CASE("the bf16 coopmat shader: the f16 build with its 16-bit float type declared bfloat16") {
  // Hand-assembled modules (only what the retyping reads): header, then instructions.
  auto op = [](std::uint32_t code, std::vector<std::uint32_t> operands) {
    operands.insert(operands.begin(), std::uint32_t(operands.size() + 1) << 16 | code);
    return operands;
  };
  auto module = [](std::vector<std::vector<std::uint32_t>> list) {
    std::vector<std::uint32_t> words = {0x07230203u, 0x00010600u, 0u, 20u, 0u};
    for (const auto& i : list) words.insert(words.end(), i.begin(), i.end());
    return words;
  };
  const std::vector<std::uint32_t> memory_model = {(3u << 16) | 14u, 0u, 1u};  // OpMemoryModel Logical GLSL450
  const std::vector<std::uint32_t> f16 = {(3u << 16) | 22u, 1u, 16u};           // %1 = OpTypeFloat 16
  const std::vector<std::uint32_t> in = module({op(17, {1}), op(17, {9}), memory_model, f16, op(22, {2, 32})});
  const std::vector<std::uint32_t> out = vulkan::retype_f16_as_bf16(in.data(), in.size());
  const std::vector<std::uint32_t> extension = op(10, {0x5f565053u, 0x5f52484bu, 0x6f6c6662u, 0x36317461u, 0u});
  const std::vector<std::uint32_t> expected = module({op(17, {1}), op(17, {9}), op(17, {5116}), op(17, {5118}), extension,
                                                     memory_model, op(22, {1, 16, 0}), op(22, {2, 32})});
  CHECK(out == expected);  // "SPV_KHR_bfloat16", nul-terminated, in little-endian words

  // What a bfloat16 value cannot be or meet: a constant (its bits would mean
  // another number), arithmetic (OpFAdd), a comparison (OpFOrdEqual).
  const std::vector<std::uint32_t> function_head[] = {op(19, {3}), op(33, {4, 3}), op(54, {3, 5, 0, 4}), op(248, {6}),
                                                     op(1, {1, 7})};
  auto in_function = [&](std::vector<std::uint32_t> body) {
    std::vector<std::vector<std::uint32_t>> list = {op(17, {1}), memory_model, f16, op(20, {9})};
    list.insert(list.end(), std::begin(function_head), std::end(function_head));
    list.push_back(std::move(body));
    list.push_back(op(56, {}));
    return module(list);
  };
  const std::vector<std::uint32_t> constant = module({op(17, {1}), memory_model, f16, op(43, {1, 2, 0x3c00})});
  const std::vector<std::uint32_t> add = in_function(op(129, {1, 8, 7, 7}));
  const std::vector<std::uint32_t> compare = in_function(op(180, {9, 8, 7, 7}));
  const std::vector<std::uint32_t> no_f16 = module({op(17, {1}), memory_model, op(22, {2, 32})});
  CHECK_THROWS_WITH_AS(vulkan::retype_f16_as_bf16(constant.data(), constant.size()), doctest::Contains("opcode 43 makes"), Error);
  CHECK_THROWS_WITH_AS(vulkan::retype_f16_as_bf16(add.data(), add.size()), doctest::Contains("opcode 129 makes"), Error);
  CHECK_THROWS_WITH_AS(vulkan::retype_f16_as_bf16(compare.data(), compare.size()), doctest::Contains("opcode 180 takes"), Error);
  CHECK_THROWS_WITH_AS(vulkan::retype_f16_as_bf16(no_f16.data(), no_f16.size()), doctest::Contains("0 16-bit float types"), Error);
  const std::vector<std::uint32_t> select = in_function(op(169, {1, 8, 10, 7, 7}));  // OpSelect is allowed
  CHECK_NOTHROW(vulkan::retype_f16_as_bf16(select.data(), select.size()));
  const std::vector<std::uint32_t> truncated(in.begin(), in.end() - 1);
  CHECK_THROWS_WITH_AS(vulkan::retype_f16_as_bf16(truncated.data(), truncated.size()), doctest::Contains("malformed"), Error);
#ifdef TREEATTN_HAVE_VK_COOPMAT
  // The embedded coopmat shaders keep their 16-bit floats out of arithmetic, so
  // they retype (checked here, where no device runs them): two capabilities, the
  // extension (five words of name) and the encoding operand added.
  using vulkan::SpirvModule;
  for (const SpirvModule& m : {SpirvModule{vulkan::spirv::tree_attn_coopmat, vulkan::spirv::tree_attn_coopmat_words},
                               SpirvModule{vulkan::spirv::tree_attn_coopmat_fragments,
                                           vulkan::spirv::tree_attn_coopmat_fragments_words}}) {
    const std::vector<std::uint32_t> shader = vulkan::retype_f16_as_bf16(m.words, m.word_count);
    CHECK(shader.size() == m.word_count + 2 * 2 + 6 + 1);
  }
#endif
}

TEST_CASE("mma's fragment layout, as the fragments shader and the probe read it, covers each 16x16 element once") {
  // 32 lanes x 8 elements onto 256 positions, and a lane's elements 2k and
  // 2k + 1 adjacent in one row (the shader stores them as a pair).
  std::vector<int> seen(256, 0);
  for (int lane = 0; lane < 32; ++lane) {
    for (int i = 0; i < 8; ++i) {
      const int row = vulkan::fragment_row(lane, i), column = vulkan::fragment_column(lane, i);
      REQUIRE((row >= 0 && row < 16 && column >= 0 && column < 16));
      ++seen[row * 16 + column];
      if (i % 2 == 1) {
        CHECK(vulkan::fragment_row(lane, i - 1) == row);
        CHECK(vulkan::fragment_column(lane, i - 1) == column - 1);
      }
    }
  }
  CHECK(std::count(seen.begin(), seen.end(), 1) == 256);
}

TEST_CASE("the coopmat shaders' stages: 32 tokens where they fit the shared memory, else 16, else none") {
  // Sizes from the shaders' shared arrays: Q staging 3 072 bytes, a K and a V
  // row of 2 head_dim + 16 bytes per token and stage, and per token either a
  // second stage (fragments) or four subgroups' S and P columns (512 bytes).
  vulkan::DeviceCaps nvidia;
  nvidia.shared_memory_bytes = 48 * 1024;
  CHECK(vulkan::coopmat_chunk_tokens(nvidia, 64, 64, true) == 32);
  CHECK(vulkan::coopmat_chunk_tokens(nvidia, 128, 128, true) == 32);  // 37 888 bytes
  CHECK(vulkan::coopmat_chunk_tokens(nvidia, 256, 256, true) == 16);  // 36 864 (70 656 at 32)
  CHECK(vulkan::coopmat_chunk_tokens(nvidia, 128, 128, false) == 32);
  CHECK(vulkan::coopmat_chunk_tokens(nvidia, 256, 256, false) == 16);
  vulkan::DeviceCaps least;  // the least shared memory a coopmat device has (coopmat_unsupported)
  least.shared_memory_bytes = 32 * 1024;
  CHECK(vulkan::coopmat_chunk_tokens(least, 64, 64, true) == 32);
  CHECK(vulkan::coopmat_chunk_tokens(least, 128, 128, true) == 16);
  CHECK(vulkan::coopmat_chunk_tokens(least, 256, 256, true) == 0);  // the backend runs the shared-memory shader
  CHECK(vulkan::coopmat_chunk_tokens(least, 256, 256, false) == 16);
  // K and V rows of their own widths: 192 / 128 (46 080 bytes at 32) and 96.
  CHECK(vulkan::coopmat_chunk_tokens(nvidia, 192, 128, true) == 32);
  CHECK(vulkan::coopmat_chunk_tokens(nvidia, 96, 96, true) == 32);
  CHECK(vulkan::coopmat_chunk_tokens(least, 192, 128, true) == 16);
  CHECK(vulkan::coopmat_chunk_tokens(least, 192, 128, false) == 16);
}

TEST_CASE("the merge's threads: two or more of a row's columns each, 32 of them, or 48 for 96 columns") {
  for (int columns : {64, 96, 128, 256}) {
    CAPTURE(columns);
    const std::uint32_t threads = vulkan::merge_threads(columns);
    CHECK(std::uint32_t(columns) % threads == 0);
    CHECK(std::uint32_t(columns) / threads % 2 == 0);  // its stores write column pairs
    CHECK(threads == (columns == 96 ? 48u : 32u));
  }
}

TEST_CASE("the shaders' plan encoding: each pass row's tile words hold exactly the tokens its query sees") {
  // Read the way tree_attn_coopmat.comp reads them (a 32-bit half of the row's
  // tile word per 32-token chunk), against the plan's segment masks. Runs on
  // the host: lavapipe has no cooperative matrices, so CI checks the records
  // and words the coopmat shader reads here.
  using namespace treeattn::vulkan;
  for (int group : {1, 4}) {
    for (std::int32_t block_tokens : {40, 100, 256}) {
      CAPTURE(group);
      CAPTURE(block_tokens);
      RandomForestOptions forest;
      forest.seed = std::uint64_t(11 + group);
      forest.heads = HeadConfig{2 * group, 2, 64, 0.0f};
      forest.nodes = 60;
      forest.queries = 90;  // some blocks have more than 64 queries: two items share them
      const Tree tree = random_forest(forest);
      PlanOptions options;
      options.block_tokens = block_tokens;
      const Plan plan = treeattn::plan(tree, options);
      const Lowering lowered = lower(plan, 64);
      const EncodedPlan e = encode_plan(plan, lowered);
      std::int64_t wrong = 0, checked = 0;
      for (std::uint32_t pass = 0; pass < e.passes; ++pass) {
        // What each block token's segment mask says: bit j <=> tile query j sees it.
        const std::int32_t item = lowered.passes[pass].item;
        const std::vector<ItemToken> sees = item_tokens(plan, item);
        const std::int32_t q0 = plan.item_query_begin[std::size_t(item)];
        const std::uint32_t rows = std::uint32_t((plan.item_query_begin[std::size_t(item) + 1] - q0) * group);
        const std::uint32_t* record = &e.words[pass * kPassWords];
        REQUIRE(record[0] % 64 == 0);
        REQUIRE(record[1] == sees.size());
        REQUIRE(record[2] == std::uint32_t(q0));
        REQUIRE(record[4] < record[3]);
        REQUIRE(record[3] <= std::min(rows, record[4] + 64));
        for (std::uint32_t row = record[4]; row < record[3]; ++row) {
          const std::uint32_t tile_query = row / std::uint32_t(group);
          for (std::uint32_t chunk0 = 0; chunk0 < record[1]; chunk0 += 32) {
            const std::uint32_t word =
                e.words[e.offsets[kTileVisible] + ((record[0] + chunk0) / 64 * 64 + tile_query) * 2 + chunk0 / 32 % 2];
            for (std::uint32_t c = 0; c < 32; ++c) {
              const bool expected = chunk0 + c < record[1] && (sees[chunk0 + c].mask >> tile_query & 1) != 0;
              wrong += ((word >> c & 1) != 0) != expected;
              ++checked;
            }
          }
        }
      }
      CHECK(checked > 10000);
      CHECK(wrong == 0);
    }
  }
}

TEST_CASE("the timed layers compute what run() computes") {
  auto backend = make_test_backend();
  check_timed_layers_match_run(*backend);
}

int main(int argc, char** argv) {
  std::vector<VulkanDeviceReport> devices;
  try {
    devices = vulkan_devices(harness_options());  // the process's first Vulkan call: validation from here on
  } catch (const Error& e) {
    std::printf("test_vulkan: %s: skipping the Vulkan suite\n", e.what());
    return 77;
  }
  const VulkanDeviceReport* device = nullptr;
  for (const VulkanDeviceReport& d : devices) {
    if (d.selected) device = &d;
  }
  if (device == nullptr || device->variant_f16.rfind("none", 0) == 0) {
    std::printf("test_vulkan: no Vulkan device can run treeattn's shaders: skipping the Vulkan suite\n");
    return 77;
  }
  // Where the device runs the fragments shader, the shared-memory one (what
  // other layouts run) is tested on it too.
  std::vector<std::string> variants = {"scalar"};
  if (device->variant_f16.rfind("coopmat", 0) == 0) variants.push_back("coopmat");
  if (device->variant_f16.rfind("coopmat, softmax in registers", 0) == 0) variants.push_back("coopmat-shared");
  int status = 0;
  for (const std::string& variant : variants) {
    std::printf("test_vulkan: %s, %s variant\n", device->name.c_str(), variant.c_str());
    g_variant = variant;
    doctest::Context context(argc, argv);
    status |= context.run();
    if (context.shouldExit()) return status;
  }
  if (const int messages = vulkan::Instance::validation_messages(); messages > 0) {
    std::printf("test_vulkan: the validation layer reported %d message(s) (above): failing\n", messages);
    return 1;
  }
  return status;
}
