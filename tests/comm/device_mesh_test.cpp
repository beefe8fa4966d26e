// DeviceMesh on 16 virtual ranks as 2 x 2 x 2 x 2, in several dim orders: every rank's
// coordinates follow "innermost first", and every sub-group holds exactly the ranks that
// agree with it on all other dims, in order, with the rank's coordinate as its group rank.
#include <gtest/gtest.h>

#include <mutex>

#include "backends/virtual/virtual_cluster.h"
#include "core/comm/device_mesh.h"
#include "core/error.h"
#include "tests/comm/test_util.h"

namespace llama4d {
namespace {

// Decodes rank -> coordinates for sizes listed innermost first, independently of DeviceMesh.
std::vector<int> decode(int rank, const std::vector<int>& sizes) {
  std::vector<int> c;
  for (int s : sizes) {
    c.push_back(rank % s);
    rank /= s;
  }
  return c;
}

// World ranks of every rank whose coordinates equal `mine` outside the dims in `free`.
std::vector<int> expected_members(const std::vector<int>& mine, const std::vector<int>& sizes,
                                  const std::vector<size_t>& free, int world) {
  std::vector<int> out;
  for (int r = 0; r < world; ++r) {
    const std::vector<int> c = decode(r, sizes);
    bool same = true;
    for (size_t d = 0; d < sizes.size(); ++d)
      if (std::find(free.begin(), free.end(), d) == free.end() && c[d] != mine[d]) same = false;
    if (same) out.push_back(r);
  }
  return out;
}

// The members of `g`, as world ranks, learned by an all_gather over the group itself.
std::vector<int> gathered_members(ProcessGroup& g) {
  int32_t me = g.world_rank();
  std::vector<int32_t> all(size_t(g.size()));
  g.all_gather(all.data(), &me, 1, DType::i32);
  return std::vector<int>(all.begin(), all.end());
}

class Mesh16 : public ::testing::TestWithParam<std::vector<std::string>> {};

TEST_P(Mesh16, SubGroupsMatchCoordinates) {
  const std::vector<std::string> names = GetParam();
  std::vector<MeshDim> dims;
  for (const std::string& n : names) dims.push_back({n, 2});
  const std::vector<int> sizes = {2, 2, 2, 2};
  VirtualClusterOptions o;
  o.ranks = 16;
  VirtualCluster cluster(o);
  std::mutex mu;
  std::string table;
  cluster.run([&](ProcessGroup& world) {
    DeviceMesh mesh(world, dims);
    const std::vector<int> mine = decode(world.rank(), sizes);
    EXPECT_EQ(mesh.coords(), mine);
    EXPECT_EQ(mesh.rank_of(mine), world.rank());
    for (size_t d = 0; d < names.size(); ++d) {
      ProcessGroup& g = mesh.group(names[d]);
      EXPECT_EQ(g.size(), 2);
      EXPECT_EQ(g.rank(), mine[d]) << names[d];
      EXPECT_EQ(mesh.coord(names[d]), mine[d]);
      EXPECT_EQ(g.name(), names[d]);
      const std::vector<int> want = expected_members(mine, sizes, {d}, 16);
      EXPECT_EQ(g.world_ranks(), want) << names[d];
      EXPECT_EQ(gathered_members(g), want) << names[d];
    }
    // A combination, e.g. data x context parallel ranks reducing gradients together.
    const size_t dp = size_t(mesh.dim_index("dp")), cp = size_t(mesh.dim_index("cp"));
    ProcessGroup& dpcp = mesh.group({"dp", "cp"});
    const std::vector<int> want = expected_members(mine, sizes, {dp, cp}, 16);
    EXPECT_EQ(dpcp.size(), 4);
    EXPECT_EQ(gathered_members(dpcp), want);
    // Its rank: position among the members, i.e. the two coordinates, innermost first.
    const int inner = std::min(dp, cp) == dp ? mine[dp] : mine[cp], outer = std::min(dp, cp) == dp ? mine[cp] : mine[dp];
    EXPECT_EQ(dpcp.rank(), inner + 2 * outer);
    EXPECT_EQ(&mesh.group({"cp", "dp"}), &dpcp);  // same dims in any order: the same group
    if (world.rank() == 0) {
      std::lock_guard<std::mutex> lock(mu);
      table = mesh.table();
    }
  });
  EXPECT_TRUE(test::contains(table, "rank  node"));
  EXPECT_EQ(std::count(table.begin(), table.end(), '\n'), 18);  // header, rule, 16 ranks
}

INSTANTIATE_TEST_SUITE_P(Orders, Mesh16,
                         ::testing::Values(std::vector<std::string>{"tp", "cp", "pp", "dp"},
                                           std::vector<std::string>{"dp", "pp", "cp", "tp"},
                                           std::vector<std::string>{"cp", "tp", "dp", "pp"}),
                         [](const auto& info) {
                           std::string s;
                           for (const auto& n : info.param) s += n;
                           return s;
                         });

TEST(DeviceMesh, Llama3OrderPutsTensorParallelOnANode) {
  VirtualClusterOptions o;
  o.ranks = 16;
  VirtualCluster cluster(o);
  cluster.run([](ProcessGroup& world) {
    DeviceMesh mesh(world, DeviceMesh::llama3(/*tp=*/8, /*cp=*/1, /*pp=*/1, /*dp=*/2));
    EXPECT_EQ(mesh.describe(), "tp=8 x cp=1 x pp=1 x dp=2 (innermost first)");
    ProcessGroup& tp = mesh.group("tp");
    ProcessGroup& dp = mesh.group("dp");
    for (int r : tp.world_ranks()) EXPECT_EQ(world.cluster().node_of(r), world.cluster().node_of(world.rank()));
    EXPECT_NE(world.cluster().node_of(dp.world_ranks()[0]), world.cluster().node_of(dp.world_ranks()[1]));
    EXPECT_EQ(mesh.group("cp").size(), 1);
  });
}

TEST(DeviceMesh, ParseAndErrors) {
  const std::vector<MeshDim> d = DeviceMesh::parse("tp=2,cp=1,pp=4,dp=2");
  ASSERT_EQ(d.size(), 4u);
  EXPECT_EQ(d[2].name, "pp");
  EXPECT_EQ(d[2].size, 4);
  EXPECT_THROW(DeviceMesh::parse("tp=2,,dp=2"), InputError);
  EXPECT_THROW(DeviceMesh::parse("tp=x"), InputError);
  VirtualClusterOptions o;
  o.ranks = 4;
  VirtualCluster cluster(o);
  cluster.run([](ProcessGroup& world) {
    EXPECT_THROW(DeviceMesh(world, DeviceMesh::llama3(2, 1, 1, 1)), InputError);  // 2 != 4 ranks
    EXPECT_THROW(DeviceMesh(world, {{"tp", 2}, {"tp", 2}}), InputError);
    DeviceMesh mesh(world, {{"tp", 2}, {"dp", 2}});
    EXPECT_THROW(mesh.group("pp"), InputError);
    EXPECT_THROW(mesh.coords_of(4), InputError);
  });
}

}  // namespace
}  // namespace llama4d
