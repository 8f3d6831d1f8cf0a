#include "treeattn/tree_json.hpp"

#include <cmath>
#include <limits>

#include <nlohmann/json.hpp>

#include "fail.hpp"
#include "read_file.hpp"

namespace treeattn {
namespace {

using nlohmann::json;

class Reader {
 public:
  explicit Reader(const std::string& name) : name_(name) {}

  const json& field(const json& object, const std::string& where, const char* key) const {
    auto it = object.find(key);
    if (it == object.end()) fail(ErrorCategory::Io, "{}: {}{} is missing", name_, where, key);
    return *it;
  }

  std::int64_t integer(const json& value, const std::string& path) const {
    if (value.is_number_unsigned() && value.get<std::uint64_t>() > std::uint64_t(std::numeric_limits<std::int64_t>::max())) {
      fail(ErrorCategory::Io, "{}: {} = {} is too large", name_, path, value.dump());
    }
    if (!value.is_number_integer()) {
      fail(ErrorCategory::Io, "{}: {} must be an integer, got {}", name_, path, value.dump());
    }
    return value.get<std::int64_t>();
  }

  int small_int(const json& value, const std::string& path) const {
    const std::int64_t v = integer(value, path);
    if (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max()) {
      fail(ErrorCategory::Io, "{}: {} = {} is out of range", name_, path, v);
    }
    return int(v);
  }

  const json& array(const json& value, const std::string& path) const {
    if (!value.is_array()) fail(ErrorCategory::Io, "{}: {} must be an array, got {}", name_, path, value.type_name());
    return value;
  }

  void only_keys(const json& object, const std::string& path, std::initializer_list<const char*> keys) const {
    if (!object.is_object()) fail(ErrorCategory::Io, "{}: {} must be an object, got {}", name_, path, object.type_name());
    for (auto it = object.begin(); it != object.end(); ++it) {
      bool known = false;
      for (const char* k : keys) known = known || it.key() == k;
      if (!known) fail(ErrorCategory::Io, "{}: {} has unknown key '{}'", name_, path, it.key());
    }
  }

 private:
  const std::string& name_;
};

}  // namespace

Tree parse_tree_json(const std::string& text, const std::string& name) {
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::parse_error& e) {
    fail(ErrorCategory::Io, "{}: malformed JSON at byte {}: {}", name, e.byte, e.what());
  } catch (const json::exception& e) {  // a number past a double's range (out_of_range.406)
    fail(ErrorCategory::Io, "{}: malformed JSON: {}", name, e.what());
  }
  const Reader r(name);
  r.only_keys(doc, "the top level", {"heads_q", "heads_kv", "head_dim", "head_dim_v", "scale", "nodes", "queries"});

  HeadConfig heads;
  heads.heads_q = r.small_int(r.field(doc, "", "heads_q"), "heads_q");
  heads.heads_kv = r.small_int(r.field(doc, "", "heads_kv"), "heads_kv");
  heads.head_dim = r.small_int(r.field(doc, "", "head_dim"), "head_dim");
  if (auto it = doc.find("head_dim_v"); it != doc.end()) {
    heads.head_dim_v = r.small_int(*it, "head_dim_v");
    if (heads.head_dim_v <= 0) fail(ErrorCategory::Io, "{}: head_dim_v = {} must be positive (omit it for head_dim)", name, heads.head_dim_v);
  }
  if (auto it = doc.find("scale"); it != doc.end()) {
    if (!it->is_number()) fail(ErrorCategory::Io, "{}: scale must be a number, got {}", name, it->dump());
    // Checked as a double: past a float's range the conversion is undefined, and an
    // infinite scale would be written back as null.
    const double scale = it->get<double>();
    if (!(std::abs(scale) <= double(std::numeric_limits<float>::max()))) {
      fail(ErrorCategory::Io, "{}: scale {} is not a finite float", name, it->dump());
    }
    heads.scale = float(scale);
    if (heads.scale == 0.0f) fail(ErrorCategory::Io, "{}: scale must not be 0 (omit it for 1/sqrt(head_dim))", name);
  }
  Tree tree(heads);

