// Symmetric memory for node-local MPI groups: ProcessGroup::allocate_symmetric as an MPI-3
// shared-memory window (MPI_Win_allocate_shared), so every member maps every member's segment
// and the node-local collectives read and write peers' buffers in place (mpi_single_copy.cpp).
//
// Allocation is collective, so the group's list of windows is the same on every member and a
// window is named by its index. Dropping a pointer is local (it may happen on any thread, in any
// order): it only marks the window unused. At the next allocation the members agree on which
// windows all of them dropped, reuse the first one that fits every member and free the others, all in the
// same order everywhere. Members may ask for different sizes (uneven shards).
#include <algorithm>

#include "backends/mpi/mpi_internal.h"
#include "core/error.h"

namespace llama4d::mpi_detail {

namespace {

constexpr uintptr_t kAlign = 64;  // ProcessGroup::allocate_symmetric's promise

}  // namespace

void SymmetricWindow::free() {
  if (win == MPI_WIN_NULL) return;
  MPI_Win_unlock_all(win);
  MPI_Win_free(&win);
  win = MPI_WIN_NULL;
  segment.clear();
}

std::shared_ptr<void> MpiProcessGroup::make_symmetric(int64_t bytes) {
  if (!node_local_ || size() == 1) return ProcessGroup::make_symmetric(bytes);
  std::shared_ptr<SymmetricWindow> chosen;
  auto self = shared_from_this();
  s_.stream
      .submit("allocate_symmetric(" + std::to_string(bytes) + " bytes) on group '" + name() + "'",
              [self, bytes, &chosen] {
                MpiProcessGroup& g = *self;
                // Per window: dropped by this member, and dropped and large enough for its request
                // (sizes may differ between members). The minimum over members decides.
                const size_t nw = g.symmetric_.size();
                std::vector<int> flags(2 * nw);
                for (size_t i = 0; i < nw; ++i) {
                  flags[i] = g.symmetric_[i]->in_use ? 0 : 1;
                  flags[nw + i] = flags[i] && g.symmetric_[i]->bytes >= bytes ? 1 : 0;
                }
                if (nw > 0)
                  check_mpi(MPI_Allreduce(MPI_IN_PLACE, flags.data(), int(flags.size()), MPI_INT, MPI_MIN, g.coll_),
                            "MPI_Allreduce");
                const int* unused = flags.data();
                int best = -1;
                for (size_t i = 0; i < nw && best < 0; ++i)
                  if (flags[nw + i]) best = int(i);
                if (best >= 0) chosen = g.symmetric_[size_t(best)];
                std::vector<std::shared_ptr<SymmetricWindow>> kept;
                for (size_t i = 0; i < nw; ++i) {
                  const std::shared_ptr<SymmetricWindow>& w = g.symmetric_[i];
                  if (!unused[i] || int(i) == best) {
                    kept.push_back(w);
                    continue;
                  }
                  w->free();  // every member frees the same windows in the same order
                  auto& all = g.s_.windows;
                  all.erase(std::remove(all.begin(), all.end(), w), all.end());
                }
                g.symmetric_ = std::move(kept);
                if (chosen) {
                  chosen->in_use = true;
                  return;
                }
                auto w = std::make_shared<SymmetricWindow>();
                MPI_Info info;
                MPI_Info_create(&info);
                // Each segment on its own pages (the member's NUMA node), not one contiguous block.
                MPI_Info_set(info, "alloc_shared_noncontig", "true");
                char* base = nullptr;
                // Room to align every segment to 64 bytes: MPI only promises 8. Shared pages map at
                // the same offset within a page in every process, so each one aligns alike.
                const int rc = MPI_Win_allocate_shared(MPI_Aint(bytes + kAlign), 1, info, g.coll_, &base, &w->win);
                MPI_Info_free(&info);
                check_mpi(rc, "MPI_Win_allocate_shared of " + std::to_string(bytes) + " bytes");
                w->bytes = bytes;
                w->segment.assign(size_t(g.size()), nullptr);
                for (int r = 0; r < g.size(); ++r) {
                  MPI_Aint seg_size = 0;
                  int disp = 0;
                  char* seg = nullptr;
                  check_mpi(MPI_Win_shared_query(w->win, r, &seg_size, &disp, &seg), "MPI_Win_shared_query");
                  const uintptr_t a = reinterpret_cast<uintptr_t>(seg);
                  w->segment[size_t(r)] = seg + ((kAlign - a % kAlign) % kAlign);
                }
                // A passive-target epoch for the window's lifetime; the collectives' barriers order
                // the loads and stores.
                check_mpi(MPI_Win_lock_all(MPI_MODE_NOCHECK, w->win), "MPI_Win_lock_all");
                g.symmetric_.push_back(w);
                g.s_.windows.push_back(w);
                chosen = std::move(w);
              })
      ->wait();
  char* mine = chosen->segment[size_t(rank())];
  return std::shared_ptr<void>(mine, [chosen](void*) { chosen->in_use = false; });
}

std::pair<int32_t, int64_t> MpiProcessGroup::find_symmetric(const void* p, int64_t bytes) const {
  const char* c = static_cast<const char*>(p);
  for (size_t i = 0; i < symmetric_.size(); ++i) {
    const SymmetricWindow& w = *symmetric_[i];
    const char* base = w.segment[size_t(rank())];
    if (w.in_use && c >= base && c + bytes <= base + w.bytes) return {int32_t(i), int64_t(c - base)};
  }
  return {-1, 0};
}

}  // namespace llama4d::mpi_detail
