#pragma once
// DeviceMesh: the ranks of a group arranged as an N-dimensional grid with named dims, handing
// out the sub-group along any dim or combination of dims. Dims are listed innermost first:
//   rank = c[0] + size[0] * (c[1] + size[1] * (c[2] + ...))
// so consecutive ranks differ in the first dim. Llama 3's order is [tp, cp, pp, dp]: tensor
// parallelism innermost, on neighbouring GPUs of one node (NVLink); data parallelism outermost,
// across nodes. With 16 ranks as tp=2, cp=2, pp=2, dp=2, rank 13 = 1 + 2*(0 + 2*(1 + 2*1)) has
// tp=1, cp=0, pp=1, dp=1, and its tp group is {12, 13}, its dp group {5, 13}.
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/comm/process_group.h"

namespace llama4d {

struct MeshDim {
  std::string name;
  int size = 1;
};

class DeviceMesh {
 public:
  // Collective over `world`: every member constructs it with the same dims (product == world
  // size), and it creates every rank's sub-group for each single dim.
  DeviceMesh(ProcessGroup& world, std::vector<MeshDim> dims_innermost_first);

  // Llama 3's [tp, cp, pp, dp], innermost first.
  static std::vector<MeshDim> llama3(int tp, int cp, int pp, int dp);
  // "tp=2,cp=1,pp=2,dp=4": dims innermost first, as written; each size read by
  // core/parse_number.h's rule, in [1, kMaxDimSize], and the sizes' product too. InputError on
  // malformed text, naming the dim.
  static constexpr int kMaxDimSize = 1'000'000;
  static std::vector<MeshDim> parse(std::string_view spec);

  ProcessGroup& world() const { return world_; }
  const std::vector<MeshDim>& dims() const { return dims_; }
  int dim_index(std::string_view dim) const;  // InputError naming the valid dims
  int size(std::string_view dim) const { return dims_[size_t(dim_index(dim))].size; }
  int coord(std::string_view dim) const { return coords_[size_t(dim_index(dim))]; }
  const std::vector<int>& coords() const { return coords_; }
  std::vector<int> coords_of(int rank) const;      // rank of world -> coordinates
  int rank_of(const std::vector<int>& coords) const;  // coordinates -> rank of world

  // The ranks (of world) that share this rank's coordinates on every dim except `dims`, in
  // rank order: the members of group(dims).
  std::vector<int> group_ranks(const std::vector<std::string>& dims) const;
  // The sub-group along one dim; its rank() equals coord(dim).
  ProcessGroup& group(std::string_view dim);
  // The sub-group along several dims at once (e.g. {"dp", "cp"} for gradient reduction over
  // data and context parallel ranks). Created on first use: every rank must make that first
  // call (collectively), as with new_group.
  ProcessGroup& group(const std::vector<std::string>& dims);
  ProcessGroup& group(std::initializer_list<std::string_view> dims);  // mesh.group({"dp", "cp"})

  // "tp=2 x cp=2 x pp=2 x dp=2 (innermost first)"
  std::string describe() const;
  // One row per rank: rank, node, coordinate per dim.
  std::string table() const;

 private:
  unsigned mask_of(const std::vector<std::string>& dims) const;
  std::string name_of(unsigned mask) const;

  ProcessGroup& world_;
  std::vector<MeshDim> dims_;
  std::vector<int> coords_;
  std::map<unsigned, std::shared_ptr<ProcessGroup>> groups_;  // by bit mask of dims
};

}  // namespace llama4d
