// `train --recipe`: a recipe's stages run one after another on virtual GPUs, the state moving
// between the stages' meshes in memory. The run must end on the bytes that stopping at the
// boundary (--stop-at), saving, and resuming the recipe on the next mesh from disk gives, and a
// run interrupted anywhere and resumed must end on the uninterrupted run's bytes.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_test_util.h"
#include "tests/common/tier.h"

namespace {

using namespace llama4d::cli_test;

const std::string kCorpus = std::string(LLAMA4D_SOURCE_DIR) + "/data/corpus";

// Stage A: 3 steps of 4 rows x 32 tokens on dp=2, LR warm-up 1e-3 -> 3e-3. Stage B: the batch
// doubled on dp=4 (Llama 3's batch ramp), 3 steps, LR linear 3e-3 -> 0.
nlohmann::json batch_ramp(const std::string& name = "batch-ramp") {
  return {{"name", name},
          {"seed", 7},
          {"stages",
           {{{"name", "A"}, {"steps", 3}, {"batch_size", 4}, {"seq_len", 32}, {"dp", 2}, {"data", {{kCorpus, 1}}},
             {"lr", {{"shape", "warmup"}, {"from", 1e-3}, {"to", 3e-3}}}},
            {{"name", "B"}, {"steps", 3}, {"batch_size", 8}, {"seq_len", 32}, {"dp", 4}, {"data", {{kCorpus, 1}}},
             {"lr", {{"shape", "linear"}, {"from", 3e-3}, {"to", 0}}}}}}};
}

// Stage short: 2 steps of 4 x 32 on dp=2. Stage long: sequences of 64 on cp=2 x dp=2, given as
// tokens (2 steps of 4 x 64 = 512), LR cosine 3e-3 -> 3e-4.
nlohmann::json seq_ramp() {
  return {{"name", "seq-ramp"},
          {"stages",
           {{{"name", "short"}, {"steps", 2}, {"batch_size", 4}, {"seq_len", 32}, {"dp", 2}, {"data", {{kCorpus, 1}}},
             {"lr", {{"shape", "warmup"}, {"from", 1e-3}, {"to", 3e-3}}}},
            {{"name", "long"}, {"tokens", 512}, {"batch_size", 4}, {"seq_len", 64}, {"dp", 2}, {"cp", 2},
             {"data", {{kCorpus, 1}}}, {"lr", {{"shape", "cosine"}, {"from", 3e-3}, {"to", 3e-4}}}}}}};
}

std::string write_recipe(const std::string& name, const nlohmann::json& j) {
  const std::string path = tmp(name + ".json");
  std::ofstream(path) << j.dump(1);
  return path;
}

nlohmann::json train_json(const std::string& args) {
  const Result r = run("train --preset tiny --eval-every 0 --json " + args);
  EXPECT_EQ(r.code, 0) << args << "\n" << r.err;
  return r.code == 0 ? nlohmann::json::parse(r.out) : nlohmann::json();
}

void expect_same_checkpoint(const std::string& a, const std::string& b) {
  for (const char* f : {"config.json", "model.safetensors", "optimizer.safetensors", "trainer_state.json"}) {
    const std::string x = read_file(a + "/" + f), y = read_file(b + "/" + f);
    EXPECT_FALSE(x.empty()) << a << "/" << f;
    EXPECT_TRUE(x == y) << f << " differs between " << a << " and " << b;
  }
}

std::vector<nlohmann::json> metrics_rows(const std::string& out) {
  std::vector<nlohmann::json> rows;
  std::ifstream in(out + "/metrics.jsonl");
  for (std::string line; std::getline(in, line);) rows.push_back(nlohmann::json::parse(line));
  return rows;
}

// The recipe run against the same recipe stopped at the stage boundary, saved, and resumed on
// the next stage's mesh from disk: the same bytes, file by file.
TEST(RecipeRun, RunEqualsStoppingAtTheBoundaryAndResumingOnTheNextMesh) {
  struct Case {
    const char* name;
    nlohmann::json recipe;
    int boundary;
  };
  for (const Case& c : {Case{"dp2_to_dp4", batch_ramp(), 3}, Case{"cp1_to_cp2", seq_ramp(), 2}}) {
    SCOPED_TRACE(c.name);
    const std::string recipe = write_recipe(std::string("recipe_") + c.name, c.recipe);
    const std::string whole = tmp(std::string("recipe_whole_") + c.name), split = tmp(std::string("recipe_split_") + c.name);
    const nlohmann::json j = train_json("--recipe " + recipe + " --out " + whole);
    const nlohmann::json first = train_json("--recipe " + recipe + " --out " + split + " --stop-at " + std::to_string(c.boundary));
    ASSERT_FALSE(j.is_null());
    ASSERT_FALSE(first.is_null());
    EXPECT_EQ(first.at("stages").size(), 1u);  // stopped at the end of stage 1: nothing moved
    EXPECT_EQ(first.at("recipe").at("position").at("stage"), 2);
    EXPECT_EQ(first.at("recipe").at("position").at("step_in_stage"), 0);
    const nlohmann::json second = train_json("--recipe " + recipe + " --out " + split + " --resume " + split + "/checkpoint");
    ASSERT_FALSE(second.is_null());
    EXPECT_EQ(second.at("stages").size(), 1u);
    expect_same_checkpoint(whole + "/checkpoint", split + "/checkpoint");
    EXPECT_EQ(j.at("final_loss"), second.at("final_loss"));

    // Per stage: the steps, the tokens (steps x batch x seq_len, by hand) and what moved.
    const nlohmann::json& s = j.at("stages");
    ASSERT_EQ(s.size(), 2u);
    EXPECT_EQ(s[0].at("name"), c.recipe["stages"][0]["name"]);
    EXPECT_EQ(s[1].at("name"), c.recipe["stages"][1]["name"]);
    EXPECT_FALSE(s[0].contains("reshard"));
    for (const nlohmann::json& stage : s) EXPECT_GT(stage.at("simulated").at("step_us").get<double>(), 0) << stage.dump();
    const nlohmann::json& moved = s[1].at("reshard");
    EXPECT_GE(moved.at("seconds").get<double>(), 0);
    EXPECT_EQ(j.at("recipe").at("position").at("finished"), true);
    // N parameters, three fp32 tensors of them (weights, two moments): 12 N bytes of state. Every
    // rank of the second plan (4 of them) reads all of it; ranks 0 and 1 wrote it between them
    // on the first plan, so 4 x 12 N - 12 N bytes came from another rank.
    const int64_t n = j.at("parameters").get<int64_t>(), state = 12 * n;
    EXPECT_EQ(moved.at("bytes_read"), 4 * state);
    EXPECT_EQ(moved.at("bytes_moved"), 3 * state);
    if (std::string(c.name) == "dp2_to_dp4") {
      EXPECT_EQ(s[0].at("steps"), 3);
      EXPECT_EQ(s[0].at("tokens"), 3 * 4 * 32);
      EXPECT_EQ(s[1].at("steps"), 3);
      EXPECT_EQ(s[1].at("tokens"), 3 * 8 * 32);
      EXPECT_EQ(moved.at("from_mesh"), "dp=2");
      EXPECT_EQ(moved.at("to_mesh"), "dp=4");
    } else {
      EXPECT_EQ(s[1].at("steps"), 2);  // 512 tokens of 4 x 64
      EXPECT_EQ(s[1].at("tokens"), 2 * 4 * 64);
      EXPECT_EQ(moved.at("to_mesh"), "cp=2,dp=2");
    }
  }
}
// Sanitizer tier: the ThreadSanitizer preset runs only this tier of tests/cli, and this test is
// its run of run_recipe's rank threads (the stage results and simulated clocks they share).
LLAMA4D_TIER(RecipeRun, RunEqualsStoppingAtTheBoundaryAndResumingOnTheNextMesh, sanitizer);

// Three stages: the sequence doubled on cp=2 x dp=2, then annealed on that same mesh (only the
// rows, the sequence and the LR change). The boundary into the annealing keeps the state in
// place: 0 bytes moved or read, every rank of it counted; and the run still ends on the bytes of
// stopping there, saving and resuming from disk on that plan.
TEST(RecipeRun, SameMeshBoundaryMovesNothingAndEqualsSaveAndResume) {
  nlohmann::json recipe = seq_ramp();
  recipe["name"] = "same-mesh";
  recipe["stages"].push_back({{"name", "anneal"}, {"steps", 2}, {"batch_size", 2}, {"seq_len", 128}, {"dp", 2},
                              {"cp", 2}, {"data", {{kCorpus, 1}}}, {"lr", {{"shape", "linear"}, {"from", 3e-4}, {"to", 0}}}});
  const std::string file = write_recipe("recipe_same_mesh", recipe);
  const std::string whole = tmp("recipe_same_mesh_whole"), split = tmp("recipe_same_mesh_split");
  const nlohmann::json j = train_json("--recipe " + file + " --out " + whole);
  ASSERT_FALSE(j.is_null());
  const nlohmann::json& s = j.at("stages");
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[1].at("reshard").at("in_place"), false);
  const nlohmann::json& kept = s[2].at("reshard");
  EXPECT_EQ(kept.at("in_place"), true);
  EXPECT_EQ(kept.at("from_mesh"), "cp=2,dp=2");
  EXPECT_EQ(kept.at("to_mesh"), "cp=2,dp=2");
  EXPECT_EQ(kept.at("bytes_moved"), 0);
  EXPECT_EQ(kept.at("bytes_read"), 0);
  EXPECT_EQ(kept.at("bytes_moved_per_rank"), nlohmann::json::array({0, 0, 0, 0}));
  EXPECT_EQ(s[2].at("steps"), 2);
  EXPECT_EQ(s[2].at("tokens"), 2 * 2 * 128);
  EXPECT_GT(s[2].at("simulated").at("step_us").get<double>(), 0);
  // The rows of the stage after the kept boundary are its own: 2 rows of 128 tokens, LR 3e-4 then 1.5e-4.
  const std::vector<nlohmann::json> rows = metrics_rows(whole);
  ASSERT_EQ(rows.size(), 6u);
  EXPECT_EQ(rows[4].at("stage"), "anneal");
  EXPECT_NEAR(rows[4].at("lr").get<double>(), 3e-4, 1e-15);
  EXPECT_NEAR(rows[5].at("lr").get<double>(), 1.5e-4, 1e-15);
  ASSERT_FALSE(train_json("--recipe " + file + " --out " + split + " --stop-at 4").is_null());
  const nlohmann::json second = train_json("--recipe " + file + " --out " + split + " --resume " + split + "/checkpoint");
  ASSERT_FALSE(second.is_null());
  expect_same_checkpoint(whole + "/checkpoint", split + "/checkpoint");
  EXPECT_EQ(j.at("final_loss"), second.at("final_loss"));
}
LLAMA4D_TIER(RecipeRun, SameMeshBoundaryMovesNothingAndEqualsSaveAndResume, quick);

