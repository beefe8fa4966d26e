// Lesson 02: ZeRO-1/2/3 (FSDP) and HSDP. The flat parameter buffer is cut into per-rank pieces;
// rank r keeps only its pieces of the optimizer state (ZeRO-1), also of the gradients (ZeRO-2),
// also of the parameters (ZeRO-3 = FSDP). HSDP shards inside a group and replicates the groups.
// The program shows who owns which piece, what each collective moved, per-rank memory by
// category, checks the README's formulas against the measurements, and proves equivalence.
//   lesson02_zero [--zero 3] [--keep-params] [--ranks 4] [--replicas 2] [--step] [--json]
#include <algorithm>
#include <map>
#include <utility>
#include <nlohmann/json.hpp>

#include "core/comm/text_table.h"
#include "core/comm/traffic_labels.h"
#include "core/data/dataset.h"
#include "core/model/params.h"
#include "core/parallel/shard_layout.h"
#include "lessons/common/clock.h"
#include "lessons/common/lesson.h"

namespace llama4d::lesson {
namespace {

struct ZeroArgs {
  int zero = 3;
  bool keep_params = false;
  int replicas = 1;
};

// The README's shard rule, written independently of ShardLayout (the exercises compare them):
// segment of `len` elements over n ranks, piece size P = ceil(len / n) rounded up to a multiple
// of 512; rank j owns [j*P, (j+1)*P) clipped to the segment, so the last pieces are short or empty.
int64_t piece_size(int64_t len, int n) { return ((len + n - 1) / n + kShardAlign - 1) / kShardAlign * kShardAlign; }
int64_t piece_numel(int64_t len, int n, int j) {
  return std::clamp<int64_t>(len - int64_t(j) * piece_size(len, n), 0, piece_size(len, n));
}
std::vector<int64_t> pieces_of(int64_t len, int n) {
  std::vector<int64_t> c;
  for (int j = 0; j < n; ++j) c.push_back(piece_numel(len, n, j));
  return c;
}

// The embedding and the head (norm + lm_head) are the "root" units FSDP keeps gathered from
// forward to backward; the blocks are resharded after their forward.
bool is_block(const Segment& s, size_t num_segments) { return s.unit > 0 && s.unit + 1 < int(num_segments); }

std::string segment_name(const Segment& s, size_t num_segments) {
  if (is_block(s, num_segments)) return "layer " + std::to_string(s.unit - 1);
  return s.unit == 0 ? "embedding" : "norm + lm_head";
}

// Which piece of each segment each shard rank owns (elements), and the padding n*S - len.
std::string shard_map(const ShardLayout& layout) {
  const int n = layout.num_shards();
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> head = {"segment", "flat range", "numel", "piece P"};
  for (int j = 0; j < n; ++j) head.push_back("shard " + std::to_string(j));
  head.push_back("padding");
  rows.push_back(head);
  for (size_t k = 0; k < layout.segments().size(); ++k) {
    const Segment& s = layout.segments()[k];
    std::vector<std::string> row = {segment_name(s, layout.segments().size()), "[" + grouped(s.begin) + ", " + grouped(s.end) + ")",
                                    grouped(s.numel()), grouped(layout.piece_size(k))};
    for (int j = 0; j < n; ++j) row.push_back(grouped(layout.piece(k, j).numel()));
    row.push_back(grouped(n * layout.piece_size(k) - s.numel()));
    rows.push_back(row);
  }
  std::vector<std::string> total = {"shard total", "", "", ""};
  for (int j = 0; j < n; ++j) total.push_back(grouped(layout.shard_numel(j)));
  rows.push_back(total);
  return format_table(rows);
}

// The shard map for the JSON summary: each segment's flat range, piece size and pieces.
nlohmann::json shard_map_json(const ShardLayout& layout) {
  const std::vector<Segment>& segs = layout.segments();
  nlohmann::json shards = nlohmann::json::array();
  for (size_t k = 0; k < segs.size(); ++k)
    shards.push_back({{"segment", segment_name(segs[k], segs.size())},
                      {"begin", segs[k].begin},
                      {"end", segs[k].end},
                      {"piece_size", layout.piece_size(k)},
                      {"pieces", layout.piece_counts(k)}});
  return shards;
}

// The exercises' questions, asked (with --step) before the phase whose tables answer them. The
// numbers stay the same in every configuration: Z8 is HSDP's and appears only with --replicas.
const std::string& question(const std::string& id) {
  static const std::map<std::string, std::string> questions = {
      {"Z1", "How many elements of the flat buffer does rank 0 own (its shard)?"},
      {"Z2", "How many bytes of AdamW state does rank 0 hold?"},
      {"Z3", "How much model state (params + grads + AdamW) does rank 0 keep between steps, in bytes?"},
      {"Z4", "How many bytes is the communication buffer rank 0 keeps?"},
      {"Z5", "What is the peak of parameter memory on rank 0, in bytes?"},
      {"Z6", "What is the peak of gradient memory on rank 0, in bytes?"},
      {"Z7", "How many bytes does rank 0 send per step to reduce the gradients?"},
      {"Z8", "HSDP: how many bytes does rank 0 send to sum its shard across the replicas?"},
      {"Z9", "How many bytes does rank 0 send per step to all-gather parameters?"},
      {"Z10", "How many bytes does rank 0 send per step for the gradient norm (clipping)?"},
      {"Z11", "How many bytes does rank 0 send in all, per step?"},
      {"Z12", "ZeRO-3 without prefetching: how long are rank 0's links busy per step (ns)?"},
      {"Z13", "How much exposed communication does prefetching save rank 0 per step (ns)?"}};
  return questions.at(id);
}

// Predict, then see: the questions of `ids`, then (with --step) a blank line before the tables.
void ask(Narrator& say, bool step, const std::vector<std::string>& ids) {
  for (const std::string& id : ids) say.ask(id, question(id));
  if (step) say.say("\n");
}

// The run and its shape: n shard ranks x q replicas = W world ranks at ZeRO stage `stage`, M
// micro-batches per rank and step, N parameters in L layers; `layout` cuts every segment into
// the n pieces the strategy uses.
struct ZeroRun {
  RunSetup s;
  ShardLayout layout;
  int n, q, W, stage;
  int64_t N, M, L;
  bool reshard;  // ZeRO-3: free a block's gathered parameters after its forward
  const std::vector<Segment>& segs() const { return layout.segments(); }
};

ZeroRun zero_run(const LessonOptions& o, const ZeroArgs& z) {
  if (z.replicas < 1 || o.ranks % z.replicas != 0)
    throw InputError("--replicas " + std::to_string(z.replicas) + " must divide --ranks " + std::to_string(o.ranks));
  RunSetup s;
  s.model = LlamaConfig::preset(o.preset);
  s.train = o.train_options();
  s.plan = ParallelPlan::parse(z.replicas > 1 ? "dp_shard=" + std::to_string(o.ranks / z.replicas) +
                                                     ",dp_replicate=" + std::to_string(z.replicas)
                                               : "dp=" + std::to_string(o.ranks));
  s.plan.zero = ZeroStage(z.zero);
  s.plan.reshard_after_forward = !z.keep_params;
  s.plan.validate();
  s.cluster = o.cluster_options();
  ShardLayout layout(llama_param_specs(s.model), s.plan.dp_shard());
  const int n = s.plan.dp_shard(), q = s.plan.dp_replicate(), W = s.plan.world_size();
  const int64_t N = s.model.num_parameters(), M = o.micro_batches, L = s.model.num_hidden_layers;
  const bool reshard = s.plan.reshard_after_forward;
  return {std::move(s), std::move(layout), n, q, W, z.zero, N, M, L, reshard};
}

// ---- Phases ------------------------------------------------------------------------------------

void show_mesh_and_batch(Narrator& say, const LessonOptions& o, const ZeroRun& z, const TextDataset& data) {
  say.phase("the mesh and the batch",
            "core/parallel/parallel_trainer.cpp: ParallelTrainer::ParallelTrainer() builds the data, shard and "
            "replica groups from the mesh");
  say.say("Model '" + o.preset + "': N = " + grouped(z.N) + " parameters (4N = " + grouped(4 * z.N) + " bytes in fp32). " +
          z.s.plan.data_parallel().describe() + " over " + std::to_string(z.n) + " shard ranks" +
          (z.q > 1 ? " x " + std::to_string(z.q) + " replicas (HSDP)" : "") + ", " +
          std::string(reduce_algo_name(z.s.cluster.algo)) + " reductions; " + z.s.cluster.cluster.describe() + ".\n\n");
  say.say(mesh_table(z.s.plan, z.s.cluster.cluster));
  if (z.q > 1)
    say.say("\nShard groups are consecutive ranks (one node: NVLink); replica groups stride across nodes (InfiniBand).\n");
  say.say("\nAs in plain DP, data rank d trains rows [d*B/W, (d+1)*B/W) of the global batch. Rows of step 1:\n\n");
  say.say(batch_table(data, z.s.train, z.W, 0));
  say.pause();
}

// Phase 0 of the run (right after construction): who owns which piece, and the bytes at rest.
void show_shard_map_at_rest(Narrator& say, const LessonOptions& o, const ZeroRun& z, const PhaseView& p) {
  say.phase("the shard map, and memory at rest (" + p.strategy + ")",
            "core/parallel/shard_layout.cpp: ShardLayout::ShardLayout() cuts the segments; core/parallel/zero_reduce.cpp: "
            "ShardedGradReducer() allocates the gradient shard and the reduce-scatter buffer");
  ask(say, o.step, {"Z1", "Z2", "Z3", "Z4"});
  const std::string n = std::to_string(z.n);
  say.say("Each segment (the unit FSDP gathers and frees together) is cut into " + n + " pieces of P = ceil(numel / " + n +
          ") elements rounded up to a multiple of 512; shard j owns [begin + j*P, begin + (j+1)*P) clipped "
          "to the segment.\nThe pieces hold the AdamW moments" +
          std::string(z.stage >= 2 ? ", the reduced gradients" : "") + (z.stage == 3 ? " and the parameters" : "") +
          " of their range" + (z.q > 1 ? "; world ranks j, j+" + n + ", ... hold the same shard j" : "") + ".\n\n");
  say.say(shard_map(z.layout));
  say.say("\nBytes live on each virtual GPU right after construction (between steps):\n\n");
  say.say(memory_table(live_of(p)));
  say.pause();
}

// Trains the steps, showing the shard map at rest after construction and each step's traffic,
// memory and time (the questions they answer asked before step 1's tables). Returns every phase.
std::vector<PhaseView> train_and_show_steps(Narrator& say, const LessonOptions& o, const ZeroRun& z,
                                            const TextDataset& data) {
  StepReporter steps(say, o.step, "",
                     " (grads include the full gradients of layers whose reduction is still in flight;\n"
                     "how many depends on thread timing, so it can differ between ranks and runs)",
                     "core/parallel/zero.cpp: ZeroDataParallel::step() and the hooks (after_backward() starts each "
                     "reduce-scatter); core/parallel/fsdp.cpp (ZeRO-3): params_needed() gathers and prefetches, "
                     "params_done_forward() and params_done_backward() free");
  std::vector<std::string> step_questions = {"Z5", "Z6", "Z7"};
  if (z.q > 1) step_questions.push_back("Z8");
  step_questions.insert(step_questions.end(), {"Z9", "Z10", "Z11"});
  return run_phases(z.s, data, [&](const PhaseView& p) {
    if (p.step == 0) return show_shard_map_at_rest(say, o, z, p);
    steps.show(p, [&] {
      if (p.step == 1) ask(say, o.step, step_questions);
    });
  });
}

// ---- Exercises: the README's formulas per world rank --------------------------------------------

// What the formulas say for each world rank w (shard index j = w % n, replica w / n).
struct Expected {
  std::vector<int64_t> shard;                                            // [world rank] elements owned
  std::vector<int64_t> opt, comm, state_rest, par_lo, grad_lo, grad_hi;  // [world rank] bytes held
  std::vector<int64_t> rs, rep, ag, norm, total;                         // [world rank] bytes sent per step
  std::vector<int64_t> partials;  // [shard rank] fp64 grad-norm partials: one per 512 elements
  bool layout_matches = true;     // every piece of every segment as ShardLayout cuts it
};

// ZeRO-3, resharding: the embedding stays gathered from its forward to its backward; the blocks
// come and go two at a time (the one computing and the prefetched next), and the head joins one
// block at each end (prefetched by the last block, prefetching it back). Elements beside the shard.
int64_t gathered_while_resharding(const ZeroRun& z) {
  int64_t layer = 0;
  for (const Segment& g : z.segs())
    if (is_block(g, z.segs().size())) layer = std::max(layer, g.numel());
  const int64_t embed = z.segs().front().numel(), head = z.segs().back().numel();
  return embed + std::max(std::min<int64_t>(z.L, 2) * layer, std::min<int64_t>(z.L, 1) * layer + head);
}

// ZeRO-2/3: a unit's full gradient lives from its backward until its reduce-scatter lands. At
// least the largest unit's while it computes; at most the unit computing plus the two still being
// reduced (the rate limit). A tied embedding's gradient also lives from the head's backward
// (which adds to it first) to the end. {fewest, most} elements beside the shard.
std::pair<int64_t, int64_t> full_gradients_held(const ZeroRun& z) {
  std::vector<int64_t> sizes;
  for (const Segment& g : z.segs()) sizes.push_back(g.numel());
  const int64_t tied_embed = z.s.model.tie_word_embeddings ? sizes.front() : 0;
  if (tied_embed) sizes.erase(sizes.begin());
  std::sort(sizes.rbegin(), sizes.rend());
  int64_t three = 0;
  for (size_t k = 0; k < std::min<size_t>(3, sizes.size()); ++k) three += sizes[k];
  return {tied_embed + sizes.front(), tied_embed + three};
}

// Z1-Z6 by the formulas: the shard, the state at rest, the reduce-scatter buffer, the peaks.
void expect_memory(const ZeroRun& z, Expected& e) {
  const int stage = z.stage;
  const int64_t N = z.N, gathered = gathered_while_resharding(z);
  const auto [grads_fewest, grads_most] = full_gradients_held(z);
  for (int w = 0; w < z.W; ++w) {
    const int j = w % z.n;
    int64_t sh = 0;
    for (size_t k = 0; k < z.segs().size(); ++k) {
      const int64_t c = piece_numel(z.segs()[k].numel(), z.n, j);
      sh += c;
      e.layout_matches = e.layout_matches && z.layout.piece(k, j).numel() == c;
    }
    e.shard.push_back(sh);
    e.opt.push_back(8 * sh);
    e.comm.push_back(stage >= 2 ? 4 * sh : 0);
    e.state_rest.push_back(stage == 1 ? 8 * N + 8 * sh : stage == 2 ? 4 * N + 12 * sh : 16 * sh);
    e.par_lo.push_back(stage < 3 ? 4 * N : z.reshard ? 4 * sh + 4 * gathered : 4 * sh + 4 * N);
    e.grad_lo.push_back(stage == 1 ? 4 * N : 4 * sh + 4 * grads_fewest);
    e.grad_hi.push_back(stage == 1 ? 4 * N : 4 * sh + 4 * grads_most);
  }
}

// Z7-Z11 by the formulas: the bytes each rank sends per step, per collective and in all.
void expect_traffic(const ZeroRun& z, ReduceAlgo algo, Expected& e) {
  const int n = z.n, q = z.q;
  const int64_t M = z.M;
  e.partials.assign(size_t(n), 0);
  for (int j = 0; j < n; ++j)
    for (const Segment& g : z.segs()) e.partials[size_t(j)] += (piece_numel(g.numel(), n, j) + kShardAlign - 1) / kShardAlign;
  for (int w = 0; w < z.W; ++w) {
    const int j = w % n;
    int64_t rs = 0, ag = 0, rep = 0;
    for (size_t k = 0; k < z.segs().size(); ++k) {
      const std::vector<int64_t> c = pieces_of(z.segs()[k].numel(), n);
      // ZeRO-1 once per step, after local accumulation; ZeRO-2/3 every micro-batch, as soon as a
      // layer is done.
      rs += (z.stage == 1 ? 1 : M) * reduce_scatter_sent(c, j, 4);
      const int times = z.stage < 3 ? 1 : int(M) * (z.reshard && is_block(z.segs()[k], z.segs().size()) ? 2 : 1);
      ag += times * all_gather_sent(c, j, 4, algo);
      // HSDP: each unit's piece is all-reduced across the replicas on its own, per micro-batch.
      if (q > 1) rep += M * all_reduce_sent(c[size_t(j)], q, w / n, 4, algo);
    }
    const int64_t norm = all_gather_sent(e.partials, j, 8, algo);  // every stage clips from its shard
    e.rs.push_back(rs);
    e.rep.push_back(rep);
    e.ag.push_back(ag);
    e.norm.push_back(norm);
    e.total.push_back(rs + rep + ag + norm + all_reduce_sent(2, z.W, w, 8, algo));
  }
}

// What was measured, per world rank: the state at rest (phase 0), the peaks and the bytes sent
// per collective of the last step.
struct Measured {
  std::vector<int64_t> shard;                        // [world rank] elements, as ShardLayout cuts them
  std::vector<int64_t> state, opt, comm, par, grad;  // [world rank] bytes held
  std::vector<int64_t> total;                        // [world rank] bytes sent by every collective
  std::vector<int64_t> grad_reduce, rep, ag, norm;   // [world rank] bytes sent, by the strategies' labels
};

Measured measured_per_rank(const ZeroRun& z, const PhaseView& rest, const PhaseView& last) {
  Measured m;
  for (int w = 0; w < z.W; ++w) {
    const RankSnapshot& r0 = rest.ranks[size_t(w)];
    const RankSnapshot& r1 = last.ranks[size_t(w)];
    m.shard.push_back(z.layout.shard_numel(w % z.n));
    m.state.push_back(r0.live.params + r0.live.grads + r0.live.optimizer);
    m.opt.push_back(r1.peak.optimizer);
    m.comm.push_back(r1.peak.comm_buffers);
    m.par.push_back(r1.peak.params);
    m.grad.push_back(r1.peak.grads);
    m.total.push_back(total_sent(r1.traffic));
  }
  const std::vector<int64_t> rs_layers = per_rank_sent(last, "reduce_scatter", label::grads("layer")),
                             rs_embed = per_rank_sent(last, "reduce_scatter", label::grads("embedding")),
                             rs_head = per_rank_sent(last, "reduce_scatter", label::grads("head"));
  for (int w = 0; w < z.W; ++w) m.grad_reduce.push_back(rs_layers[size_t(w)] + rs_embed[size_t(w)] + rs_head[size_t(w)]);
  m.rep = per_rank_sent(last, "all_reduce", label::grads_across_replicas(""));
  m.ag = per_rank_sent(last, "all_gather", z.stage == 3 ? label::params("") : std::string(label::kUpdatedParameters));
  m.norm = per_rank_sent(last, "all_gather", label::kGradNormPartials);
  return m;
}

// Z1-Z6: the shard, the state at rest, the buffer kept for the reduce-scatters, the peaks.
void check_memory_formulas(ExerciseSheet& sheet, const ZeroRun& z, const Expected& e, const Measured& m) {
  const int stage = z.stage;
  const double dN = double(z.N), mean_shard = dN / double(z.n);
  Exercise x1{"Z1", question("Z1"),
              "the sum over segments of its piece; N/n on average (n = " + std::to_string(z.n) +
                  "), but padding to 512-element pieces makes the last shard ranks short",
              mean_shard, e.shard, m.shard, {}, "Measured = ShardLayout, the layout the strategy uses; every piece of "
              "every segment is compared with the formula, not only the sums.", false, {}, {}};
  x1.pass = e.layout_matches && x1.expected == x1.measured;
  sheet.add(x1);
  sheet.exact("Z2", question("Z2"), "8 bytes per owned element: 8N/n", 8.0 * mean_shard, e.opt, m.opt);
  const char* rest_formula = stage == 1   ? "ZeRO-1: params 4N + grads 4N + AdamW 8N/n"
                             : stage == 2 ? "ZeRO-2: params 4N + grads 4N/n + AdamW 8N/n"
                                          : "ZeRO-3: (4 + 4 + 8) N/n = 16N/n";
  const double rest_textbook = stage == 1 ? 8.0 * dN + 8.0 * mean_shard
                               : stage == 2 ? 4.0 * dN + 12.0 * mean_shard
                                            : 16.0 * mean_shard;
  sheet.exact("Z3", question("Z3"), rest_formula, rest_textbook, e.state_rest, m.state);
  sheet.exact("Z4", question("Z4"),
              stage == 1 ? "none: ZeRO-1 reduce-scatters the gradients in place"
                         : "one shard of gradients (4N/n), allocated once at construction (the at-rest table shows it) "
                           "and reused: each micro-batch's reduce-scatter lands there before it is added to the "
                           "accumulated gradient shard",
              stage == 1 ? 0.0 : 4.0 * mean_shard, e.comm, m.comm);
  sheet.exact("Z5", question("Z5"),
              stage < 3   ? "4N: every rank keeps the full parameters"
              : z.reshard ? "shard + embedding (gathered from its forward to its backward) + what is in flight: 2 "
                            "layers (the one computing and the prefetched next), or 1 layer + the head at either end "
                            "of the model: 4 (N/n + E + max(2 layer, layer + H))"
                          : "shard + the whole model: nothing is freed between forward and backward (Llama 3's "
                            "choice): 4N/n + 4N",
              -1, e.par_lo, m.par);
  if (stage == 1)
    sheet.exact("Z6", question("Z6"), "4N: ZeRO-1 keeps full gradients", 4.0 * dN, e.grad_lo, m.grad);
  else
    sheet.range("Z6", question("Z6"),
                "the gradient shard 4N/n + the full gradient of the unit in backward + up to 2 more still being "
                "reduce-scattered (+ a tied embedding's, held from the head's backward to the end)",
                e.grad_lo, e.grad_hi, m.grad,
                "A range, because how many reductions are still in flight depends on thread timing.");
}

// Z7-Z11: the bytes each rank sends per step, per kind of collective and in all.
void check_traffic_formulas(ExerciseSheet& sheet, const ZeroRun& z, const Expected& e, const Measured& m) {
  const int stage = z.stage, q = z.q;
  const double dn = z.n, dN = double(z.N), dM = double(z.M), mean_shard = dN / dn, frac = (dn - 1) / dn;
  if (stage == 1)
    sheet.exact("Z7", question("Z7"),
                "one reduce-scatter per step, after local accumulation: (n-1)/n * 4N; with the all-gather of the "
                "updated parameters, ZeRO-1 moves what DP's all-reduce moves, 2(n-1)/n * 4N",
                frac * 4 * dN, e.rs, m.grad_reduce,
                "In place: each rank's piece of the full gradient buffer receives the sum, so ZeRO-1 needs no "
                "extra buffer; the global norm for clipping comes from the pieces (one tiny all-gather).");
  else
    sheet.exact("Z7", question("Z7"),
                "a reduce-scatter per layer per micro-batch: M (n-1)/n * 4N, here M = " + std::to_string(z.M),
                dM * frac * 4 * dN, e.rs, m.grad_reduce,
                "Per micro-batch, not per step: the full gradient is never kept, so accumulation cannot wait (DP's "
                "no_sync would need 4N of gradients).");
  if (q > 1)
    sheet.exact("Z8", question("Z8"),
                "per micro-batch, one all-reduce over the " + std::to_string(q) +
                    " replicas per unit, of its piece, right behind its reduce-scatter: M * 2(q-1)/q * 4N/n",
                dM * 2.0 * (q - 1) / q * 4 * mean_shard, e.rep, m.rep,
                "This crosses nodes (InfiniBand) but moves only 1/n of the gradients: the point of HSDP. One call "
                "per unit, so it overlaps the backward of the units below (the traffic table lists them).");
  int64_t root = 0;  // E + H: the embedding's and the norm + head's elements
  for (const Segment& g : z.segs())
    if (!is_block(g, z.segs().size())) root += g.numel();
  const double ag_textbook = stage < 3 ? frac * 4 * dN : dM * frac * 4 * (z.reshard ? 2 * dN - double(root) : dN);
  sheet.exact("Z9", question("Z9"),
              stage < 3   ? "after the update, every rank's new pieces to everyone: (n-1)/n * 4N"
              : z.reshard ? "per micro-batch, forward gathers every segment and backward re-gathers every layer (the "
                            "embedding and the head stay gathered): M (n-1)/n * 4 (2N - E - H)"
                          : "per micro-batch, forward gathers every segment once: M (n-1)/n * 4N",
              ag_textbook, e.ag, m.ag,
              stage == 3 && z.reshard ? "The textbook's ZeRO-3 figure is 2 (n-1)/n * 4N: here the embedding (E "
                                        "elements) and the norm + head (H) are not re-gathered, as PyTorch FSDP does "
                                        "for its root module."
                                      : "");
  int64_t partials = 0;
  for (int64_t p : e.partials) partials += p;
  sheet.exact("Z10", question("Z10"),
              "each rank's fp64 sums of squares per 512-element chunk of its reduced gradient pieces, all-gathered: "
              "about (n-1)/n * 8 * N/512 bytes",
              frac * 8.0 * double(partials), e.norm, m.norm,
              "Tiny next to the gradients, and it keeps clipping bitwise equal to one device.");
  sheet.exact("Z11", question("Z11"),
              "the sum of the above + the loss all-reduce (2 doubles over all ranks): nothing else moves", -1, e.total,
              m.total);
}

// ---- Time on the simulated clock: what prefetching buys (ZeRO-3) and HSDP's two links ----------

// How long one rank's collectives of `op` under labels starting with `prefix` took, in ns.
int64_t duration_ns(const std::vector<TrafficRecord>& records, std::string_view op, std::string_view prefix) {
  double us = 0;
  for (const TrafficRecord& r : records)
    if (r.op == op && r.label.starts_with(prefix)) us += r.sim_end_us - r.sim_start_us;
  return ns(us);
}

// ZeRO-3: step 1 again without prefetching, beside step 1 with it (Z12, Z13).
void show_prefetch_time(Narrator& say, const LessonOptions& o, const ZeroRun& z, const TextDataset& data,
                        const PhaseView& on, ExerciseSheet& sheet) {
  RunSetup no_prefetch = z.s;
  no_prefetch.plan.prefetch = false;
  no_prefetch.train.steps = 1;
  const PhaseView off = run_phases(no_prefetch, data, nullptr)[1];
  say.phase("time: what prefetching buys, on the simulated clock",
            "core/parallel/fsdp.cpp: params_needed() calls start_gather() for the next unit");
  ask(say, o.step, {"Z12", "Z13"});
  std::vector<TimelineTotals> t_on, t_off;
  std::vector<int64_t> busy_on, busy_off, saved, gathers, most;
  for (int r = 0; r < z.W; ++r) {
    t_on.push_back(on.ranks[size_t(r)].time), t_off.push_back(off.ranks[size_t(r)].time);
    busy_on.push_back(ns(t_on.back().comm_us)), busy_off.push_back(ns(t_off.back().comm_us));
    saved.push_back(ns(t_off.back().wait_us) - ns(t_on.back().wait_us));
    gathers.push_back(duration_ns(off.ranks[size_t(r)].traffic, "all_gather", label::params("")));
    // Without prefetching a step lasts at most compute + comm busy; with it at least the larger of
    // the two (one comm stream, every result waited for), so it saves at most the smaller (+1 ns).
    most.push_back(std::min(ns(t_off.back().comm_us), ns(t_on.back().compute_us)) + 1);
  }
  say.say("Step 1 with prefetching (the default: the next unit's all-gather runs while this one computes):\n\n" +
          time_table(t_on, on.gpu_tflops) + "\nThe same step without (each unit waits for its own gather):\n\n" +
          time_table(t_off, off.gpu_tflops));
  say.say("\nA prefetched gather hides behind the unit computing meanwhile. Without it each unit waits for its own "
          "gather, and\nbehind the reduce-scatters queued before it on the same comm stream, so the saving can exceed "
          "the gathers\n(here " + std::to_string(gathers[0] / 1000) + " us of them) but never the step's compute (" +
          std::to_string(ns(t_on[0].compute_us) / 1000) + " us): more tokens per rank (--rows, --seq-len) give it "
          "more to hide behind.\n");
  say.pause();
  const std::vector<int64_t> one(size_t(z.W), 1);
  std::vector<int64_t> busy_lo, busy_hi;
  for (int64_t b : busy_on) busy_lo.push_back(b - 1), busy_hi.push_back(b + 1);
  sheet.range("Z12", question("Z12"),
              "no: the same collectives of the same sizes, only issued earlier (expected: the run with prefetching)",
              busy_lo, busy_hi, busy_off, "Within 1 ns of rounding.");
  sheet.range("Z13", question("Z13"),
              "more than nothing, and at most the smaller of the step's compute and its communication (a step "
              "takes at least the larger of the two with prefetching, at most their sum without)",
              one, most, saved, "Measured: exposed time without prefetching minus with it, step 1 of each run.");
  sheet.answer("Z13", {.value = double(saved[0]), .unit = "ns", .of = "rank 0", .tolerance = 1});
}

// Z14: HSDP's all-reduces across replicas on the simulated clock, every hop priced as InfiniBand,
// so only when every replica group spans q nodes.
void check_replica_clock(const ZeroRun& z, const PhaseView& timed, ExerciseSheet& sheet) {
  const ClusterSpec& cluster = z.s.cluster.cluster;
  bool replicas_cross_nodes = z.q > 1;
  for (int r = 0; r < z.W; ++r)
    for (int j = r + z.n; j < z.W; j += z.n) replicas_cross_nodes &= cluster.node_of(r) != cluster.node_of(j);
  if (!replicas_cross_nodes) return;
  const std::string across = label::grads_across_replicas("");
  std::vector<int64_t> lo, hi, measured;
  for (int r = 0; r < z.W; ++r) {
    double formula = 0;
    for (const TrafficRecord& t : timed.ranks[size_t(r)].traffic)
      if (t.label.starts_with(across)) formula += collective_us(t, z.s.cluster.algo, cluster.infiniband);
    lo.push_back(ns(formula) - 1), hi.push_back(ns(formula) + 1);
    measured.push_back(duration_ns(timed.ranks[size_t(r)].traffic, "all_reduce", across));
  }
  sheet.range("Z14", "HSDP on the simulated clock: how long do the all-reduces across replicas take per step (ns)?",
              "per unit and micro-batch, an all-reduce of its piece over q ranks, every hop InfiniBand: alpha " +
                  std::to_string(int(cluster.infiniband.alpha_us)) + " us + bytes / " +
                  std::to_string(int(cluster.infiniband.bandwidth_gbps)) + " GB/s per phase",
              lo, hi, measured,
              "Within 1 ns of rounding. The shard group's reduce-scatters ride NVLink at 9x the bandwidth; "
              "each replica all-reduce moves 1/n of the gradients.");
}

int run(const LessonOptions& o, const ZeroArgs& args) {
  Narrator say(o);
  const ZeroRun z = zero_run(o, args);
  const TextDataset data = load_dataset(default_corpus_path(), z.s.train.seq_len);
  show_mesh_and_batch(say, o, z, data);
  const std::vector<PhaseView> phases = train_and_show_steps(say, o, z, data);

  Expected expected;
  expect_memory(z, expected);
  expect_traffic(z, z.s.cluster.algo, expected);
  const Measured measured = measured_per_rank(z, phases.front(), phases.back());
  ExerciseSheet sheet;
  check_memory_formulas(sheet, z, expected, measured);
  check_traffic_formulas(sheet, z, expected, measured);
  if (z.stage == 3) show_prefetch_time(say, o, z, data, phases[1], sheet);
  check_replica_clock(z, phases.back(), sheet);

  say.phase("exercises: formula vs measured",
            "lessons/02-zero-fsdp-hsdp/main.cpp: expect_memory() and expect_traffic() compute every formula from the "
            "model's shape");
  if (z.q == 1) say.say("(Z8 is HSDP's all-reduce across replicas: it appears with --replicas.)\n\n");
  EquivalenceReport report;
  const bool equivalent = finish_with_equivalence(say, sheet, z.s, data, report);
  return finish_lesson("02-zero-fsdp-hsdp", o.json, o.preset, z.s, phases, sheet, report, equivalent,
                       [&](nlohmann::json& j) { j["shard_map"] = shard_map_json(z.layout); });
}

}  // namespace
}  // namespace llama4d::lesson

