// The treeattn program end to end: exact flags, outputs equal to the library's,
// one-line errors with exit status 1, and no output file left behind on failure.

#include <doctest/doctest.h>

#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "support/oracle.hpp"
#include "treeattn/tools.hpp"
#include "treeattn/treeattn.hpp"

using namespace treeattn;

namespace {

struct Result {
  int status;
  std::string output;
};

// Runs the CLI with `args`; captures stderr (and stdout unless `stderr_only`).
// `shell_prefix` goes before the program (a `cd`, environment settings).
Result cli(const std::string& args, bool stderr_only = false, const std::string& shell_prefix = "") {
  const std::string command =
      shell_prefix + std::string(TREEATTN_CLI) + " " + args + (stderr_only ? " 2>&1 >/dev/null" : " 2>&1");
  FILE* pipe = popen(command.c_str(), "r");
  REQUIRE(pipe != nullptr);
  std::string output;
  char buffer[4096];
  while (std::size_t n = std::fread(buffer, 1, sizeof buffer, pipe)) output.append(buffer, n);
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

bool exists(const std::string& path) { return std::ifstream(path).good(); }

std::size_t lines(const std::string& text) {
  std::size_t n = 0;
  for (char c : text) n += c == '\n';
  return n;
}

struct TempDir {
  std::string path;
  TempDir() {
    char name[] = "/tmp/treeattn_cli_XXXXXX";
    REQUIRE(mkdtemp(name) != nullptr);
    path = name;
  }
  ~TempDir() { (void)std::system(("rm -rf " + path).c_str()); }
  std::string operator/(const std::string& file) const { return path + "/" + file; }
};

void write_file(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

const std::string kExample = std::string(TREEATTN_EXAMPLES) + "/fewshot.json";

// Runs `bench ARGS --json FILE`, requires success, returns the run and its rows.
struct BenchRun {
  Result result;
  nlohmann::json rows;
};
BenchRun bench(const std::string& args) {
  TempDir dir;
  const std::string json = dir / "bench.json";
  Result r = cli("bench " + args + " --json " + json);
  REQUIRE_MESSAGE(r.status == 0, r.output);
  return {std::move(r), read_json(json)};
}

}  // namespace

TEST_CASE("run writes the library's O and LSE for the example tree") {
  TempDir dir;
  Result r = cli("random-inputs --tree " + kExample + " --out-dir " + dir.path + " --seed 5");
  REQUIRE_MESSAGE(r.status == 0, r.output);
  for (const char* strategy : {"flatten", "node", "node_chunk", "sequence", "cascade", "greedy"}) {
    CAPTURE(strategy);
    r = cli("run --tree " + kExample + " --q " + (dir / "q.npy") + " --k " + (dir / "k.npy") + " --v " + (dir / "v.npy") +
            " --out " + (dir / "o.npy") + " --lse " + (dir / "lse.npy") + " --backend cpu --block-tokens 100 --strategy " +
            strategy);
    REQUIRE_MESSAGE(r.status == 0, r.output);
    CHECK(r.output.empty());

    const Tree tree = load_tree_json(kExample);
    HostArray q = read_npy(dir / "q.npy"), k = read_npy(dir / "k.npy"), v = read_npy(dir / "v.npy");
    const Plan plan = treeattn::plan(tree, PlanOptions{parse_strategy(strategy), 100, kMaxQueryTile, 0});
    HostArray o(DType::f32, {plan.num_queries, 8, 128}), lse(DType::f32, {plan.num_queries, 8});
    ContextOptions cpu;
    cpu.backend = BackendKind::cpu;
    Context(cpu).run(plan, {q.view(), k.view(), v.view(), o.view(), lse.view()});
    const HostArray o_file = read_npy(dir / "o.npy"), lse_file = read_npy(dir / "lse.npy");
    CHECK(o_file.shape == o.shape);
    CHECK(o_file.dtype == DType::f32);
    CHECK(o_file.bytes == o.bytes);
    CHECK(lse_file.shape == lse.shape);
    CHECK(lse_file.bytes == lse.bytes);
  }
}

TEST_CASE("--window on run, bench and demo plans sliding windows; a negative one is refused naming it") {
  TempDir dir;
  REQUIRE(cli("random-inputs --tree " + kExample + " --out-dir " + dir.path + " --seed 5").status == 0);
  const std::string inputs =
      " --q " + (dir / "q.npy") + " --k " + (dir / "k.npy") + " --v " + (dir / "v.npy") + " --backend cpu --block-tokens 100";
  Result r = cli("run --tree " + kExample + inputs + " --out " + (dir / "o.npy") + " --window 5");
  REQUIRE_MESSAGE(r.status == 0, r.output);
  const Tree tree = load_tree_json(kExample);
  HostArray q = read_npy(dir / "q.npy"), k = read_npy(dir / "k.npy"), v = read_npy(dir / "v.npy");
  PlanOptions windowed{Strategy::flatten, 100, kMaxQueryTile, 0};
  windowed.window = 5;
  const Plan plan = treeattn::plan(tree, windowed);
  HostArray o(DType::f32, {plan.num_queries, 8, 128});
  ContextOptions cpu;
  cpu.backend = BackendKind::cpu;
  Context(cpu).run(plan, {q.view(), k.view(), v.view(), o.view(), {}});
  CHECK(read_npy(dir / "o.npy").bytes == o.bytes);
  REQUIRE(cli("run --tree " + kExample + inputs + " --out " + (dir / "o_whole.npy")).status == 0);
  CHECK(read_npy(dir / "o_whole.npy").bytes != o.bytes);  // the window reached the plan
  r = cli("run --tree " + kExample + inputs + " --out " + (dir / "o.npy") + " --window -1", true);
  CHECK(r.status != 0);
  CHECK(r.output.find("--window: Value -1 must be 0 or more") != std::string::npos);

  const std::string workload = "--workload fewshot --prompt 2000 --branches 8 --generated 16 --strategy flatten --repeat 1 --backend none";
  const nlohmann::json whole = bench(workload).rows, window = bench(workload + " --window 256").rows;
  REQUIRE(window.size() == 1);
  CHECK(window[0]["window"] == 256);
  CHECK(whole[0]["window"] == 0);
  // The prompt's last 240 tokens and every branch: tokens outside every window are not read.
  CHECK(window[0]["tokens"] == 240 + 8 * 16);
  CHECK(window[0]["plan_read_kv_bytes"] == window[0]["unique_kv_bytes"]);

  r = cli("demo --workload fewshot --branches 3 --prompt 100 --generated 10 --layers 1 --block-tokens 32 --window 12 "
          "--dump-step 7 --dump-dir " + dir.path + " --json " + (dir / "demo.json"));
  REQUIRE_MESSAGE(r.status == 0, r.output);
  const nlohmann::json summary = read_json(dir / "demo.json");
  CHECK(summary["window"] == 12);
  CHECK(summary["steps_on_held_layout"] == 0);  // a window holds no layout: each step is the whole plan
  r = cli("run --tree " + (dir / "tree.json") + " --q " + (dir / "q.npy") + " --k " + (dir / "k.npy") + " --v " +
          (dir / "v.npy") + " --out " + (dir / "o_run.npy") + " --block-tokens 32 --window 12");
  REQUIRE_MESSAGE(r.status == 0, r.output);
  CHECK(read_npy(dir / "o_run.npy").bytes == read_npy(dir / "o.npy").bytes);
}

// --kv-dtype reaches the planner (run, bench and demo plan through
// AttentionFlags::planned_for): a decode-only tree planned for fp8 K and V
// takes the shorter blocks of the cost model's fp8 terms.
TEST_CASE("--kv-dtype on bench plans with the cost model's fp8 terms") {
  const std::string workload =
      "--workload fewshot --prompt 16 --branches 50 --generated 1000 --strategy flatten,greedy --repeat 1 --backend none";
  const nlohmann::json f16 = bench(workload).rows, fp8 = bench(workload + " --kv-dtype fp8_e4m3").rows;
  REQUIRE(f16.size() == 2);
  REQUIRE(fp8.size() == 2);
  for (std::size_t i = 0; i < 2; ++i) {
    CAPTURE(i);
    CHECK(fp8[i]["block_tokens"].get<int>() < f16[i]["block_tokens"].get<int>());
  }
}

TEST_CASE("errors: exit 1, one line naming the problem, no output left behind") {
  TempDir dir;
  REQUIRE(cli("random-inputs --tree " + kExample + " --out-dir " + dir.path).status == 0);
  const std::string inputs = " --q " + (dir / "q.npy") + " --k " + (dir / "k.npy") + " --v " + (dir / "v.npy");
  const std::string out = dir / "o.npy", lse = dir / "lse.npy";

  auto expect_failure = [&](const std::string& args, const char* fragment) {
    CAPTURE(args);
    const Result r = cli(args, true);
    CHECK(r.status == 1);
    CHECK_MESSAGE(r.output.find(fragment) != std::string::npos, r.output);
    CHECK(lines(r.output) == 1);
    CHECK(!exists(out));
    CHECK(!exists(lse));
  };

  write_file(dir / "cycle.json", R"({"heads_q": 8, "heads_kv": 2, "head_dim": 128,
    "nodes": [{"id": 1, "parent": 2, "slot_range": [0, 3]}, {"id": 2, "parent": 1, "slot_range": [3, 3]}],
    "queries": [{"node": 1}]})");
  expect_failure("run --tree " + (dir / "cycle.json") + inputs + " --out " + out + " --lse " + lse, "cycle");

  write_file(dir / "far.json", R"({"heads_q": 8, "heads_kv": 2, "head_dim": 128,
    "nodes": [{"id": 0, "parent": -1, "slot_range": [0, 600]}, {"id": 7, "parent": 0, "slots": [3, 5000]}],
    "queries": [{"node": 7}]})");
  expect_failure("run --tree " + (dir / "far.json") + inputs + " --out " + out,
                 "node 7 (nodes[1]): slots[1] = 5000 is out of range for a KV pool of 694 slots");

