// treeattn run: tree JSON + Q/K/V .npy -> O (and LSE) .npy

#include <memory>
#include <utility>

#include <fmt/format.h>

#include "attention_flags.hpp"
#include "cli_support.hpp"
#include "commands.hpp"
#include "treeattn/tools.hpp"
#include "treeattn/treeattn.hpp"

namespace treeattn::cli {
namespace {

struct RunOptions {
  std::string tree, q, k, v, out, lse;
  std::string backend = "auto";
  PlanFlags plan;
  BackendFlags backend_flags;
  AttentionFlags attention;
  bool verbose = false;
};

void run(const RunOptions& o) {
  const Tree tree = load_tree_json(o.tree);
  HostArray q = read_npy(o.q), k = read_npy(o.k, o.attention.fp8()), v = read_npy(o.v, o.attention.fp8());
  // --kv-dtype names the kind of the files' fp8 codes: files of another dtype would run without it, the flag unused.
  for (const auto& [path, kv] : {std::pair{&o.k, &k}, std::pair{&o.v, &v}}) {
    if (o.attention.fp8() && kv->dtype != *o.attention.fp8()) {
      throw Error(ErrorCategory::InvalidArgument,
                  fmt::format("{}: --kv-dtype {} needs fp8 codes ('|u1'), the file holds {}", *path,
                              o.attention.kv_dtype, to_string(kv->dtype)));
    }
  }
  if (k.shape.size() != 3) {
    throw Error(ErrorCategory::InvalidArgument,
                fmt::format("{}: K is {}, expected [slots, heads_kv, head_dim]", o.k, describe(k.view())));
  }

  BackendOptions backend_options = o.backend_flags.options;
  backend_options.verbose = o.verbose;
  BackendKind kind = parse_backend(o.backend);
  if (kind == BackendKind::automatic) kind = automatic_for(q.dtype);
  std::unique_ptr<Backend> backend = make_backend(kind, backend_options);
  HostArray sinks = o.attention.read_sinks();
  const AttentionOptions variants = o.attention.options(sinks);
  const Plan plan = Planner(o.plan.plan_threads).plan(tree, o.attention.planned_for(o.plan.options(k.shape[0], backend->cost_model())));

  const std::int64_t nq = plan.num_queries, hq = plan.heads.heads_q, dv = plan.heads.value_dim();
  HostArray out(DType::f32, {nq, hq, dv});
  HostArray lse(DType::f32, {nq, hq});
  if (o.verbose) {
    const PlanStats st = compute_stats(plan);
    fmt::print(stderr, "treeattn run: backend {}, strategy {}, {} queries, {} tokens, {} work items\n",
               backend->name(), to_string(plan.strategy), nq, st.tokens, st.items);
  }
  backend->run(plan, AttentionArgs{q.view(), k.view(), v.view(), out.view(), lse.view(), variants});

  PendingOutputs outputs;
  outputs.write_npy(o.out, out.view());
  if (!o.lse.empty()) outputs.write_npy(o.lse, lse.view());
  outputs.commit();
}

}  // namespace

Command add_run_command(CLI::App& app) {
  auto o = std::make_shared<RunOptions>();
  CLI::App* sub = app.add_subcommand(
      "run",
      "Compute tree attention for every query of a tree file.\n"
      "Q is [queries, heads_q, head_dim]; K [slots, heads_kv, head_dim] and V [slots, heads_kv, head_dim_v]\n"
      "are the KV pool whose rows the tree's slots index (head_dim_v: the tree's, else head_dim); all three\n"
      "share one dtype (<f2, <f4, or <u2 holding bf16), or K and V hold fp8 codes (|u1, --kv-dtype).\n"
      "Writes O as <f4 [queries, heads_q, head_dim_v] and LSE (natural log) as <f4 [queries, heads_q].\n"
      "On any error nothing is written and the exit status is 1.\n"
      "Example: treeattn run --tree examples/fewshot.json --q q.npy --k k.npy --v v.npy --out o.npy");
  sub->add_option("--tree", o->tree, "Tree JSON (heads, nodes with slots, queries)")->required();
  sub->add_option("--q", o->q, "Queries .npy [queries, heads_q, head_dim]")->required();
  sub->add_option("--k", o->k, "Keys .npy [slots, heads_kv, head_dim]")->required();
  sub->add_option("--v", o->v, "Values .npy [slots, heads_kv, head_dim_v]")->required();
  sub->add_option("--out", o->out, "Output O .npy (<f4)")->required();
  sub->add_option("--lse", o->lse, "Also write the log-sum-exp .npy (<f4)");
  sub->add_option("--backend", o->backend, "auto picks CUDA, then Vulkan (f16/bf16 only), then the CPU")
      ->check(CLI::IsMember(backend_names()))
      ->capture_default_str();
  o->plan.add_to(*sub);
  o->backend_flags.add_to(*sub);
  o->attention.add_to(*sub, "K and V .npy files hold fp8 codes (|u1) of this kind (Q f16 or bf16)");
  sub->add_flag("--verbose", o->verbose,
                "Say which backend ran (device; kernel variant, registers, occupancy) and the size of the plan");
  return {sub, [o] { run(*o); }};
}

}  // namespace treeattn::cli
