#pragma once
// The Plan: the backend-neutral contract between the host planner and every
// kernel. It is built once per decode step (plan()), uploaded once and read by
// every layer. All arrays are flat and index-based (no pointers), so a backend
// copies them to the device verbatim.
//
// Vocabulary
//   token      a visible tree token, numbered in the plan's flattened order
//              (depth-first over the forest, roots and children in input order).
//              Tokens that no query can see are left out. token_slot[t] is the
//              KV-pool row that holds it.
//   segment    a run of consecutive tokens [segment_token_begin, segment_token_end)
//              inside one node whose set of viewing queries is constant.
//   KV block   up to block_tokens tokens: the segments a kernel gathers into fast
//              memory once (block_segment_begin is its CSR into the segments).
//   work item  one KV block with one query tile of up to query_tile (<= 64)
//              queries. For each segment of its block the item has one uint64
//              mask: bit j set <=> tile query j attends that segment. When more
//              than query_tile queries share a block, its items are adjacent, so
//              a kernel may keep the block on chip while it walks their tiles.
//              A kernel computes, for each KV head and each of its query heads,
//              the softmax-normalised partial output over the masked tokens and
//              its log-sum-exp (natural log, scale applied to the logits).
//   tile rows  how many query rows (queries x the group's query heads) one kernel
//              pass of an item takes: kLargeTileRows or kSmallTileRows
//              (cost_model.hpp). A kernel runs ceil(rows / tile rows) passes per
//              item and KV head, each re-reading the block (from L2); small
//              tiles split the KV tile over the warps instead of padding rows.
//              A backend may take fewer rows a pass than a large tile where its
//              kernel cannot take more (never fewer than kSmallTileRows): its
//              passes are then min(tile rows, its rows a pass) rows each. The
//              CUDA kernels and the Vulkan cooperative-matrix shaders take
//              either tile; the Vulkan scalar shader takes 16 rows a pass.
//              Every backend's passes come from one lowering (engine/src/lowering.hpp).
//   partial    where a tile query's result goes: tile_partial[k] is a slot of
//              the fp32 partial buffers (O_part [num_partials, heads_q, head_dim_v],
//              LSE_part [num_partials, heads_q]), or kDirect when that item is the
//              query's only contributor and writes O and LSE itself.
//   reduction  merge_begin/merge_partial: CSR from each query to its partial
//              slots in a fixed order (ascending). Stage 2 merges them with the
//              max-shifted log-sum-exp rule in exactly that order, so the output
//              is bitwise deterministic. Queries with an empty range were
//              written directly by stage 1.

#include <cstdint>
#include <string>
#include <vector>

#include "treeattn/cost_model.hpp"
#include "treeattn/tree.hpp"

namespace treeattn {

enum class Strategy {
  flatten,     // DeFT-Flatten: depth-first flatten, even blocks across nodes
  node,        // DeFT-Node: one group per node, cut at block_tokens
  node_chunk,  // DeFT-Node-Chunk: each node cut into even chunks
  sequence,    // Q-guided baseline (Flash-Decoding): each query reads its whole path
  cascade,     // one group per tree level, each level cut into even blocks
  greedy,      // FastTree: cost-model grouping (parent KV concatenated into children
               // where that saves more than it costs), long-context splitting
};

const char* to_string(Strategy s) noexcept;
// Parses "flatten", "node", ...; throws InvalidArgument naming the choices.
Strategy parse_strategy(const std::string& name);
const std::vector<Strategy>& all_strategies() noexcept;

inline constexpr int kMaxQueryTile = 64;  // bits in a segment mask
inline constexpr std::int32_t kDirect = -1;

struct Plan {
  // What it was planned for.
  HeadConfig heads;              // scale already resolved (never 0)
  std::int32_t num_queries = 0;
  Strategy strategy = Strategy::flatten;
  std::int32_t block_tokens = 0;  // max tokens per KV block
  std::int32_t query_tile = 0;    // max queries per work item (<= kMaxQueryTile)
  std::int64_t min_kv_slots = 0;  // K and V need at least this many rows

  // Tokens.
  std::vector<std::int32_t> token_slot;  // [num_tokens] KV-pool row of each token

  // Segments and KV blocks.
  std::vector<std::int32_t> segment_token_begin;  // [num_segments]
  std::vector<std::int32_t> segment_token_end;    // [num_segments]
  std::vector<std::int32_t> segment_node;         // [num_segments] tree node index (insertion
                                                  // order); for diagnostics and drawing only
  std::vector<std::int32_t> block_segment_begin;  // [num_blocks + 1]

  // Work items.
  std::vector<std::int32_t> item_block;        // [num_items]
  std::vector<std::int32_t> item_query_begin;  // [num_items + 1] CSR into tile_query
  std::vector<std::int32_t> item_mask_begin;   // [num_items] first mask of the item;
                                               // masks follow its block's segments
  std::vector<std::int32_t> item_tile_rows;    // [num_items] kLargeTileRows or kSmallTileRows
  std::vector<std::uint64_t> segment_mask;     // [sum over items of its block's segments]
  std::vector<std::int32_t> tile_query;        // query index (row of Q) per tile entry
  std::vector<std::int32_t> tile_partial;      // partial slot per tile entry, or kDirect