  write_file(dir / "dim80.json", R"({"heads_q": 8, "heads_kv": 2, "head_dim": 80,
    "nodes": [{"id": 0, "parent": -1, "slot_range": [0, 600]}], "queries": [{"node": 0}]})");
  expect_failure("run --tree " + (dir / "dim80.json") + inputs + " --out " + out,
                 "head_dim = 80 is not supported (supported: 64, 96, 128, 256; or head_dim 192 with head_dim_v 128)");
  expect_failure("bench --backend none --workload fewshot --branches 2 --heads 32/8/80",
                 "--heads '32/8/80': head_dim = 80 is not supported (supported: 64, 96, 128, 256; or head_dim 192 with head_dim_v 128)");
  expect_failure("random-inputs --tree " + kExample + " --out-dir " + dir.path + " --amplitude inf",
                 "--amplitude: Value inf must be finite");

  write_file(dir / "bad.json", "{\"heads_q\": 8,");
  expect_failure("run --tree " + (dir / "bad.json") + inputs + " --out " + out, "malformed JSON");

  write_file(dir / "heads.json", R"({"heads_q": 4, "heads_kv": 2, "head_dim": 128,
    "nodes": [{"id": 0, "parent": -1, "slot_range": [0, 600]}], "queries": [{"node": 0}]})");
  expect_failure("run --tree " + (dir / "heads.json") + inputs + " --out " + out, "Q is [5, 8, 128] f16, expected [1, 4, 128]");

  expect_failure("run --tree " + kExample + " --q " + (dir / "missing.npy") + " --k " + (dir / "k.npy") + " --v " +
                     (dir / "v.npy") + " --out " + out,
                 "missing.npy: cannot open");
  expect_failure("run --tree " + kExample + inputs, "--out is required");
  expect_failure("run --tree " + kExample + inputs + " --out " + out + " --strategy deft", "--strategy");
  expect_failure("run --tree " + kExample + inputs + " --out " + out + " --block-tokens 0",
                 "block tokens '0' is neither a count in [1, 65536] nor auto");
  expect_failure("run --tree " + kExample + inputs + " --out " + out + " --block-tokens fast",
                 "block tokens 'fast' is neither a count in [1, 65536] nor auto");
  expect_failure("bench --backend none --workload fewshot --branches 2 --cost auto_block_min=4096",
                 "auto_block_min = 4096 is above auto_block_max = 2048");
  expect_failure("run --tree " + kExample + inputs + " --out " + out + " --strategy greedy --cost tile_ns=3",
                 "unknown coefficient 'tile_ns'");