// Every metrics row names its stage, and the LR of each step is the stage's segment, by hand:
// warm-up 1e-3 -> 3e-3 over 3 steps is 1e-3 + 2e-3 k / 3 at k = 0, 1, 2; linear 3e-3 -> 0 over
// 3 steps is 3e-3, 2e-3, 1e-3.
TEST(RecipeRun, MetricsRowsCarryTheStageAndItsLearningRate) {
  const std::string recipe = write_recipe("recipe_rows", batch_ramp()), out = tmp("recipe_rows_out");
  ASSERT_FALSE(train_json("--recipe " + recipe + " --out " + out).is_null());
  const std::vector<nlohmann::json> rows = metrics_rows(out);
  ASSERT_EQ(rows.size(), 6u);
  const double lr[] = {1e-3, 1e-3 + 2e-3 / 3, 1e-3 + 4e-3 / 3, 3e-3, 2e-3, 1e-3};
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(rows[i].at("step"), int64_t(i) + 1);
    EXPECT_EQ(rows[i].at("stage"), i < 3 ? "A" : "B");
    EXPECT_NEAR(rows[i].at("lr").get<double>(), lr[i], 1e-15) << "step " << i + 1;
  }
}
LLAMA4D_TIER(RecipeRun, MetricsRowsCarryTheStageAndItsLearningRate, quick);

