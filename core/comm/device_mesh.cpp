#include "core/comm/device_mesh.h"

#include <set>

#include "core/comm/text_table.h"
#include "core/error.h"
#include "core/parse_number.h"

namespace llama4d {

DeviceMesh::DeviceMesh(ProcessGroup& world, std::vector<MeshDim> dims) : world_(world), dims_(std::move(dims)) {
  if (dims_.empty()) throw InputError("device mesh needs at least one dim");
  if (dims_.size() > 16) throw InputError("device mesh supports at most 16 dims");
  std::set<std::string> names;
  int64_t product = 1;
  std::string shape;
  for (const MeshDim& d : dims_) {
    if (d.name.empty()) throw InputError("device mesh dims need names");
    if (!names.insert(d.name).second) throw InputError("device mesh dim '" + d.name + "' appears twice");
    if (d.size < 1) throw InputError("device mesh dim '" + d.name + "' has size " + std::to_string(d.size));
    product *= d.size;
  }
  if (product != world.size())
    throw InputError("device mesh " + describe() + " has " + std::to_string(product) + " ranks but group '" +
                     world.name() + "' has " + std::to_string(world.size()));
  coords_ = coords_of(world.rank());
  for (const MeshDim& d : dims_) group(std::string_view(d.name));
}

std::vector<MeshDim> DeviceMesh::llama3(int tp, int cp, int pp, int dp) {
  return {{"tp", tp}, {"cp", cp}, {"pp", pp}, {"dp", dp}};
}

std::vector<MeshDim> DeviceMesh::parse(std::string_view spec) {
  std::vector<MeshDim> dims;
  size_t pos = 0;
  while (pos <= spec.size()) {
    size_t end = spec.find(',', pos);
    if (end == std::string_view::npos) end = spec.size();
    const std::string_view item = spec.substr(pos, end - pos);
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos || eq == 0 || eq + 1 >= item.size())
      throw InputError("mesh '" + std::string(spec) + "': expected name=size items like tp=2,cp=1,pp=2,dp=4");
    const std::string name(item.substr(0, eq));
    const MeshDim d{name, parse_number<int>(item.substr(eq + 1), "mesh '" + std::string(spec) + "': size of '" + name + "'",
                                            1, kMaxDimSize)};
    dims.push_back(d);
    pos = end + 1;
  }
  int64_t ranks = 1;
  for (const MeshDim& d : dims)
    if ((ranks *= d.size) > kMaxDimSize)
      throw InputError("mesh '" + std::string(spec) + "' has more than " + std::to_string(kMaxDimSize) + " ranks");
  return dims;
}

int DeviceMesh::dim_index(std::string_view dim) const {
  for (size_t i = 0; i < dims_.size(); ++i)
    if (dims_[i].name == dim) return int(i);
  std::string valid;
  for (const MeshDim& d : dims_) { valid += valid.empty() ? "" : ", "; valid += d.name; }
  throw InputError("device mesh has no dim '" + std::string(dim) + "' (dims: " + valid + ")");
}

std::vector<int> DeviceMesh::coords_of(int rank) const {
  if (rank < 0 || rank >= world_.size()) throw InputError("device mesh: rank " + std::to_string(rank) + " out of range");
  std::vector<int> c(dims_.size());
  for (size_t i = 0; i < dims_.size(); ++i) {
    c[i] = rank % dims_[i].size;
    rank /= dims_[i].size;
  }
  return c;
}

int DeviceMesh::rank_of(const std::vector<int>& coords) const {
  if (coords.size() != dims_.size()) throw InputError("device mesh: need one coordinate per dim");
  int rank = 0;
  for (size_t i = dims_.size(); i-- > 0;) {
    if (coords[i] < 0 || coords[i] >= dims_[i].size)
      throw InputError("device mesh: coordinate " + std::to_string(coords[i]) + " outside dim '" + dims_[i].name + "'");
    rank = rank * dims_[i].size + coords[i];
  }
  return rank;
}

unsigned DeviceMesh::mask_of(const std::vector<std::string>& dims) const {
  if (dims.empty()) throw InputError("device mesh: a group needs at least one dim");
  unsigned mask = 0;
  for (const std::string& d : dims) mask |= 1u << dim_index(d);
  return mask;
}

std::string DeviceMesh::name_of(unsigned mask) const {
  std::string name;
  for (size_t i = 0; i < dims_.size(); ++i)
    if (mask & (1u << i)) { name += name.empty() ? "" : "+"; name += dims_[i].name; }
  return name;
}

std::vector<int> DeviceMesh::group_ranks(const std::vector<std::string>& dims) const {
  const unsigned mask = mask_of(dims);
  // Walk every rank of the mesh in rank order and keep those agreeing with us off the mask.
  std::vector<int> ranks;
  for (int r = 0; r < world_.size(); ++r) {
    const std::vector<int> c = coords_of(r);
    bool same = true;
    for (size_t i = 0; i < dims_.size() && same; ++i)
      if (!(mask & (1u << i))) same = c[i] == coords_[i];
    if (same) ranks.push_back(r);
  }
  return ranks;
}

ProcessGroup& DeviceMesh::group(std::string_view dim) { return group(std::vector<std::string>{std::string(dim)}); }

ProcessGroup& DeviceMesh::group(const std::vector<std::string>& dims) {
  const unsigned mask = mask_of(dims);
  auto it = groups_.find(mask);
  if (it == groups_.end())
    it = groups_.emplace(mask, world_.new_group(group_ranks(dims), name_of(mask))).first;
  return *it->second;
}

ProcessGroup& DeviceMesh::group(std::initializer_list<std::string_view> dims) {
  std::vector<std::string> v;
  for (std::string_view d : dims) v.emplace_back(d);
  return group(v);
}

std::string DeviceMesh::describe() const {
  std::string s;
  for (const MeshDim& d : dims_) { s += s.empty() ? "" : " x "; s += d.name + "=" + std::to_string(d.size); }
  return s + " (innermost first)";
}

std::string DeviceMesh::table() const {
  std::vector<std::vector<std::string>> rows(1);
  rows[0] = {"rank", "node"};
  for (const MeshDim& d : dims_) rows[0].push_back(d.name);
  for (int r = 0; r < world_.size(); ++r) {
    std::vector<std::string> row = {std::to_string(r),
                                    std::to_string(world_.cluster().node_of(world_.world_ranks()[size_t(r)]))};
    for (int c : coords_of(r)) row.push_back(std::to_string(c));
    rows.push_back(row);
  }
  return format_table(rows);
}

}  // namespace llama4d