int main(int argc, char** argv) {
  llama4d::lesson::LessonOptions options;
  options.preset = "small";  // 6 layers: the gather / reduce windows are smaller than the model
  llama4d::lesson::ZeroArgs zero;
  CLI::App app{"Lesson 02: ZeRO-1/2/3 (FSDP) and HSDP on virtual GPUs", "lesson02_zero"};
  options.add_options(app);
  app.add_option("--zero", zero.zero, "ZeRO stage: 1 optimizer states, 2 + gradients, 3 + parameters (FSDP)")
      ->check(CLI::Range(1, 3))
      ->capture_default_str();
  app.add_flag("--keep-params", zero.keep_params,
               "ZeRO-3: keep gathered parameters from forward to backward (Llama 3's choice)");
  app.add_option("--replicas", zero.replicas, "HSDP: replicas of the shard group (--ranks / replicas shard ranks)")
      ->capture_default_str();
  return llama4d::lesson::lesson_main(app, argc, argv, [&] {
    // HSDP: unless told otherwise, put one shard group on each node, so the replica all-reduce
    // is the traffic that crosses InfiniBand.
    if (zero.replicas > 1 && app.get_option("--gpus-per-node")->count() == 0 && zero.replicas <= options.ranks)
      options.gpus_per_node = std::max(1, options.ranks / zero.replicas);
    return llama4d::lesson::run(options, zero);
  });
}
