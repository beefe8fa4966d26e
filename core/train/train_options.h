#pragma once
// Everything that defines a training run besides the model shape. Saved with every checkpoint
// (trainer_state.json) so a resumed run continues the same schedule and the same batches.
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/data/tokenizer.h"
#include "core/optim/adamw.h"
#include "core/optim/lr_schedule.h"

namespace llama4d {

// Where a run following a training recipe (core/train/recipe.h) is: the stage a trainer runs.
// Its LR segment replaces the warm-up + cosine schedule of lr / min_lr / warmup_steps for the
// run's global steps [first_step, first_step + steps); batch_size and seq_len are the stage's.
struct RecipePosition {
  std::string recipe;       // the recipe's name: a resume refuses another recipe by it
  std::string fingerprint;  // of the recipe's seed and stages: a resume refuses a changed recipe
  int64_t stage = -1;       // 0-based; < 0: not a recipe run
  std::string stage_name;
  int64_t first_step = 0;   // global steps done before the stage
  int64_t steps = 0;        // the stage's length
  LrSegment lr;
  bool active() const { return stage >= 0; }
  // The LR of update `update` (1-based, global), which must lie in the stage: Error otherwise.
  double lr_at(int64_t update) const;
};

struct TrainOptions {
  int64_t steps = 300;             // optimizer steps in the whole run (the LR schedule's length)
  int64_t batch_size = 8;          // sequences per optimizer step: the global batch
  // Sequences per forward/backward, as asked: 0 = all the rows a device gets (the whole batch on
  // one device, batch_size / dp on a mesh). Saved as asked, not resolved, so a checkpoint
  // resumes on a mesh with another split.
  int64_t micro_batch_size = 0;
  int64_t seq_len = 256;           // tokens per sequence
  double lr = 3e-3;                // peak learning rate, reached after warmup_steps
  double min_lr = 3e-4;            // cosine decay floor at `steps`
  int64_t warmup_steps = 30;
  double grad_clip = 1.0;          // global L2 norm; <= 0 disables clipping
  uint64_t seed = 1337;            // initial weights and batches
  // Llama 3's document mask: a token attends only to earlier tokens of its own document, the
  // documents of a row being cut at <|end_of_text|> (mark_documents, core/data/batch_sampler.h).
  // Training and evaluation batches alike. Off: causal attention across the whole row.
  bool doc_mask = false;
  // The id the mask cuts after: the <|end_of_text|> the documents were packed with (the byte
  // tokenizer's 257, or a BPE model's own, e.g. Llama 3's 128001; end_of_text_id). Not saved in a
  // checkpoint: the commands set it from the model's tokenizer.
  int32_t doc_separator = kEndOfTextToken;
  // bf16 mixed precision (--dtype bf16; Llama::set_bf16_compute): bf16 weights and activations
  // for compute over f32 master weights, gradients and AdamW state. The trainers set it on the
  // model. Off: every tensor in the model's own type.
  bool bf16_compute = false;
  AdamWConfig adamw;
  // How the program driving the trainer ran the loop (the CLI's data path, evaluation and
  // checkpoint intervals). The trainers never read it; it is saved with the options so that a
  // resume continues the same way. A JSON object, kept as its text so that this header (included
  // by every trainer) does not need the whole JSON library.
  std::string loop = "{}";
  // A recipe run's stage (RecipePosition); inactive for a run of one shape.
  RecipePosition recipe;

  int64_t micro_batches() const { return batch_size / micro(); }
  int64_t micro() const { return micro_batch_size > 0 ? micro_batch_size : batch_size; }
  // Global batch tokens: the denominator of the mean loss whatever the micro-batching or mesh.
  int64_t tokens_per_step() const { return batch_size * seq_len; }

  // The LR of update `update` (1-based): the recipe stage's segment, else `schedule`.
  double lr_at(const LrSchedule& schedule, int64_t update) const;

  // Throws InputError naming the first bad value.
  void validate() const;
  nlohmann::json to_json() const;
  // Validated; older files (micro_batch_size saved resolved, no "loop") read as they were run.
  static TrainOptions from_json(const nlohmann::json& j);
};

// One option as the command line names it and where it sits in TrainOptions::to_json().
struct TrainOptionField {
  const char* flag;     // "--lr"; a field without a flag is named by its key ("adamw.beta1")
  const char* pointer;  // JSON pointer into to_json(): "/lr", "/adamw/beta1"
  bool may_change_on_resume;
};
// Every option of to_json() except `loop`. Those that may change on resume do not change what
// a step computes in exact arithmetic: --steps (extends or shortens the schedule from the step
// reached) and --micro-batch-size (how the rows are cut, like the mesh).
const std::vector<TrainOptionField>& train_option_fields();

// Why a resume refuses an option that would change the math; the same words wherever it is refused.
inline constexpr const char* kResumeKeepsTheMath =
    "a resumed run keeps what defines its math (start a new run to change it)";

// Whether a run saved with `saved` after `steps_done` steps can continue with `requested`:
// InputError naming the first option that would change the math of the run (with both
// values), or a --steps below the steps already done. Between stages of one recipe (both
// positions active, same name and fingerprint) what the recipe defines per stage (batch_size,
// seq_len, lr, min_lr, warmup_steps) changes by design; a recipe run resumes only a checkpoint
// of the same recipe, and a run of one shape none of a recipe's.
void check_resumable(const TrainOptions& saved, int64_t steps_done, const TrainOptions& requested);

// object[key] as an int64, only if it is stored as a whole number in range (1.5 or 1e300 are an
// InputError, never rounded); nlohmann's out_of_range if the key is absent.
int64_t whole_number(const nlohmann::json& object, const char* key);

}  // namespace llama4d