#ifdef TREEATTN_TEST_HAVE_VULKAN
  expect_failure("run --tree " + kExample + inputs + " --out " + out + " --backend vulkan --device 99",
                 "Vulkan device 99 does not exist");
#else
  expect_failure("run --tree " + kExample + inputs + " --out " + out + " --backend vulkan", "built without the vulkan backend");
#endif
  expect_failure("run --tree " + kExample + inputs + " --out " + out + " --lse " + out, "named as two outputs");
  expect_failure("frobnicate", "frobnicate");

  // A failed run leaves an existing output untouched rather than half-written.
  write_file(out, "previous");
  const Result r = cli("run --tree " + (dir / "cycle.json") + inputs + " --out " + out, true);
  CHECK(r.status == 1);
  std::ifstream previous(out);
  std::string text;
  previous >> text;
  CHECK(text == "previous");
}

TEST_CASE("plan prints the split, the load balance and the IO model; --json is complete") {
  Result r = cli("plan --tree " + kExample + " --block-tokens 128");
  REQUIRE_MESSAGE(r.status == 0, r.output);
  CHECK(r.output.find("6 KV blocks") != std::string::npos);
  CHECK(r.output.find("load balance, KV tokens per work item: min 115, mean 115.7, max 116") != std::string::npos);
  CHECK(r.output.find("KV-IO reduction of this plan over Q-guided: 4.47x") != std::string::npos);

  r = cli("plan --tree " + kExample + " --strategy sequence --json", false);
  REQUIRE_MESSAGE(r.status == 0, r.output);
  const nlohmann::json doc = nlohmann::json::parse(r.output);
  CHECK(doc["strategy"] == "sequence");
  CHECK(doc["stats"]["tokens"] == 694);
  CHECK(doc["stats"]["item_queries_max"] == 1);
  CHECK(doc["stats"]["plan_read_kv_bytes"] == doc["stats"]["sequence_read_kv_bytes"]);
  std::size_t tile_entries = 0;
  for (const auto& item : doc["items"]) tile_entries += item["queries"].size();
  CHECK(tile_entries == doc["items"].size());

  // --plan-threads changes how long planning takes, never the plan.
  for (const char* strategy : {"flatten", "greedy"}) {
    const std::string command = "plan --tree " + kExample + " --strategy " + strategy + " --json";
    const Result one = cli(command, false), three = cli(command + " --plan-threads 3", false);
    REQUIRE_MESSAGE(three.status == 0, three.output);
    CHECK(three.output == one.output);
  }
  r = cli("plan --tree " + kExample + " --plan-threads -2");
  CHECK(r.status != 0);
}

TEST_CASE("plan --backend plans with that backend's device model") {
  // An 8 192-token prompt under 16 one-token branches: the H100 model's auto
  // picks 640-token blocks (three CTAs an SM), the Vulkan shaders' model 320
  // (two work groups an SM, each tile dearer, 192..2048 tokens).
  TempDir dir;
  nlohmann::json nodes = nlohmann::json::array(), queries = nlohmann::json::array();
  nodes.push_back({{"id", 0}, {"parent", -1}, {"slot_range", {0, 8192}}});
  for (int b = 1; b <= 16; ++b) {
    nodes.push_back({{"id", b}, {"parent", 0}, {"slot_range", {8192 + b - 1, 1}}});
    queries.push_back({{"node", b}});
  }
  const std::string tree = dir / "prompt8192.json";
  write_file(tree, nlohmann::json{{"heads_q", 32}, {"heads_kv", 8}, {"head_dim", 128}, {"nodes", nodes}, {"queries", queries}}
                       .dump());
  auto block_tokens = [&](const std::string& args) {
    const Result r = cli("plan --tree " + tree + " --json" + args, false);
    REQUIRE_MESSAGE(r.status == 0, r.output);
    return nlohmann::json::parse(r.output)["block_tokens"].get<int>();
  };
  const int h100 = block_tokens("");
  CHECK(h100 == 640);
  CHECK(block_tokens(" --backend none") == h100);
  CHECK(block_tokens(" --backend cpu") == h100);  // the CPU backend plans with the defaults
#ifdef TREEATTN_TEST_HAVE_VULKAN
  CHECK(block_tokens(" --backend vulkan") == 320);
  // A small tree (a 1 200-token prompt under 32 one-token branches, like
  // speculative t=32) fills under one wave of work groups: the Vulkan model
  // spreads it over 192-token blocks, below the H100 defaults' 256 floor.
  nodes = nlohmann::json::array();
  queries = nlohmann::json::array();
  nodes.push_back({{"id", 0}, {"parent", -1}, {"slot_range", {0, 1200}}});
  for (int b = 1; b <= 32; ++b) {
    nodes.push_back({{"id", b}, {"parent", 0}, {"slot_range", {1200 + b - 1, 1}}});
    queries.push_back({{"node", b}});
  }
  write_file(tree, nlohmann::json{{"heads_q", 32}, {"heads_kv", 8}, {"head_dim", 128}, {"nodes", nodes}, {"queries", queries}}
                       .dump());
  CHECK(block_tokens("") == 256);
  CHECK(block_tokens(" --backend vulkan") == 192);
#else
  const Result r = cli("plan --tree " + tree + " --backend vulkan");
  CHECK(r.status != 0);
  CHECK(r.output.find("built without the vulkan backend") != std::string::npos);
#endif
  const Result bad = cli("plan --tree " + tree + " --backend gpu");
  CHECK(bad.status != 0);
  CHECK(bad.output.find("--backend") != std::string::npos);
}

