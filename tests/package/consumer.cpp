#include <treeattn/tools.hpp>
#include <treeattn/treeattn.hpp>

#include <cmath>
#include <cstdio>

int main() {
  treeattn::Tree tree({4, 2, 64});
  tree.add_node_range(0, treeattn::kNoParent, 0, 100);
  tree.add_node_range(1, 0, 100, 10);
  tree.add_node_range(2, 0, 110, 10);
  tree.add_query(1);
  tree.add_query(2);
  treeattn::Context ctx;
  const treeattn::Plan plan = ctx.plan(tree);
  treeattn::HostArray q = treeattn::random_array(treeattn::DType::f16, {2, 4, 64}, 1);
  treeattn::HostArray k = treeattn::random_array(treeattn::DType::f16, {120, 2, 64}, 2);
  treeattn::HostArray v = treeattn::random_array(treeattn::DType::f16, {120, 2, 64}, 3);
  treeattn::HostArray o(treeattn::DType::f32, {2, 4, 64});
  ctx.run(plan, {q.view(), k.view(), v.view(), o.view(), {}});
  const float first = static_cast<const float*>(static_cast<const void*>(o.bytes.data()))[0];
  std::printf("consumer: %d work items, O[0] = %f\n", plan.num_items(), first);
  return std::isfinite(first) ? 0 : 1;
}