// Interrupted in the middle of stage 1 or of stage 2 and resumed: the uninterrupted run's final
// checkpoint, byte for byte; the checkpoint records where in the recipe it stopped.
TEST(RecipeRun, InterruptedAnywhereAndResumedEndsOnTheSameCheckpoint) {
  const std::string recipe = write_recipe("recipe_interrupt", batch_ramp()), whole = tmp("recipe_interrupt_whole");
  ASSERT_FALSE(train_json("--recipe " + recipe + " --out " + whole).is_null());
  for (const int stop : {2, 5}) {
    SCOPED_TRACE(stop);
    const std::string out = tmp("recipe_interrupt_" + std::to_string(stop));
    const nlohmann::json first = train_json("--recipe " + recipe + " --out " + out + " --stop-at " + std::to_string(stop));
    ASSERT_FALSE(first.is_null());
    const nlohmann::json& at = first.at("recipe").at("position");
    EXPECT_EQ(at.at("step"), stop);
    EXPECT_EQ(at.at("stage"), stop <= 3 ? 1 : 2);
    EXPECT_EQ(at.at("step_in_stage"), stop <= 3 ? stop : stop - 3);
    const nlohmann::json state = nlohmann::json::parse(read_file(out + "/checkpoint/trainer_state.json"));
    EXPECT_NE(state.dump().find("\"stage_name\":\"" + std::string(stop <= 3 ? "A" : "B") + "\""), std::string::npos)
        << state.dump();
    ASSERT_FALSE(train_json("--recipe " + recipe + " --out " + out + " --resume " + out + "/checkpoint").is_null());
    expect_same_checkpoint(whole + "/checkpoint", out + "/checkpoint");
    const std::vector<nlohmann::json> rows = metrics_rows(out);
    EXPECT_EQ(rows.size(), 6u);  // each step once
  }
}
LLAMA4D_TIER(RecipeRun, InterruptedAnywhereAndResumedEndsOnTheSameCheckpoint, quick);