TEST_CASE("devices lists each device's cost model, in the table and the JSON") {
  // HOME in a fresh directory: a device that calibrates writes its model under
  // it, and --no-model-cache leaves it empty.
  TempDir home;
  const std::string env = "HOME=" + home.path + " ";
  const Result out = cli("devices --json --no-model-cache", false, env);
#ifdef TREEATTN_TEST_HAVE_VULKAN
  REQUIRE_MESSAGE(out.status == 0, out.output);
  const nlohmann::json doc = nlohmann::json::parse(out.output.substr(out.output.find('{')));
  REQUIRE(doc["cuda_devices"].is_array());
  for (const nlohmann::json& d : doc["vulkan_devices"]) {
    if (d["variant_f16"].get<std::string>().rfind("none", 0) == 0) continue;
    CHECK(!d["cost_model_source"].get<std::string>().empty());
    CHECK(d["cost_model"].get<std::string>().find("pass_ns=") == 0);
  }
  for (const nlohmann::json& d : doc["cuda_devices"]) {
    if (d["error"].get<std::string>().empty()) CHECK(!d["cost_model_source"].get<std::string>().empty());
  }
  CHECK(!exists(home / ".cache/treeattn/device_models.json"));
  const Result table = cli("devices --no-model-cache", false, env);
  REQUIRE_MESSAGE(table.status == 0, table.output);
  CHECK(table.output.find("cost model") != std::string::npos);
  CHECK(table.output.find("CUDA devices: ") != std::string::npos);
#else
  CHECK(out.status != 0);
#endif
}

TEST_CASE("help teaches the commands and exits 0") {
  Result r = cli("--help");
  CHECK(r.status == 0);
  for (const char* command : {"run", "plan", "bench", "demo", "random-inputs"}) CHECK(r.output.find(command) != std::string::npos);
  r = cli("run --help");
  CHECK(r.status == 0);
  CHECK(r.output.find("--block-tokens") != std::string::npos);
  CHECK(r.output.find("Example:") != std::string::npos);
}

TEST_CASE("bench writes JSON rows per strategy") {
  const nlohmann::json rows = bench("--workload random --nodes 300 --queries 50 --trees 3 --max-tokens 16 --strategy flatten,sequence "
                       "--repeat 3 --backend cpu").rows;
  REQUIRE(rows.size() == 2);
  CHECK(rows[0]["strategy"] == "flatten");
  CHECK(rows[0]["kv_io_reduction"].get<double>() > 1.0);
  CHECK(rows[0]["plan_read_kv_bytes"] == rows[0]["unique_kv_bytes"]);     // flatten reads the tree once
  CHECK(rows[1]["plan_read_kv_bytes"] == rows[1]["sequence_kv_bytes"]);   // sequence reads every path
  CHECK(rows[1]["run_median_us"].get<double>() > 0.0);
  CHECK(rows[0]["unique_kv_bytes"] == rows[1]["unique_kv_bytes"]);
  CHECK(rows[0]["roofline_fraction"].get<double>() > 0.0);
  CHECK(rows[0]["plan_threads"] == 1);
  CHECK(rows[0]["dtype"] == "f16");
  // bf16 inputs: the row says so; f32 is refused (the bench times the 16-bit inputs the kernels are tuned for).
  const nlohmann::json bf16 = bench("--workload random --nodes 300 --queries 50 --trees 3 --max-tokens 16 "
                                    "--strategy flatten --repeat 1 --backend cpu --dtype bf16").rows;
  REQUIRE(bf16.size() == 1);
  CHECK(bf16[0]["dtype"] == "bf16");
  CHECK(bf16[0]["run_median_us"].get<double>() > 0.0);
  const Result f32 = cli("bench --workload random --nodes 30 --backend cpu --dtype f32", true);
  CHECK(f32.status != 0);
  CHECK(f32.output.find("--dtype: f32 not in {f16,bf16}") != std::string::npos);
  // Planned on a Planner of three threads: the same plan, the count recorded.
  const nlohmann::json threaded = bench("--workload random --nodes 300 --queries 50 --trees 3 --max-tokens 16 "
                                        "--strategy flatten,sequence --repeat 3 --backend none --plan-threads 3").rows;
  REQUIRE(threaded.size() == 2);
  CHECK(threaded[0]["plan_threads"] == 3);
  for (const char* field : {"block_tokens", "items", "partials", "model_us"}) CHECK(threaded[0][field] == rows[0][field]);
}

TEST_CASE("bench sweeps cost models: one row per strategy and model, with the model's counts") {
  const nlohmann::json rows = bench("--workload levels --levels 1,4,16:64,32,16 --strategy flatten,greedy --backend none "
                       "--repeat 1 --cost switch_gain=0 --cost switch_gain=0,partial_ns=1e6").rows;
  REQUIRE(rows.size() == 4);
  CHECK(rows[2]["strategy"] == "greedy");
  CHECK(rows[2]["cost_model"].get<std::string>().find("switch_gain=0,") != std::string::npos);
  CHECK(rows[3]["cost_model"].get<std::string>().find("partial_ns=1e+06") != std::string::npos);
  // Partials cost a million: greedy concatenates down to the leaves and each query has one group.
  CHECK(rows[3]["partials"] == 0);
  CHECK(rows[2]["partials"].get<int>() > 0);
  for (const auto& row : rows) CHECK(row["model_us"].get<double>() > 0.0);
}

TEST_CASE("bench sweeps block sizes: one row per value, auto naming the size it chose") {
  const auto [r, rows] = bench("--workload fewshot --branches 50 --prompt 4000 --generated 200 --strategy flatten "
                       "--block-tokens 256,auto --backend none --repeat 1");
  REQUIRE(rows.size() == 2);
  CHECK(rows[0]["block_tokens_option"] == "256");
  CHECK(rows[0]["block_tokens"] == 256);
  CHECK(rows[1]["block_tokens_option"] == "auto");
  const int chosen = rows[1]["block_tokens"].get<int>();
  CHECK(chosen > 256);  // a long prompt under 50 branches: longer blocks, fewer partials
  CHECK(rows[1]["model_us"].get<double>() < rows[0]["model_us"].get<double>());
  CHECK(r.output.find("auto:" + std::to_string(chosen)) != std::string::npos);
}