  const json& nodes = r.array(r.field(doc, "", "nodes"), "nodes");
  const json& queries = r.array(r.field(doc, "", "queries"), "queries");
  tree.reserve(nodes.size(), queries.size());
  std::vector<std::int64_t> slots;
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    const std::string where = fmt::format("nodes[{}]", i);
    const json& node = nodes[i];
    r.only_keys(node, where, {"id", "parent", "slots", "slot_range", "pages", "page_size", "last_page_tokens"});
    const std::int64_t id = r.integer(r.field(node, where + ".", "id"), where + ".id");
    const std::int64_t parent = r.integer(r.field(node, where + ".", "parent"), where + ".parent");
    const auto listed = node.find("slots");
    const auto range = node.find("slot_range");
    const auto pages = node.find("pages");
    if (int(listed != node.end()) + int(range != node.end()) + int(pages != node.end()) != 1) {
      fail(ErrorCategory::Io, "{}: {} needs exactly one of 'slots', 'slot_range' and 'pages'", name, where);
    }
    if (pages != node.end()) {
      r.array(*pages, where + ".pages");
      slots.clear();
      for (std::size_t p = 0; p < pages->size(); ++p) {
        slots.push_back(r.integer((*pages)[p], fmt::format("{}.pages[{}]", where, p)));
      }
      const std::int64_t page_size = r.integer(r.field(node, where + ".", "page_size"), where + ".page_size");
      const std::int64_t last = r.integer(r.field(node, where + ".", "last_page_tokens"), where + ".last_page_tokens");
      if (page_size <= 0 || page_size > (1 << 20) || last < 0 || last > page_size) {
        fail(ErrorCategory::Io, "{}: {}: page_size {} and last_page_tokens {} (1 to page_size, 0 without pages)", name,
             where, page_size, last);
      }
      tree.add_node_pages(id, parent, slots, std::int32_t(page_size), std::int32_t(last));
    } else if (listed != node.end()) {
      r.array(*listed, where + ".slots");
      slots.clear();
      for (std::size_t t = 0; t < listed->size(); ++t) {
        slots.push_back(r.integer((*listed)[t], fmt::format("{}.slots[{}]", where, t)));
      }
      tree.add_node(id, parent, slots);
    } else {
      r.array(*range, where + ".slot_range");
      if (range->size() != 2) {
        fail(ErrorCategory::Io, "{}: {}.slot_range must be [start, count], got {}", name, where, range->dump());
      }
      tree.add_node_range(id, parent, r.integer((*range)[0], where + ".slot_range[0]"),
                          r.integer((*range)[1], where + ".slot_range[1]"));
    }
  }
  for (std::size_t i = 0; i < queries.size(); ++i) {
    const std::string where = fmt::format("queries[{}]", i);
    r.only_keys(queries[i], where, {"node", "upto"});
    const std::int64_t node = r.integer(r.field(queries[i], where + ".", "node"), where + ".node");
    std::int64_t upto = kWholeNode;
    if (auto it = queries[i].find("upto"); it != queries[i].end()) {
      upto = r.integer(*it, where + ".upto");
      if (upto < 0) fail(ErrorCategory::Io, "{}: {}.upto = {} is negative", name, where, upto);
    }
    tree.add_query(node, upto);
  }
  return tree;
}

Tree load_tree_json(const std::string& path) {
  return parse_tree_json(read_file(path), path);
}

std::string tree_to_json(const Tree& tree) {
  json doc;
  doc["heads_q"] = tree.heads.heads_q;
  doc["heads_kv"] = tree.heads.heads_kv;
  doc["head_dim"] = tree.heads.head_dim;
  if (tree.heads.value_dim() != tree.heads.head_dim) doc["head_dim_v"] = tree.heads.value_dim();
  if (tree.heads.scale != 0.0f) doc["scale"] = tree.heads.scale;
  json nodes = json::array();
  for (std::size_t i = 0; i < tree.node_count(); ++i) {
    const TreeNode& n = tree.nodes()[i];
    json node = {{"id", n.id}, {"parent", n.parent}};
    if (n.page_size > 0) {
      json pages = json::array();
      for (std::int64_t p = 0; p < n.pages; ++p) pages.push_back(tree.page(i, p));
      node["pages"] = std::move(pages);
      node["page_size"] = n.page_size;
      node["last_page_tokens"] = n.pages == 0 ? 0 : n.length - (n.pages - 1) * n.page_size;
    } else if (n.listed) {
      json slots = json::array();
      for (std::int64_t t = 0; t < n.length; ++t) slots.push_back(tree.slot(i, t));
      node["slots"] = std::move(slots);
    } else {
      node["slot_range"] = {n.first, n.length};
    }
    nodes.push_back(std::move(node));
  }
  json queries = json::array();
  for (const TreeQuery& q : tree.queries()) {
    json query = {{"node", q.node}};
    if (q.upto != kWholeNode) query["upto"] = q.upto;
    queries.push_back(std::move(query));
  }
  doc["nodes"] = std::move(nodes);
  doc["queries"] = std::move(queries);
  return doc.dump() + "\n";
}

}  // namespace treeattn