// A resume follows the recipe that saved the checkpoint: another recipe is refused by name, the
// same name with other stages by its fingerprint, and a plain resume is told to pass --recipe.
TEST(RecipeRun, ResumeRefusesAnotherRecipe) {
  const std::string recipe = write_recipe("recipe_own", batch_ramp("own")), out = tmp("recipe_own_out");
  ASSERT_FALSE(train_json("--recipe " + recipe + " --out " + out + " --stop-at 2").is_null());
  const std::string ckpt = " --resume " + out + "/checkpoint --out " + out;
  expect_bad_input(run("train --recipe " + write_recipe("recipe_other", batch_ramp("other")) + ckpt),
                   "recipe \"other\" is not the checkpoint's recipe \"own\"");
  nlohmann::json changed = batch_ramp("own");
  changed["stages"][1]["steps"] = 4;
  expect_bad_input(run("train --recipe " + write_recipe("recipe_changed", changed) + ckpt), "has changed since");
  expect_bad_input(run("train --preset tiny" + ckpt), "resume it with --recipe");
}
LLAMA4D_TIER(RecipeRun, ResumeRefusesAnotherRecipe, quick);

// What the recipe gives cannot also come from a flag; a stage whose batch does not divide its
// mesh is refused naming the stage; other backends, naming --recipe.
TEST(RecipeRun, ConflictsAndUnsupportedInputAreRefusedByName) {
  const std::string recipe = write_recipe("recipe_flags", batch_ramp()), out = " --out " + tmp("recipe_flags_out");
  const std::vector<std::string> flags = {"--mesh dp=2", "--batch-size 8", "--seq-len 64", "--steps 9",
                                          "--lr 0.01", "--min-lr 0", "--warmup-steps 2", "--seed 3",
                                          "--data " LLAMA4D_SOURCE_DIR "/data/corpus", "--straggler-factor 2",
                                          "--straggler-margin 0.1", "--heartbeat-timeout 0.5", "--on-lost-node shrink",
                                          "--trace " + tmp("recipe_trace.json")};
  for (const std::string& flag : flags) {
    const std::string name = flag.substr(0, flag.find(' '));
    expect_bad_input(run("train --preset tiny --recipe " + recipe + " " + flag + out), name + " and --recipe");
  }
  expect_bad_input(run("train --preset tiny --recipe " + recipe + " --backend mpi" + out), "--recipe runs on virtual GPUs");
  nlohmann::json odd = batch_ramp();
  odd["stages"][1]["batch_size"] = 6;
  expect_bad_input(run("train --preset tiny --recipe " + write_recipe("recipe_odd", odd) + out),
                   "recipe stage 2 (\"B\") key \"batch_size\"");
}
LLAMA4D_TIER(RecipeRun, ConflictsAndUnsupportedInputAreRefusedByName, quick);