TEST_CASE("bench covers the paper workloads and model shapes") {
  const nlohmann::json rows = bench("--workload fewshot,speculative,reasoning,levels --branches 20 --tree-size 32 "
                       "--reasoning keywordToT --levels 1,4,16:64,32,16 --model llama3-8b,codellama-34b "
                       "--strategy flatten --backend none --repeat 2").rows;
  REQUIRE(rows.size() == 8);  // 4 workloads x 2 models
  CHECK(rows[0]["workload"] == "fewshot b=20");
  CHECK(rows[0]["tokens"] == 4000 + 20 * 400);
  // DeFT's KV-IO reduction for few-shot: 20 paths of 4400 tokens over 12000 unique tokens.
  CHECK(rows[0]["kv_io_reduction"].get<double>() == doctest::Approx(20.0 * 4400 / 12000));
  CHECK(rows[4]["model"] == "codellama-34b");
  CHECK(rows[4]["heads_q"] == 64);
}

TEST_CASE("the workload records ship beside the executable; --workloads-dir and the variable override them") {
  // From another directory, with no variable set: the copy under share/treeattn/workloads.
  TempDir dir;
  const std::string speculative = "bench --workload speculative --tree-size 32 --backend none --repeat 1";
  const Result found = cli(speculative, false, "cd " + dir.path + " && env -u TREEATTN_WORKLOADS_DIR ");
  CHECK_MESSAGE(found.status == 0, found.output);
  CHECK(found.output.find("speculative t=32") != std::string::npos);

  // A directory without them: the error names the file, the directory and both ways to set it.
  const Result flag = cli(speculative + " --workloads-dir " + dir.path, true);
  CHECK(flag.status == 1);
  CHECK(flag.output.find(dir.path + "/speculative/APPS_tree_size32.json not found") != std::string::npos);
  CHECK(flag.output.find("--workloads-dir or TREEATTN_WORKLOADS_DIR") != std::string::npos);
  const Result variable = cli("bench --workload reasoning --reasoning keywordToT --backend none", true,
                              "TREEATTN_WORKLOADS_DIR=" + dir.path + " ");
  CHECK(variable.status == 1);
  CHECK(variable.output.find(dir.path + "/reasoning/keywordToT.json not found") != std::string::npos);
}

TEST_CASE("bench snapshots a reasoning tree at any iteration") {
  const nlohmann::json rows = bench("--workload reasoning --reasoning keywordToT --reasoning-step 300 --backend none "
                       "--strategy flatten --repeat 1").rows;
  REQUIRE(rows.size() == 1);
  CHECK(rows[0]["workload"] == "reasoning keywordToT @300");
  CHECK(rows[0]["tokens"] == 1907);  // the live tree at iteration 300, computed from the JSON independently
  CHECK(rows[0]["queries"] == 10);
  const Result bad = cli("bench --workload reasoning --reasoning keywordToT --reasoning-step 9999 --backend none", true);
  CHECK(bad.status == 1);
  CHECK(bad.output.find("step 9999 is outside [1, 564]") != std::string::npos);
}

TEST_CASE("demo replays a workload; its attention equals `run` on the dumped snapshot") {
  TempDir dir;
  Result r = cli("demo --workload fewshot --branches 3 --prompt 100 --generated 10 --layers 2 --block-tokens 32 "
                 "--bitwise-updates --dump-step 7 --dump-dir " + dir.path + " --svg " + (dir / "demo.svg") +
                 " --json " + (dir / "demo.json"));
  REQUIRE_MESSAGE(r.status == 0, r.output);
  CHECK(r.output.find("tokens generated 30") != std::string::npos);
  const nlohmann::json summary = read_json(dir / "demo.json");
  CHECK(summary["steps"] == 10);
  CHECK(summary["steps_on_held_layout"] == 0);
  CHECK(summary["peak_pages"] == 7 + 3);  // the 100-token prompt in 16-token pages, one page per branch
  CHECK(summary["unique_kv_bytes"].get<std::int64_t>() < summary["sequence_kv_bytes"].get<std::int64_t>());
  CHECK(exists(dir / "demo.svg"));

  const std::string run = "run --tree " + (dir / "tree.json") + " --q " + (dir / "q.npy") + " --k " + (dir / "k.npy") +
                          " --v " + (dir / "v.npy") + " --out " + (dir / "o_run.npy") + " --lse " + (dir / "lse_run.npy") +
                          " --block-tokens 32";
  r = cli(run);
  REQUIRE_MESSAGE(r.status == 0, r.output);
  const Tree tree = load_tree_json(dir / "tree.json");
  CHECK(tree.query_count() == 3);
  CHECK(total_tokens(tree) == 100 + 3 * 7);
  CHECK(read_npy(dir / "o_run.npy").bytes == read_npy(dir / "o.npy").bytes);
  CHECK(read_npy(dir / "lse_run.npy").bytes == read_npy(dir / "lse.npy").bytes);

  // With flatten's blocks held (the default) on a device this tree fills
  // (four CTA slots: the blocks may grow past block_tokens), step 7 runs on
  // blocks kept from step 1: the same attention, rounded over other blocks.
  r = cli("demo --workload fewshot --branches 3 --prompt 100 --generated 10 --layers 2 --block-tokens 32 "
          "--cost slots=4,sms=1 --dump-step 7 --dump-dir " + dir.path + " --json " + (dir / "demo.json"));
  REQUIRE_MESSAGE(r.status == 0, r.output);
  const nlohmann::json held = read_json(dir / "demo.json");
  CHECK(held["per_step"][6]["held_layout"] == true);
  CHECK(held["steps_on_held_layout"].get<std::int64_t>() >= 5);
  REQUIRE(cli(run + " --cost slots=4,sms=1").status == 0);
  const HostArray o_run = read_npy(dir / "o_run.npy"), o_held = read_npy(dir / "o.npy");
  CHECK(o_run.bytes != o_held.bytes);
  REQUIRE(o_run.numel() == o_held.numel());
  float most = 0.0f;
  for (std::int64_t i = 0; i < o_run.numel(); ++i) {
    most = std::max(most, std::abs(load_as_float(o_run.bytes.data(), o_run.dtype, std::size_t(i)) -
                                   load_as_float(o_held.bytes.data(), o_held.dtype, std::size_t(i))));
  }
  CHECK(most < 2e-3f);

  r = cli("demo --workload speculative --tree-size 32 --steps 3 --layers 1 --dump-step 5 --dump-dir " + dir.path, true);
  CHECK(r.status == 1);
  CHECK(r.output.find("beyond the 3 steps") != std::string::npos);
}