  // Reduction.
  std::int32_t num_partials = 0;
  std::vector<std::int32_t> merge_begin;    // [num_queries + 1] CSR into merge_partial
  std::vector<std::int32_t> merge_partial;  // partial slots, ascending per query (the planner
                                            // numbers them query by query: 0, 1, 2, ...)

  // Launch order: the items in the order a backend launches their passes,
  // or empty for item order. A permutation that keeps each block's items
  // together and in item order. The planner sets it where its cost model
  // predicts the blocks with the longest passes, launched first, finish sooner
  // (CostModel::reorder_gain). No result depends on it: every item writes its
  // own partials and the merge folds them in merge_partial's order.
  std::vector<std::int32_t> launch_order;

  // Which plan this is, for a device workspace that keeps the last plan it
  // uploaded: plan() and IncrementalPlanner::update() give every plan they
  // make a new id (new_plan_id()); a copy keeps it. A plan edited by hand
  // takes a new one, or 0, which every call that runs it uploads again.
  std::uint64_t id = 0;

  std::int32_t num_tokens() const noexcept { return std::int32_t(token_slot.size()); }
  std::int32_t num_segments() const noexcept { return std::int32_t(segment_token_begin.size()); }
  std::int32_t num_blocks() const noexcept {
    return block_segment_begin.empty() ? 0 : std::int32_t(block_segment_begin.size() - 1);
  }
  std::int32_t num_items() const noexcept { return std::int32_t(item_block.size()); }

  // Tokens in a KV block.
  std::int32_t block_token_count(std::int32_t block) const noexcept;
  // The most partials any one query merges (0 when none has partials).
  std::int32_t max_merge_fanin() const noexcept;
  // merge_partial is 0, 1, 2, ... (the planner numbers partials query by
  // query), so a merge may take a query's partials from merge_begin alone.
  bool merge_in_order() const noexcept;
  // The item launched `k`-th.
  std::int32_t launch_item(std::int32_t k) const noexcept {
    return launch_order.empty() ? k : launch_order[std::size_t(k)];
  }
};

// A number no plan of this process had before (never 0).
std::uint64_t new_plan_id() noexcept;

// Each work item's tokens as a kernel streams them in tiles of `align` tokens
// (1 to 64): the KV-pool slot and the item's segment mask of every token, so
// one aligned load of a tile's map gives both and no block-sized table has to
// sit in fast memory; and per tile the same masks query by query, so a thread
// holding one query row tests each of its tokens with one bit of one word.
// Every item is padded to a multiple of `align` tokens with slot -1 and mask 0:
// the kernel reads whole tiles and learns where the item ends from the slots.
struct ItemTokenMap {
  std::vector<std::int32_t> begin;     // [num_items + 1] CSR, multiples of align
  std::vector<std::int32_t> slot;      // KV-pool row, or -1 past the item's tokens
  std::vector<std::uint64_t> mask;     // bit j <=> tile query j sees the token
  std::vector<std::uint64_t> visible;  // [tiles x 64]: word j of a tile, bit k <=> tile query j sees its token k
};
ItemTokenMap item_token_map(const Plan& plan, std::int32_t align);

// Throws InvalidPlan naming the first inconsistency (array sizes, CSR order,
// ranges, mask bits beyond the tile, partial slots not used exactly once,
// reduction lists that disagree with the tiles, a launch order that is not a
// permutation keeping each block's items together in item order).
void validate(const Plan& plan);

// Figures a person or a benchmark reads off a plan.
struct PlanStats {
  std::int64_t tokens = 0;     // unique visible tree tokens
  std::int64_t segments = 0;
  std::int64_t blocks = 0;
  std::int64_t items = 0;
  std::int64_t partials = 0;
  std::int64_t direct_queries = 0;  // queries written by stage 1 alone
  std::int64_t passes = 0;          // kernel passes per KV head (items x their row passes)
  std::int64_t small_tile_items = 0;
  std::int32_t block_tokens_min = 0, block_tokens_max = 0;  // load balance over items
  double block_tokens_mean = 0.0;
  std::int32_t item_queries_min = 0, item_queries_max = 0;
  double item_queries_mean = 0.0;
  // IO model, in KV tokens (K and V rows of all KV heads are read together).
  std::int64_t plan_read_tokens = 0;      // per block once (tiles of a block share it)
  std::int64_t sequence_read_tokens = 0;  // a Q-guided kernel: every query its whole path
  // Bytes for a KV element size (2 for f16/bf16): tokens * heads_kv * (head_dim + head_dim_v) * elem_bytes (K and V).
  std::int64_t kv_bytes(std::int64_t token_count, std::size_t elem_bytes) const noexcept;
  std::int32_t heads_kv = 0, head_dim = 0, head_dim_v = 0;
};

PlanStats compute_stats(const Plan& plan);

}  // namespace treeattn