// batch_ramp() on the command line: the same stages as --stage flags (data left to its default,
// the shipped corpus) train the same weights and optimizer state as the file, and a run of the
// flags stopped inside stage 1 resumes with the same flags onto those bytes. The flags' own
// mistakes are refused naming the --stage and its key.
TEST(RecipeRun, StageFlagsAreTheFilesRecipeOnTheCommandLine) {
  const std::string stages =
      " --seed 7 --stage name=A,steps=3,batch_size=4,seq_len=32,dp=2,lr=warmup:1e-3:3e-3"
      " --stage name=B,steps=3,batch_size=8,seq_len=32,dp=4,lr=linear:3e-3:0";
  const std::string file = tmp("recipe_as_file"), flags = tmp("recipe_as_flags");
  const nlohmann::json j = train_json("--recipe " + write_recipe("recipe_as_file", batch_ramp()) + " --out " + file);
  ASSERT_FALSE(train_json(stages + " --out " + flags + " --stop-at 2").is_null());
  const nlohmann::json k = train_json(stages + " --out " + flags + " --resume " + flags + "/checkpoint");
  ASSERT_FALSE(j.is_null());
  ASSERT_FALSE(k.is_null());
  for (const char* f : {"config.json", "model.safetensors", "optimizer.safetensors"})
    EXPECT_TRUE(read_file(file + "/checkpoint/" + f) == read_file(flags + "/checkpoint/" + f)) << f;
  EXPECT_EQ(k.at("recipe").at("stage_flags").size(), 2u);
  EXPECT_TRUE(k.at("recipe").at("file").is_null());

  const std::string out = " --out " + tmp("recipe_flags_bad");
  expect_bad_input(run("train --preset tiny --stage steps=3,batch_size=4" + out), "key \"seq_len\": missing");
  expect_bad_input(run("train --preset tiny --stage steps=3,batch_size=4,seq_len=32,lr=warmup:0" + out),
                   "--stage 1 ('steps=3,batch_size=4,seq_len=32,lr=warmup:0') key \"lr\"");
  expect_bad_input(run("train --preset tiny --stage steps=3,batch_size=4,seq_len=32,lr=linear:0:1,steps=4" + out),
                   "key \"steps\": given twice");
  expect_bad_input(run("train --preset tiny --stage steps=3,batch_size=4,seq_len=32,lr=linear:0:1,dp=3" + out),
                   "--stage: recipe stage 1 key \"batch_size\": 4 rows do not divide among dp = 3");
  expect_bad_input(run("train --preset tiny --stage steps=3,batch_size=4,seq_len=32,lr=linear:0:1 --batch-size 8" + out),
                   "--batch-size and --stage");
  expect_bad_input(run("train --preset tiny --stage steps=3 --recipe " + write_recipe("recipe_both", batch_ramp()) + out),
                   "--stage and --recipe");
}
LLAMA4D_TIER(RecipeRun, StageFlagsAreTheFilesRecipeOnTheCommandLine, quick);