// A short soak of the serving loop: every checked step's layer-0 outputs
// equal the CPU backend's (bitwise here: the demo runs on the CPU too, so a
// tolerance of 0 passes), memory is sampled at each check, and the counts
// cover every step.
TEST_CASE("demo soak on the CPU backend: serving steps checked against the CPU, memory sampled") {
  TempDir dir;
  Result r = cli("demo --backend cpu --workload serving --seed 2 --steps 300 --layers 1 --live-tokens 1000 "
                 "--check-every 100 --check-tolerance 0 --json " + (dir / "soak.json"));
  REQUIRE_MESSAGE(r.status == 0, r.output);
  CHECK(r.output.find("soak: 3 checks against the CPU backend passed") != std::string::npos);
  const nlohmann::json summary = read_json(dir / "soak.json");
  CHECK(summary["workload"] == "serving seed=2");
  CHECK(summary["steps"] == 300);
  CHECK(summary["per_step"].size() == 300);
  CHECK(summary["per_step_stride"] == 1);
  CHECK(summary["per_step"][299]["step"] == 300);
  CHECK(summary["kv_pool_pages"] == summary["peak_pages"]);
  // The pool holds the live tokens' pages: at most one partly filled page per live node.
  std::int64_t most_nodes = 0;
  for (const auto& step : summary["per_step"]) most_nodes = std::max(most_nodes, step["nodes"].get<std::int64_t>());
  CHECK(summary["kv_pool_pages"].get<std::int64_t>() <= 1000 / 16 + most_nodes);
  const nlohmann::json& soak = summary["soak"];
  CHECK(soak["check_every"] == 100);
  CHECK(soak["checks"] == 3);
  CHECK(soak["max_o_error"] == 0.0);
  CHECK(soak["max_lse_error"] == 0.0);
  CHECK(soak["warmup_steps"] == 30);
  REQUIRE(soak["memory_samples"].size() == 3);
  for (int i = 0; i < 3; ++i) {
    CHECK(soak["memory_samples"][i]["step"] == 100 * (i + 1));
    CHECK(soak["memory_samples"][i]["host_rss_bytes"].get<std::int64_t>() > 0);
    CHECK(soak["memory_samples"][i]["host_heap_bytes"].get<std::int64_t>() > 0);
    CHECK(soak["memory_samples"][i]["device_bytes"] == -1);
  }
  const nlohmann::json& host = soak["host_rss_after_warmup"];
  CHECK(host["first"] == soak["memory_samples"][0]["host_rss_bytes"]);
  CHECK(host["growth"] == host["most"].get<std::int64_t>() - host["first"].get<std::int64_t>());
  const nlohmann::json& heap = soak["host_heap_after_warmup"];
  CHECK(heap["last"] == soak["memory_samples"][2]["host_heap_bytes"]);
  CHECK(heap["least"].get<std::int64_t>() <= heap["last"].get<std::int64_t>());
  CHECK(soak["device_bytes_after_warmup"].is_null());
  CHECK(soak["graph_captures"].is_null());

  // The serving loop has no end of its own.
  r = cli("demo --backend cpu --workload serving", true);
  CHECK(r.status == 1);
  CHECK(r.output.find("serving seed=1 has no end: give --steps") != std::string::npos);
}

#ifdef TREEATTN_TEST_HAVE_VULKAN
// The Vulkan device path (KV cache on the device, new rows copied as written,
// two steps in flight, under the validation layer): a dumped step equals `run
// --backend vulkan` on the step's host arrays, so every row the steps wrote
// reached the device. The speculative draft's slots are freed and written
// again every step.
TEST_CASE("demo on the Vulkan device path: a dumped step equals `run --backend vulkan`") {
  struct Workload {
    std::string args;
    std::int64_t steps;
  };
  for (const Workload& w : {Workload{"--workload fewshot --branches 3 --prompt 100 --generated 10 --layers 2", 10},
                            Workload{"--workload speculative --tree-size 32 --steps 3 --layers 1", 3}}) {
    CAPTURE(w.args);
    TempDir dir;
    Result r = cli("demo --backend vulkan " + w.args + " --block-tokens 32 --bitwise-updates --dump-step " +
                       std::to_string(w.steps - 1) + " --dump-dir " + dir.path + " --json " + (dir / "demo.json"),
                   false, "TREEATTN_VK_VALIDATION=1 ");
    REQUIRE_MESSAGE(r.status == 0, r.output);
    CHECK(r.output.find("backend vulkan (Vulkan device path)") != std::string::npos);
    CHECK(r.output.find("validation") == std::string::npos);
    const nlohmann::json summary = read_json(dir / "demo.json");
    CHECK(summary["runner"] == "Vulkan device path");
    CHECK(summary["attention_overlaps_host"] == true);
    REQUIRE(summary["per_step"].size() == std::size_t(w.steps));
    for (const auto& step : summary["per_step"]) CHECK(step["attention_us"].get<double>() > 0.0);  // GPU time of every step

    r = cli("run --backend vulkan --tree " + (dir / "tree.json") + " --q " + (dir / "q.npy") + " --k " + (dir / "k.npy") +
            " --v " + (dir / "v.npy") + " --out " + (dir / "o_run.npy") + " --lse " + (dir / "lse_run.npy") +
            " --block-tokens 32");
    REQUIRE_MESSAGE(r.status == 0, r.output);
    for (const char* name : {"o", "lse"}) {
      CAPTURE(name);
      const HostArray demo = read_npy(dir / (std::string(name) + ".npy"));
      const HostArray run = read_npy(dir / (std::string(name) + "_run.npy"));
      REQUIRE(demo.shape == run.shape);
      float most = 0.0f;
      for (std::int64_t i = 0; i < run.numel(); ++i) {
        most = std::max(most, std::abs(load_as_float(demo.bytes.data(), demo.dtype, std::size_t(i)) -
                                       load_as_float(run.bytes.data(), run.dtype, std::size_t(i))));
      }
      CHECK(most <= 2e-3f);
    }
  }
}
#endif

