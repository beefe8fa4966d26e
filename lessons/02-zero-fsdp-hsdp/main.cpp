// Lesson 02: ZeRO-1/2/3 (FSDP) and HSDP. The flat parameter buffer is cut into per-rank pieces;
// rank r keeps only its pieces of the optimizer state (ZeRO-1), also of the gradients (ZeRO-2),
// also of the parameters (ZeRO-3 = FSDP). HSDP shards inside a group and replicates the groups.
// The program shows who owns which piece, what each collective moved, per-rank memory by
// category, checks the README's formulas against the measurements, and proves equivalence.
//   lesson02_zero [--zero 3] [--keep-params] [--ranks 4] [--replicas 2] [--step] [--json]
#include <algorithm>
#include <nlohmann/json.hpp>

#include "core/data/dataset.h"
#include "core/comm/text_table.h"
#include "core/comm/traffic_labels.h"
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

int run(const LessonOptions& o, const ZeroArgs& z) {
  Narrator say(o);
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
  const TextDataset data = load_dataset(default_corpus_path(), s.train.seq_len);
  const std::vector<ParamSpec> specs = llama_param_specs(s.model);
  const ShardLayout layout(specs, s.plan.dp_shard());
  const std::vector<Segment>& segs = layout.segments();
  const int n = s.plan.dp_shard(), q = s.plan.dp_replicate(), W = s.plan.world_size(), stage = z.zero;
  const int64_t N = s.model.num_parameters(), M = o.micro_batches, L = s.model.num_hidden_layers;
  const bool reshard = s.plan.reshard_after_forward;
  // The exercises' questions, asked (with --step) before the phase whose tables answer them. The
  // numbers stay the same in every configuration: Z8 is HSDP's and appears only with --replicas.
  const std::string q1 = "How many elements of the flat buffer does each rank own (its shard)?",
                    q2 = "How many bytes of AdamW state does each rank hold?",
                    q3 = "How much model state (params + grads + AdamW) does each rank keep between steps?",
                    q4 = "How big is the communication buffer each rank keeps?",
                    q5 = "What is the peak of parameter memory per rank?",
                    q6 = "What is the peak of gradient memory per rank?",
                    q7 = "How many bytes does each rank send per step to reduce the gradients?",
                    q8 = "HSDP: how many bytes does each rank send to sum its shard across the replicas?",
                    q9 = "How many bytes does each rank send per step to all-gather parameters?",
                    q10 = "How many bytes does each rank send per step for the gradient norm (clipping)?",
                    q11 = "How many bytes does each rank send in all, per step?",
                    q12 = "ZeRO-3 without prefetching: how long are the links busy per step (ns)?",
                    q13 = "How much exposed communication does prefetching save per step (ns)?";

  say.phase("the mesh and the batch",
            "core/parallel/parallel_trainer.cpp: ParallelTrainer::ParallelTrainer() builds the data, shard and "
            "replica groups from the mesh");
  say.say("Model '" + o.preset + "': N = " + grouped(N) + " parameters (4N = " + grouped(4 * N) + " bytes in fp32). " +
          s.plan.data_parallel().describe() + " over " + std::to_string(n) + " shard ranks" +
          (q > 1 ? " x " + std::to_string(q) + " replicas (HSDP)" : "") + ", " +
          std::string(reduce_algo_name(s.cluster.algo)) + " reductions; " + s.cluster.cluster.describe() + ".\n\n");
  say.say(mesh_table(s.plan, s.cluster.cluster));
  if (q > 1)
    say.say("\nShard groups are consecutive ranks (one node: NVLink); replica groups stride across nodes (InfiniBand).\n");
  say.say("\nAs in plain DP, data rank d trains rows [d*B/W, (d+1)*B/W) of the global batch. Rows of step 1:\n\n");
  say.say(batch_table(data, s.train, W, 0));
  say.pause();

  StepReporter steps(say, o.step, "",
                     " (grads include the full gradients of layers whose reduction is still in flight;\n"
                     "how many depends on thread timing, so it can differ between ranks and runs)",
                     "core/parallel/zero.cpp: ZeroDataParallel::step() and the hooks (after_backward() starts each "
                     "reduce-scatter); core/parallel/fsdp.cpp (ZeRO-3): params_needed() gathers and prefetches, "
                     "params_done_forward() and params_done_backward() free");
  const std::vector<PhaseView> phases = run_phases(s, data, [&](const PhaseView& p) {
    if (p.step > 0)
      return steps.show(p, [&] {
        if (p.step > 1) return;
        say.ask("Z5", q5);
        say.ask("Z6", q6);
        say.ask("Z7", q7);
        if (q > 1) say.ask("Z8", q8);
        say.ask("Z9", q9);
        say.ask("Z10", q10);
        say.ask("Z11", q11);
        if (o.step) say.say("\n");
      });
    say.phase("the shard map, and memory at rest (" + p.strategy + ")",
              "core/parallel/shard_layout.cpp: ShardLayout::ShardLayout() cuts the segments; core/parallel/zero_reduce.cpp: "
              "ShardedGradReducer() allocates the gradient shard and the reduce-scatter buffer");
    say.ask("Z1", q1);
    say.ask("Z2", q2);
    say.ask("Z3", q3);
    say.ask("Z4", q4);
    if (o.step) say.say("\n");
    say.say("Each segment (the unit FSDP gathers and frees together) is cut into " + std::to_string(n) +
            " pieces of P = ceil(numel / " + std::to_string(n) +
            ") elements rounded up to a multiple of 512; shard j owns [begin + j*P, begin + (j+1)*P) clipped "
            "to the segment.\nThe pieces hold the AdamW moments" +
            std::string(stage >= 2 ? ", the reduced gradients" : "") + (stage == 3 ? " and the parameters" : "") +
            " of their range" + (q > 1 ? "; world ranks j, j+" + std::to_string(n) + ", ... hold the same shard j" : "") +
            ".\n\n");
    say.say(shard_map(layout));
    say.say("\nBytes live on each virtual GPU right after construction (between steps):\n\n");
    say.say(memory_table(live_of(p)));
    say.pause();
  });

  // ---- Exercises (printed after the time phase) ----------------------------------------------
  const PhaseView& rest = phases.front();
  const PhaseView& last = phases.back();
  const ReduceAlgo algo = s.cluster.algo;
  int64_t root = 0, layer = 0;  // E + H (the embedding's and the norm + head's elements); a layer's
  for (const Segment& g : segs) {
    if (!is_block(g, segs.size()))
      root += g.numel();
    else
      layer = std::max(layer, g.numel());
  }
  const double dn = n, dN = double(N), dM = double(M), mean_shard = dN / dn;

  // What the formulas say for each world rank w (shard index j = w % n, replica w / n).
  const std::vector<int64_t> zeros(static_cast<size_t>(W), 0);
  std::vector<int64_t> shard = zeros, state_rest = zeros, opt = zeros, comm = zeros, par_lo = zeros, grad_lo = zeros,
                       grad_hi = zeros, rs = zeros, rep = zeros, ag = zeros, norm = zeros, total = zeros;
  std::vector<int64_t> partials(static_cast<size_t>(n), 0);  // fp64 grad-norm partials per shard rank: one per 512 elements
  for (int j = 0; j < n; ++j)
    for (const Segment& g : segs) partials[size_t(j)] += (piece_numel(g.numel(), n, j) + kShardAlign - 1) / kShardAlign;
  bool layout_matches = true;
  for (int w = 0; w < W; ++w) {
    const int j = w % n;
    int64_t sh = 0, rs_bytes = 0, ag_bytes = 0, rep_bytes = 0;
    for (size_t k = 0; k < segs.size(); ++k) {
      const std::vector<int64_t> c = pieces_of(segs[k].numel(), n);
      sh += c[size_t(j)];
      layout_matches = layout_matches && layout.piece(k, j).numel() == c[size_t(j)];
      if (stage == 1)
        rs_bytes += reduce_scatter_sent(c, j, 4);  // once per step, after local accumulation
      else
        rs_bytes += M * reduce_scatter_sent(c, j, 4);  // every micro-batch, as soon as a layer is done
      const int times = stage < 3 ? 1 : int(M) * (reshard && is_block(segs[k], segs.size()) ? 2 : 1);
      ag_bytes += times * all_gather_sent(c, j, 4, algo);
      // HSDP: each unit's piece is all-reduced across the replicas on its own, per micro-batch.
      if (q > 1) rep_bytes += M * all_reduce_sent(c[size_t(j)], q, w / n, 4, algo);
    }
    shard[size_t(w)] = sh;
    opt[size_t(w)] = 8 * sh;
    comm[size_t(w)] = stage >= 2 ? 4 * sh : 0;
    state_rest[size_t(w)] = stage == 1 ? 8 * N + 8 * sh : stage == 2 ? 4 * N + 12 * sh : 16 * sh;
    // ZeRO-3, resharding: the embedding stays gathered from its forward to its backward; the
    // blocks come and go two at a time (the one computing and the prefetched next), and the
    // head joins one block at each end (prefetched by the last block, prefetching it back).
    const int64_t embed = segs.front().numel(), head = segs.back().numel();
    const int64_t in_flight = std::max(std::min<int64_t>(L, 2) * layer, std::min<int64_t>(L, 1) * layer + head);
    par_lo[size_t(w)] = stage < 3 ? 4 * N : reshard ? 4 * sh + 4 * (embed + in_flight) : 4 * sh + 4 * N;
    // ZeRO-2/3: a unit's full gradient lives from its backward until its reduce-scatter lands.
    // At least the largest unit's while it computes; at most the unit computing plus the two
    // still being reduced (the rate limit). A tied embedding's gradient also lives from the
    // head's backward (which adds to it first) to the end.
    std::vector<int64_t> sizes;
    for (const Segment& g : segs) sizes.push_back(g.numel());
    const int64_t tied_embed = s.model.tie_word_embeddings ? sizes.front() : 0;
    if (tied_embed) sizes.erase(sizes.begin());
    std::sort(sizes.rbegin(), sizes.rend());
    int64_t three = 0;
    for (size_t k = 0; k < std::min<size_t>(3, sizes.size()); ++k) three += sizes[k];
    grad_lo[size_t(w)] = stage == 1 ? 4 * N : 4 * sh + 4 * (tied_embed + sizes.front());
    grad_hi[size_t(w)] = stage == 1 ? 4 * N : 4 * sh + 4 * (tied_embed + three);
    rs[size_t(w)] = rs_bytes;
    rep[size_t(w)] = rep_bytes;
    ag[size_t(w)] = ag_bytes;
    norm[size_t(w)] = all_gather_sent(partials, j, 8, algo);  // every stage clips from its shard
    total[size_t(w)] = rs_bytes + rep[size_t(w)] + ag_bytes + norm[size_t(w)] + all_reduce_sent(2, W, w, 8, algo);
  }

  // What was measured, per world rank.
  std::vector<int64_t> m_shard, m_state, m_opt, m_comm, m_par, m_grad, m_total;
  for (int w = 0; w < W; ++w) {
    const RankSnapshot& r0 = rest.ranks[size_t(w)];
    const RankSnapshot& r1 = last.ranks[size_t(w)];
    m_shard.push_back(layout.shard_numel(w % n));
    m_state.push_back(r0.live.params + r0.live.grads + r0.live.optimizer);
    m_opt.push_back(r1.peak.optimizer);
    m_comm.push_back(r1.peak.comm_buffers);
    m_par.push_back(r1.peak.params);
    m_grad.push_back(r1.peak.grads);
    m_total.push_back(total_sent(r1.traffic));
  }
  const std::vector<int64_t> m_rs = per_rank_sent(last, "reduce_scatter", label::grads("layer")),
                             m_rs_embed = per_rank_sent(last, "reduce_scatter", label::grads("embedding")),
                             m_rs_head = per_rank_sent(last, "reduce_scatter", label::grads("head")),
                             m_rep = per_rank_sent(last, "all_reduce", label::grads_across_replicas("")),
                             m_ag = per_rank_sent(last, "all_gather", stage == 3 ? label::params("") : std::string(label::kUpdatedParameters)),
                             m_norm = per_rank_sent(last, "all_gather", label::kGradNormPartials);
  std::vector<int64_t> m_grad_red = zeros;
  for (int w = 0; w < W; ++w) m_grad_red[size_t(w)] = m_rs[size_t(w)] + m_rs_embed[size_t(w)] + m_rs_head[size_t(w)];

  ExerciseSheet sheet;
  Exercise x1{"Z1", q1,
              "the sum over segments of its piece; N/n on average (n = " + std::to_string(n) +
                  "), but padding to 512-element pieces makes the last shard ranks short",
              mean_shard, shard, m_shard, {}, "Measured = ShardLayout, the layout the strategy uses; every piece of "
              "every segment is compared with the formula, not only the sums.", false, {}};
  x1.pass = layout_matches && x1.expected == x1.measured;
  sheet.add(x1);
  sheet.exact("Z2", q2, "8 bytes per owned element: 8N/n",
              8.0 * mean_shard, opt, m_opt);
  const char* rest_formula = stage == 1   ? "ZeRO-1: params 4N + grads 4N + AdamW 8N/n"
                             : stage == 2 ? "ZeRO-2: params 4N + grads 4N/n + AdamW 8N/n"
                                          : "ZeRO-3: (4 + 4 + 8) N/n = 16N/n";
  const double rest_textbook = stage == 1 ? 8.0 * dN + 8.0 * mean_shard
                               : stage == 2 ? 4.0 * dN + 12.0 * mean_shard
                                            : 16.0 * mean_shard;
  sheet.exact("Z3", q3, rest_formula,
              rest_textbook, state_rest, m_state);
  sheet.exact("Z4", q4,
              stage == 1 ? "none: ZeRO-1 reduce-scatters the gradients in place"
                         : "one shard of gradients (4N/n), allocated once at construction (the at-rest table shows it) "
                           "and reused: each micro-batch's reduce-scatter lands there before it is added to the "
                           "accumulated gradient shard",
              stage == 1 ? 0.0 : 4.0 * mean_shard, comm, m_comm);
  sheet.exact("Z5", q5,
              stage < 3 ? "4N: every rank keeps the full parameters"
              : reshard ? "shard + embedding (gathered from its forward to its backward) + what is in flight: 2 "
                          "layers (the one computing and the prefetched next), or 1 layer + the head at either end "
                          "of the model: 4 (N/n + E + max(2 layer, layer + H))"
                        : "shard + the whole model: nothing is freed between forward and backward (Llama 3's "
                          "choice): 4N/n + 4N",
              -1, par_lo, m_par);
  if (stage == 1)
    sheet.exact("Z6", q6, "4N: ZeRO-1 keeps full gradients", 4.0 * dN,
                grad_lo, m_grad);
  else
    sheet.range("Z6", q6,
                "the gradient shard 4N/n + the full gradient of the unit in backward + up to 2 more still being "
                "reduce-scattered (+ a tied embedding's, held from the head's backward to the end)",
                grad_lo, grad_hi, m_grad,
                "A range, because how many reductions are still in flight depends on thread timing.");
  const double frac = (dn - 1) / dn;
  if (stage == 1)
    sheet.exact("Z7", q7,
                "one reduce-scatter per step, after local accumulation: (n-1)/n * 4N; with the all-gather of the "
                "updated parameters, ZeRO-1 moves what DP's all-reduce moves, 2(n-1)/n * 4N",
                frac * 4 * dN, rs, m_grad_red,
                "In place: each rank's piece of the full gradient buffer receives the sum, so ZeRO-1 needs no "
                "extra buffer; the global norm for clipping comes from the pieces (one tiny all-gather).");
  else
    sheet.exact("Z7", q7,
                "a reduce-scatter per layer per micro-batch: M (n-1)/n * 4N, here M = " + std::to_string(M), dM * frac * 4 * dN,
                rs, m_grad_red,
                "Per micro-batch, not per step: the full gradient is never kept, so accumulation cannot wait (DP's "
                "no_sync would need 4N of gradients).");
  if (q > 1)
    sheet.exact("Z8", q8,
                "per micro-batch, one all-reduce over the " + std::to_string(q) +
                    " replicas per unit, of its piece, right behind its reduce-scatter: M * 2(q-1)/q * 4N/n",
                dM * 2.0 * (q - 1) / q * 4 * mean_shard, rep, m_rep,
                "This crosses nodes (InfiniBand) but moves only 1/n of the gradients: the point of HSDP. One call "
                "per unit, so it overlaps the backward of the units below (the traffic table lists them).");
  const double ag_textbook = stage < 3 ? frac * 4 * dN : dM * frac * 4 * (reshard ? 2 * dN - double(root) : dN);
  sheet.exact("Z9", q9,
              stage < 3   ? "after the update, every rank's new pieces to everyone: (n-1)/n * 4N"
              : reshard   ? "per micro-batch, forward gathers every segment and backward re-gathers every layer (the "
                            "embedding and the head stay gathered): M (n-1)/n * 4 (2N - E - H)"
                          : "per micro-batch, forward gathers every segment once: M (n-1)/n * 4N",
              ag_textbook, ag, m_ag,
              stage == 3 && reshard ? "The textbook's ZeRO-3 figure is 2 (n-1)/n * 4N: here the embedding (E "
                                      "elements) and the norm + head (H) are not re-gathered, as PyTorch FSDP does "
                                      "for its root module."
                                    : "");
  sheet.exact("Z10", q10,
              "each rank's fp64 sums of squares per 512-element chunk of its reduced gradient pieces, all-gathered: "
              "about (n-1)/n * 8 * N/512 bytes",
              frac * 8.0 * double([&] {
                int64_t k = 0;
                for (int64_t p : partials) k += p;
                return k;
              }()),
              norm, m_norm, "Tiny next to the gradients, and it keeps clipping bitwise equal to one device.");
  sheet.exact("Z11", q11,
              "the sum of the above + the loss all-reduce (2 doubles over all ranks): nothing else moves", -1, total,
              m_total);

  // ---- Time on the simulated clock: what prefetching buys (ZeRO-3) and HSDP's two links.
  const PhaseView& timed = phases.back();
  auto durations_ns = [](const std::vector<TrafficRecord>& records, std::string_view op, std::string_view prefix) {
    double us = 0;
    for (const TrafficRecord& r : records)
      if (r.op == op && r.label.starts_with(prefix)) us += r.sim_end_us - r.sim_start_us;
    return ns(us);
  };
  if (stage == 3) {
    RunSetup no_prefetch = s;
    no_prefetch.plan.prefetch = false;
    no_prefetch.train.steps = 1;
    const PhaseView off = run_phases(no_prefetch, data, nullptr)[1];
    const PhaseView& on = phases[1];
    say.phase("time: what prefetching buys, on the simulated clock",
              "core/parallel/fsdp.cpp: params_needed() calls start_gather() for the next unit");
    say.ask("Z12", q12);
    say.ask("Z13", q13);
    if (o.step) say.say("\n");
    std::vector<TimelineTotals> t_on, t_off;
    std::vector<int64_t> busy_on, busy_off, saved, gathers, most;
    for (int r = 0; r < W; ++r) {
      t_on.push_back(on.ranks[size_t(r)].time), t_off.push_back(off.ranks[size_t(r)].time);
      busy_on.push_back(ns(t_on.back().comm_us)), busy_off.push_back(ns(t_off.back().comm_us));
      saved.push_back(ns(t_off.back().wait_us) - ns(t_on.back().wait_us));
      gathers.push_back(durations_ns(off.ranks[size_t(r)].traffic, "all_gather", label::params("")));
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
    std::vector<int64_t> one(size_t(W), 1);
    std::vector<int64_t> busy_lo, busy_hi;
    for (int64_t b : busy_on) busy_lo.push_back(b - 1), busy_hi.push_back(b + 1);
    sheet.range("Z12", q12,
                "no: the same collectives of the same sizes, only issued earlier (expected: the run with prefetching)",
                busy_lo, busy_hi, busy_off, "Within 1 ns of rounding.");
    sheet.range("Z13", q13,
                "more than nothing, and at most the smaller of the step's compute and its communication (a step "
                "takes at least the larger of the two with prefetching, at most their sum without)",
                one, most, saved, "Measured: exposed time without prefetching minus with it, step 1 of each run.");
  }
  // Z14 prices every replica hop as InfiniBand: only when every replica group spans q nodes.
  bool replicas_cross_nodes = q > 1;
  for (int r = 0; r < W; ++r)
    for (int j = r + n; j < W; j += n) replicas_cross_nodes &= s.cluster.cluster.node_of(r) != s.cluster.cluster.node_of(j);
  if (replicas_cross_nodes) {
    std::vector<int64_t> lo, hi, measured;
    for (int r = 0; r < W; ++r) {
      double formula = 0;
      for (const TrafficRecord& t : timed.ranks[size_t(r)].traffic)
        if (t.label.starts_with(label::grads_across_replicas("")))
          formula += collective_us(t, s.cluster.algo, s.cluster.cluster.infiniband);
      lo.push_back(ns(formula) - 1), hi.push_back(ns(formula) + 1);
      measured.push_back(durations_ns(timed.ranks[size_t(r)].traffic, "all_reduce", label::grads_across_replicas("")));
    }
    sheet.range("Z14", "HSDP on the simulated clock: how long do the all-reduces across replicas take per step (ns)?",
                "per unit and micro-batch, an all-reduce of its piece over q ranks, every hop InfiniBand: alpha " +
                    std::to_string(int(s.cluster.cluster.infiniband.alpha_us)) + " us + bytes / " +
                    std::to_string(int(s.cluster.cluster.infiniband.bandwidth_gbps)) + " GB/s per phase",
                lo, hi, measured,
                "Within 1 ns of rounding. The shard group's reduce-scatters ride NVLink at 9x the bandwidth; "
                "each replica all-reduce moves 1/n of the gradients.");
  }
  say.phase("exercises: formula vs measured",
            "lessons/02-zero-fsdp-hsdp/main.cpp: run() computes every formula from the model's shape");
  if (q == 1) say.say("(Z8 is HSDP's all-reduce across replicas: it appears with --replicas.)\n\n");
  EquivalenceReport report;
  const bool equivalent = finish_with_equivalence(say, sheet, s, data, report);

  return finish_lesson("02-zero-fsdp-hsdp", o.json, o.preset, s, phases, sheet, report, equivalent,
                       [&](nlohmann::json& j) {
                         nlohmann::json shards = nlohmann::json::array();
                         for (size_t k = 0; k < segs.size(); ++k)
                           shards.push_back({{"segment", segment_name(segs[k], segs.size())},
                                             {"begin", segs[k].begin},
                                             {"end", segs[k].end},
                                             {"piece_size", layout.piece_size(k)},
                                             {"pieces", layout.piece_counts(k)}});
                         j["shard_map"] = shards;
                       });
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