// A stage with a data mix (the corpus 3 : README.md 1, Llama 3's upsampling of a source in
// miniature) draws its rows from both sources: the shares it reports lie within binomial error
// of the weights (160 rows: sigma = sqrt(0.75 x 0.25 / 160) = 0.034, allowed 4 sigma), they count
// every row (20 steps x 8), the mix changes the weights' bytes, and a run interrupted inside the
// mixed stage resumes onto the uninterrupted run's bytes.
TEST(RecipeRun, DataMixStageDrawsBothSourcesAndResumesExactly) {
  nlohmann::json recipe = batch_ramp("mix"), plain = batch_ramp("mix");
  const std::string readme = std::string(LLAMA4D_SOURCE_DIR) + "/README.md";
  recipe["stages"][1]["steps"] = plain["stages"][1]["steps"] = 20;
  recipe["stages"][1]["data"] = {{kCorpus, 3}, {readme, 1}};
  const std::string mixed = write_recipe("recipe_mix", recipe), single = write_recipe("recipe_mix_plain", plain);
  const std::string whole = tmp("recipe_mix_whole"), split = tmp("recipe_mix_split"), one = tmp("recipe_mix_one");
  const nlohmann::json j = train_json("--recipe " + mixed + " --out " + whole);
  ASSERT_FALSE(j.is_null());
  const nlohmann::json& data = j.at("stages").at(1).at("data");
  ASSERT_EQ(data.size(), 2u);
  int64_t rows = 0;
  for (const nlohmann::json& d : data) {
    const double expected = d.at("source") == readme ? 0.25 : 0.75;
    EXPECT_EQ(d.at("weight_share"), expected);
    EXPECT_NEAR(d.at("share").get<double>(), expected, 4 * 0.034) << d.dump();
    EXPECT_GT(d.at("rows").get<int64_t>(), 0);
    rows += d.at("rows").get<int64_t>();
  }
  EXPECT_EQ(rows, 20 * 8);
  ASSERT_FALSE(train_json("--recipe " + single + " --out " + one).is_null());
  EXPECT_FALSE(read_file(whole + "/checkpoint/model.safetensors") == read_file(one + "/checkpoint/model.safetensors"));
  ASSERT_FALSE(train_json("--recipe " + mixed + " --out " + split + " --stop-at 9").is_null());
  ASSERT_FALSE(train_json("--recipe " + mixed + " --out " + split + " --resume " + split + "/checkpoint").is_null());
  expect_same_checkpoint(whole + "/checkpoint", split + "/checkpoint");
}
LLAMA4D_TIER(RecipeRun, DataMixStageDrawsBothSourcesAndResumesExactly, quick);

// The shipped recipe (data/recipes/laptop.json) is valid for its model, every stage (the whole
// recipe is checked before the first step), and its corpus path resolves from any directory.
TEST(RecipeRun, ShippedRecipeRunsFromAnyDirectory) {
  const std::string out = tmp("recipe_shipped");
  const Result r = run("train --recipe " LLAMA4D_SOURCE_DIR "/data/recipes/laptop.json --stop-at 1 --eval-every 0 --json --out " + out);
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("recipe").at("name"), "laptop");
  EXPECT_EQ(j.at("recipe").at("total_steps"), 40 + 20 + 20 + 10 + 10);  // 20480 tokens / (8 x 128), / (8 x 256)
  EXPECT_EQ(j.at("stages").at(0).at("name"), "batch-8");
  EXPECT_EQ(j.at("options").at("loop").at("data").get<std::string>().find(LLAMA4D_SOURCE_DIR), 0u);
}
LLAMA4D_TIER(RecipeRun, ShippedRecipeRunsFromAnyDirectory, quick);

}  // namespace