#ifdef TREEATTN_TEST_HAVE_VULKAN
// The soak on the Vulkan device path (lavapipe in CI, under the validation
// layer): the checked steps agree with the CPU backend within the conformance
// tolerance, and the device memory (the runner's own buffers where, as on
// lavapipe, the device reports no heap usage) is the same at every check from
// the tenth step on: the staging and workspace are sized for the run's steps
// reserved ahead (grown as steps came, the staging was larger at step 20 than
// at step 10). lavapipe's shaders round differently from the CPU backend, so a
// tolerance of 0 must fail at the first check, naming the step, and leave no
// JSON behind.
TEST_CASE("demo soak on the Vulkan device path: checks pass within tolerance and fail past it") {
  TempDir dir;
  const std::string soak = "demo --backend vulkan --workload serving --seed 4 --steps 200 --layers 1 --live-tokens 1000 "
                           "--check-every 10 --json " + (dir / "soak.json");
  Result r = cli(soak, false, "TREEATTN_VK_VALIDATION=1 ");
  REQUIRE_MESSAGE(r.status == 0, r.output);
  CHECK(r.output.find("validation") == std::string::npos);
  const nlohmann::json summary = read_json(dir / "soak.json");
  CHECK(summary["runner"] == "Vulkan device path");
  const nlohmann::json& s = summary["soak"];
  CHECK(s["checks"] == 20);
  CHECK(s["max_o_error"].get<double>() <= 2e-3);
  CHECK(s["max_lse_error"].get<double>() <= 2e-3);
  CHECK(s["max_o_error"].get<double>() + s["max_lse_error"].get<double>() > 0.0);
  REQUIRE(s["memory_samples"].size() == 20);
  const std::int64_t first = s["memory_samples"][0]["device_bytes"];
  CHECK(first > 0);
  for (const auto& sample : s["memory_samples"]) CHECK(sample["device_bytes"] == first);
  CHECK(!s["device_bytes_after_warmup"].is_null());
  CHECK(s["graph_captures"].is_null());
  std::remove((dir / "soak.json").c_str());

  r = cli(soak + " --check-tolerance 0", true);
  CHECK(r.status == 1);
  CHECK(r.output.find("demo: step 10: layer 0's ") != std::string::npos);
  CHECK(r.output.find("differs from the CPU backend's by") != std::string::npos);
  CHECK(r.output.find("(tolerance 0; 0 checks passed before)") != std::string::npos);
  CHECK(!exists(dir / "soak.json"));
}

// The variants on the Vulkan device path: the runner copies the sinks up once
// and records every layer with them, so its steps agree with the CPU
// backend's run of the same variants (a device that dropped the sinks or the
// soft-cap would be off by far more than the tolerance).
TEST_CASE("demo soak with fp8 K/V, soft-cap and sinks on the Vulkan device path agrees with the CPU backend") {
  TempDir dir;
  HostArray sinks(DType::f32, {32});  // llama3-8b's query heads
  for (std::size_t h = 0; h < 32; ++h) store_from_float(sinks.bytes.data(), DType::f32, h, float(h % 7) - 2.0f);
  write_npy(dir / "sinks.npy", sinks.view());
  const Result r = cli("demo --backend vulkan --workload serving --seed 5 --steps 30 --layers 1 --live-tokens 1000 "
                       "--check-every 10 --kv-dtype fp8_e5m2 --softcap 5 --sinks " + (dir / "sinks.npy") +
                           " --json " + (dir / "soak.json"),
                       false, "TREEATTN_VK_VALIDATION=1 ");
  REQUIRE_MESSAGE(r.status == 0, r.output);
  CHECK(r.output.find("fp8_e5m2 K/V, soft-cap 5, sinks") != std::string::npos);
  const nlohmann::json summary = read_json(dir / "soak.json");
  CHECK(summary["runner"] == "Vulkan device path");
  CHECK(summary["soak"]["checks"] == 3);
  CHECK(summary["soak"]["max_o_error"].get<double>() <= 2e-3);
  CHECK(summary["soak"]["max_lse_error"].get<double>() <= 2e-3);
}
#endif

TEST_CASE("bf16 inputs travel as <u2 and run end to end") {
  TempDir dir;
  REQUIRE(cli("random-inputs --tree " + kExample + " --out-dir " + dir.path + " --dtype bf16").status == 0);
  const HostArray k = read_npy(dir / "k.npy");
  CHECK(k.dtype == DType::bf16);
  const Result r = cli("run --tree " + kExample + " --q " + (dir / "q.npy") + " --k " + (dir / "k.npy") + " --v " +
                       (dir / "v.npy") + " --out " + (dir / "o.npy"));
  REQUIRE_MESSAGE(r.status == 0, r.output);
  CHECK(read_npy(dir / "o.npy").shape == std::vector<std::int64_t>{5, 8, 128});
  CHECK(!exists(dir / "lse.npy"));
}

TEST_CASE("--kv-dtype, --softcap and --sinks: demo's step equals `run` with them, and both are the variants' attention") {
  TempDir dir;
  HostArray sinks(DType::f32, {32});  // llama3-8b's query heads
  for (std::size_t h = 0; h < 32; ++h) store_from_float(sinks.bytes.data(), DType::f32, h, float(h % 5) - 1.0f);
  write_npy(dir / "sinks.npy", sinks.view());
  const std::string variants = " --kv-dtype fp8_e4m3 --softcap 2 --sinks " + (dir / "sinks.npy");
  // Both on the CPU backend, named: `auto` would pick a GPU where the machine has one.
  Result r = cli("demo --backend cpu --workload fewshot --branches 3 --prompt 100 --generated 6 --layers 1 "
                 "--block-tokens 32 --bitwise-updates --dump-step 5 --dump-dir " + dir.path + variants);
  REQUIRE_MESSAGE(r.status == 0, r.output);
  CHECK(r.output.find("fp8_e4m3 K/V, soft-cap 2, sinks") != std::string::npos);
  CHECK(r.output.find("backend cpu") != std::string::npos);
  const std::string run = "run --backend cpu --tree " + (dir / "tree.json") + " --q " + (dir / "q.npy") + " --k " +
                          (dir / "k.npy") + " --v " + (dir / "v.npy") + " --out " + (dir / "o_run.npy") + " --lse " +
                          (dir / "lse_run.npy") + " --block-tokens 32";
  r = cli(run + variants);
  REQUIRE_MESSAGE(r.status == 0, r.output);
  CHECK(read_npy(dir / "o_run.npy").bytes == read_npy(dir / "o.npy").bytes);
  CHECK(read_npy(dir / "lse_run.npy").bytes == read_npy(dir / "lse.npy").bytes);

  // The snapshot's attention in double (the fp64 oracle), with the same variants.
  const Tree tree = load_tree_json(dir / "tree.json");
  HostArray q = read_npy(dir / "q.npy"), k = read_npy(dir / "k.npy", DType::fp8_e4m3),
            v = read_npy(dir / "v.npy", DType::fp8_e4m3);
  CHECK(k.dtype == DType::fp8_e4m3);
  AttentionOptions options;
  options.logit_softcap = 2.0f;
  options.sinks = sinks.view();
  const test::OracleResult want = test::oracle_attention(tree, q.view(), k.view(), v.view(), options);
  CHECK(test::max_abs_error(read_npy(dir / "o_run.npy").view(), want.o) < 2e-3);
  CHECK(test::max_abs_error(read_npy(dir / "lse_run.npy").view(), want.lse) < 2e-3);

  // --kv-dtype with K and V files of f16 (the same values): refused naming the file, not run as f16 with the flag unused.
  HostArray k16(DType::f16, k.shape), v16(DType::f16, v.shape);
  for (std::size_t i = 0; i < std::size_t(k.numel()); ++i) {
    store_from_float(k16.bytes.data(), DType::f16, i, load_as_float(k.bytes.data(), k.dtype, i));
    store_from_float(v16.bytes.data(), DType::f16, i, load_as_float(v.bytes.data(), v.dtype, i));
  }
  write_npy(dir / "k16.npy", k16.view());
  write_npy(dir / "v16.npy", v16.view());
  const std::string run16 = "run --tree " + (dir / "tree.json") + " --q " + (dir / "q.npy") + " --k " + (dir / "k16.npy") +
                            " --v " + (dir / "v16.npy") + " --out " + (dir / "o16.npy");
  CHECK(cli(run16, true).status == 0);
  r = cli(run16 + " --kv-dtype fp8_e4m3", true);
  CHECK(r.status == 1);
  CHECK(r.output.find("k16.npy: --kv-dtype fp8_e4m3 needs fp8 codes ('|u1'), the file holds f16") != std::string::npos);

  // Without the flags the same files are refused (fp8 codes need their kind), and a short sinks file is named.
  r = cli(run, true);
  CHECK(r.status == 1);
  CHECK(r.output.find("dtype '|u1' holds fp8 codes") != std::string::npos);
  write_npy(dir / "short.npy", HostArray(DType::f32, {3}).view());
  r = cli(run + " --kv-dtype fp8_e4m3 --sinks " + (dir / "short.npy"), true);
  CHECK(r.status == 1);
  CHECK(r.output.find("sinks is [3] f32, expected [32] (heads_q)") != std::string::npos);
  write_npy(dir / "sinks16.npy", HostArray(DType::f16, {32}).view());
  r = cli(run + " --kv-dtype fp8_e4m3 --sinks " + (dir / "sinks16.npy"), true);
  CHECK(r.status == 1);
  CHECK(r.output.find("sinks must be f32, got f16") != std::string::npos);
  // numpy's default float64, which the .npy reader refuses: the message names the flag.
  std::string header = "{'descr': '<f8', 'fortran_order': False, 'shape': (32,), }";
  header.resize(0x76 - 1, ' ');  // 10 + 0x76 bytes before the data: a multiple of 64
  write_file(dir / "sinks64.npy", std::string("\x93NUMPY\x01\x00\x76\x00", 10) + header + "\n" + std::string(32 * 8, '\0'));
  r = cli(run + " --kv-dtype fp8_e4m3 --sinks " + (dir / "sinks64.npy"), true);
  CHECK(r.status == 1);
  CHECK(r.output.find("--sinks takes one <f4 sink logit per query head: ") != std::string::npos);
  CHECK(r.output.find("sinks64.npy: dtype '<f8' is not supported") != std::string::npos);
  // An fp8 K file with an f16 V file: the V file is named.
  r = cli("run --backend cpu --tree " + (dir / "tree.json") + " --q " + (dir / "q.npy") + " --k " + (dir / "k.npy") +
              " --v " + (dir / "v16.npy") + " --out " + (dir / "o_mixed.npy") + " --kv-dtype fp8_e4m3",
          true);
  CHECK(r.status == 1);
  CHECK(r.output.find("v16.npy: --kv-dtype fp8_e4m3 needs fp8 codes ('|u1'), the file holds f16") != std::string::npos);
  r = cli(run + " --softcap -1", true);
  CHECK(r.status != 0);
  CHECK(r.output.find("--softcap: Value -1 must be 0 or more") != std::string::npos);
}

TEST_CASE("bench --kv-dtype fp8: rows say so and count one byte per K and V element") {
  const std::string args = "--workload random --nodes 200 --queries 30 --trees 2 --max-tokens 16 --strategy flatten "
                           "--repeat 1 --backend cpu";
  const nlohmann::json f16 = bench(args).rows;
  const nlohmann::json fp8 = bench(args + " --kv-dtype fp8_e5m2 --softcap 30").rows;
  REQUIRE(f16.size() == 1);
  REQUIRE(fp8.size() == 1);
  CHECK(fp8[0]["kv_dtype"] == "fp8_e5m2");
  CHECK(fp8[0]["logit_softcap"] == 30.0);
  CHECK(f16[0]["kv_dtype"] == "f16");
  CHECK(2 * fp8[0]["unique_kv_bytes"].get<std::int64_t>() == f16[0]["unique_kv_bytes"].get<std::int64_t>());
  CHECK(fp8[0]["run_median_us"].get<double>() > 0.0);
}
