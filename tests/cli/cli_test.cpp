// End-to-end checks of the command line, the way a user meets it.
#include <gtest/gtest.h>

#include <cmath>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "cli_test_util.h"
#include "tests/common/tier.h"

namespace {

using namespace llama4d::cli_test;

TEST(Cli, UnknownPreset) {
  const std::string out = tmp("unknown_preset");
  expect_bad_input(run("train --preset llama5 --out " + out), "llama5");
  EXPECT_FALSE(fs::exists(out + "/checkpoint"));
}

TEST(Cli, MalformedConfig) {
  const std::string dir = tmp("bad_config");
  fs::create_directories(dir);
  std::ofstream(dir + "/config.json") << "{\"hidden_size\": 64, ";
  expect_bad_input(run("train --config " + dir + "/config.json --out " + dir + "/out"), "config.json");
  EXPECT_FALSE(fs::exists(dir + "/out/checkpoint"));
}

TEST(Cli, HeadsNotDivisibleByKvHeads) {
  const std::string dir = tmp("gqa");
  fs::create_directories(dir);
  std::ofstream(dir + "/config.json") << R"({"vocab_size": 264, "hidden_size": 48, "intermediate_size": 96,
    "num_hidden_layers": 1, "num_attention_heads": 6, "num_key_value_heads": 4, "max_position_embeddings": 64,
    "rope_theta": 500000.0, "rms_norm_eps": 1e-5, "tie_word_embeddings": false})";
  expect_bad_input(run("train --config " + dir + "/config.json --out " + dir + "/out"), "divisible");
}

TEST(Cli, MissingAndEmptyDataFile) {
  const std::string dir = tmp("data");
  fs::create_directories(dir);
  expect_bad_input(run("train --preset tiny --data " + dir + "/nope.txt --out " + dir + "/out"), "nope.txt");
  std::ofstream(dir + "/empty.txt").flush();
  expect_bad_input(run("train --preset tiny --data " + dir + "/empty.txt --out " + dir + "/out"), "empty.txt");
  EXPECT_FALSE(fs::exists(dir + "/out/checkpoint"));
}

TEST(Cli, LyingSafetensorsHeader) {
  const std::string dir = tmp("lying");
  fs::create_directories(dir);
  ASSERT_EQ(run("train --preset tiny --steps 1 --seq-len 16 --batch-size 2 --out " + dir + "/run").code, 0);
  const std::string ckpt = dir + "/run/checkpoint";
  // Rewrite the header so one tensor claims bytes past the end of the file.
  std::ifstream in(ckpt + "/model.safetensors", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  nlohmann::json header = nlohmann::json::parse(bytes.substr(8, n));
  auto& offsets = header["model.norm.weight"]["data_offsets"];
  offsets[1] = offsets[1].get<uint64_t>() + 1000000;
  std::string h = header.dump();
  h.resize(n, ' ');  // keep the header length so only the lie changes
  std::ofstream(ckpt + "/model.safetensors", std::ios::binary | std::ios::trunc) << bytes.substr(0, 8) << h << bytes.substr(8 + n);
  expect_bad_input(run("eval --checkpoint " + ckpt + " --max-windows 1 --seq-len 16"), "model.norm.weight");
}

TEST(Cli, NonWritableOut) {
  const std::string dir = tmp("nonwritable");
  fs::create_directories(dir);
  std::ofstream(dir + "/a_file") << "x";  // a directory cannot be created under a regular file
  expect_bad_input(run("train --preset tiny --out " + dir + "/a_file/out"), "a_file");
}

// An <out>/checkpoint that is not ours is refused before training (not after the whole run), and
// nothing in it is touched.
TEST(Cli, ForeignCheckpointDirectoryIsRefusedBeforeTraining) {
  const std::string dir = tmp("foreign_ckpt");
  fs::create_directories(dir + "/checkpoint");
  std::ofstream(dir + "/checkpoint/thesis.tex") << "mine";
  const Result r = run("train --preset tiny --seq-len 32 --steps 2 --eval-every 0 --out " + dir);
  expect_bad_input(r, "refusing to replace non-empty directory");
  EXPECT_FALSE(fs::exists(dir + "/metrics.jsonl")) << "no step ran";
  EXPECT_TRUE(fs::exists(dir + "/checkpoint/thesis.tex"));
  fs::remove_all(dir);
}

// A save killed mid-way leaves its staging directory; the next run removes it, but keeps one that
// belongs to a live process (a save in progress) and one that another machine made.
TEST(Cli, StaleStagingOfAKilledSaveIsRemovedOnTheNextStart) {
  const std::string dir = tmp("stale_staging");
  fs::create_directories(dir);
  char host[256] = {};
  ASSERT_EQ(gethostname(host, sizeof host - 1), 0);
  const pid_t child = fork();
  if (child == 0) _exit(0);
  ASSERT_GT(child, 0);
  waitpid(child, nullptr, 0);  // a pid that existed and is gone: the killed saver
  const std::string dead = dir + "/checkpoint.tmp-" + host + "-" + std::to_string(child) + "-0";
  const std::string live = dir + "/checkpoint.tmp-" + host + "-" + std::to_string(getpid()) + "-3";
  const std::string other = dir + "/checkpoint.tmp-some-other-host-" + std::to_string(child) + "-0";
  for (const std::string& d : {dead, live, other}) {
    fs::create_directories(d);
    std::ofstream(d + "/model.safetensors") << "partial";
  }
  const Result r = run("train --preset tiny --seq-len 32 --steps 1 --eval-every 0 --out " + dir + " --json");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("removed 1 staging directory left by a killed save"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dead));
  EXPECT_TRUE(fs::exists(live));
  EXPECT_TRUE(fs::exists(other));
  EXPECT_TRUE(fs::exists(dir + "/checkpoint/config.json"));
  fs::remove_all(dir);
}

// A run that diverges stops at the step where it did, says which, exits non-zero and saves
// nothing: on one device and on a mesh (where every rank stops at the same step).
TEST(Cli, DivergedRunStopsAndSavesNothing) {
  for (const std::string mesh : {"", " --mesh dp=2 --zero 3"}) {
    const std::string dir = tmp("diverged");
    const Result r = run("train --preset tiny --seq-len 32 --steps 4 --eval-every 0 --lr 1e30 --out " + dir + mesh);
    EXPECT_EQ(r.code, 1) << r.err;
    EXPECT_NE(r.err.find("diverged"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("step "), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(dir + "/checkpoint")) << "no checkpoint of non-finite weights" << mesh;
    fs::remove_all(dir);
  }
  // The last step's update itself overflows (lr 1e39, the peak of a 2-step schedule stopped after
  // step 1, is infinite in fp32) while its loss and gradient norm were finite: the weights are
  // checked before saving, on a mesh too.
  for (const std::string mesh : {"", " --mesh dp=2", " --mesh dp=2 --zero 3", " --mesh tp=2"}) {
    const std::string dir = tmp("diverged_last");
    const Result r = run("train --preset tiny --seq-len 32 --steps 2 --stop-at 1 --warmup-steps 0 --grad-clip 0 --eval-every 0 "
                         "--lr 1e39 --out " + dir + mesh);
    EXPECT_EQ(r.code, 1) << mesh << ": " << r.err;
    EXPECT_NE(r.err.find("step 1"), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(dir + "/checkpoint")) << "no checkpoint of non-finite weights" << mesh;
    fs::remove_all(dir);
  }
}

TEST(Cli, BadFlagValueExitsTwo) {
  const Result r = run("train --steps notanumber");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("notanumber"), std::string::npos) << "the error should quote the bad value: " << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
}

TEST(Cli, TrainEvalGenerateJson) {
  const std::string out = tmp("json");
  const Result t = run("train --preset tiny --steps 3 --seq-len 32 --batch-size 2 --eval-every 0 --out " + out + " --json");
  ASSERT_EQ(t.code, 0) << t.err;
  const auto j = nlohmann::json::parse(t.out);  // exactly one JSON object on stdout
  EXPECT_EQ(j.at("steps").get<int>(), 3);
  EXPECT_EQ(j.at("steps_this_run").get<int>(), 3);
  // Every training position has a target: steps * batch_size * seq_len = 3 * 2 * 32.
  EXPECT_EQ(j.at("tokens").get<int64_t>(), 192);
  EXPECT_TRUE(j.at("final_loss").is_number());
  // A fresh byte-level model starts near ln(264) = 5.58 nats per token; 3 steps cannot move it far.
  EXPECT_GT(j.at("final_loss").get<double>(), 3.0);
  EXPECT_LT(j.at("final_loss").get<double>(), 8.0);
  EXPECT_TRUE(j.at("val_loss").is_null());  // --eval-every 0: no validation
  EXPECT_GT(j.at("tokens_per_s").get<double>(), 0);
  // The options that ran are the ones passed.
  EXPECT_EQ(j.at("options").at("steps").get<int>(), 3);
  EXPECT_EQ(j.at("options").at("batch_size").get<int>(), 2);
  EXPECT_EQ(j.at("options").at("seq_len").get<int>(), 32);
  // tiny: 2*264*64 + 2*(128 + 2*64*64 + 2*64*32 + 3*64*176) + 64 (tests/io/test_config.cpp).
  EXPECT_EQ(j.at("parameters").get<int64_t>(), 126'272);
  EXPECT_EQ(j.at("ranks").get<int>(), 1);
  EXPECT_EQ(j.at("device").get<std::string>(), "cpu");
  EXPECT_EQ(j.at("kernels").get<std::string>(), "exact");
  EXPECT_EQ(j.at("plan").at("mesh_spec").get<std::string>(), "1 device");
  EXPECT_EQ(j.at("plan").at("world_size").get<int>(), 1);
  EXPECT_EQ(j.at("plan").at("zero").get<int>(), 0);
  EXPECT_EQ(j.at("checkpoint").get<std::string>(), out + "/checkpoint");
  EXPECT_TRUE(fs::exists(out + "/checkpoint/model.safetensors"));
  EXPECT_TRUE(fs::exists(out + "/checkpoint/optimizer.safetensors"));
  std::ifstream metrics(out + "/metrics.jsonl");
  std::string line;
  int rows = 0;
  double last_loss = 0;
  while (std::getline(metrics, line)) {
    const auto m = nlohmann::json::parse(line);
    for (const char* k : {"step", "loss", "lr", "grad_norm", "tokens_per_s"}) EXPECT_TRUE(m.contains(k)) << k;
    ++rows;
    EXPECT_EQ(m.at("step").get<int>(), rows);  // one row per step, in order
    EXPECT_GT(m.at("grad_norm").get<double>(), 0.0);
    last_loss = m.at("loss").get<double>();
  }
  EXPECT_EQ(rows, 3);
  EXPECT_EQ(last_loss, j.at("final_loss").get<double>());  // the summary reports the last step's loss

  const Result e = run("eval --checkpoint " + out + "/checkpoint --seq-len 32 --max-windows 4 --json");
  ASSERT_EQ(e.code, 0) << e.err;
  const auto je = nlohmann::json::parse(e.out);
  EXPECT_GT(je.at("loss").get<double>(), 0);
  EXPECT_EQ(je.at("tokens").get<int>(), 4 * 32);
  EXPECT_EQ(je.at("seq_len").get<int>(), 32);

  const Result g = run("generate --checkpoint " + out + "/checkpoint --prompt Hi --max-new-tokens 5 --json");
  ASSERT_EQ(g.code, 0) << g.err;
  const auto jg = nlohmann::json::parse(g.out);
  EXPECT_LE(jg.at("new_tokens").get<int>(), 5);
  EXPECT_EQ(jg.at("prompt").get<std::string>(), "Hi");
  EXPECT_EQ(jg.at("temperature").get<double>(), 0.0);  // the default: greedy
  ASSERT_EQ(jg.at("tokens").size(), jg.at("new_tokens").get<size_t>());
  for (const auto& tok : jg.at("tokens")) {
    // A byte model emits bytes; <|end_of_text|> (257) ends generation and is not listed.
    EXPECT_GE(tok.get<int>(), 0);
    EXPECT_LT(tok.get<int>(), 256) << "generated a special token";
  }

  // Resume continues the step count from the checkpoint.
  const Result r = run("train --resume " + out + "/checkpoint --out " + out + " --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto jr = nlohmann::json::parse(r.out);
  EXPECT_EQ(jr.at("steps_this_run").get<int>(), 0);  // it had finished all 3
  EXPECT_EQ(jr.at("steps").get<int>(), 3);
  EXPECT_EQ(jr.at("tokens").get<int64_t>(), 0);
  EXPECT_EQ(jr.at("options").at("batch_size").get<int>(), 2);  // the checkpoint's options, reused
  EXPECT_EQ(jr.at("options").at("seq_len").get<int>(), 32);
}

TEST(Cli, DataParallelTrainReportsMemoryAndTraffic) {
  const std::string out = tmp("dp_train");
  const Result t = run("train --preset tiny --mesh dp=2 --zero 3 --steps 2 --seq-len 32 --batch-size 4 --eval-every 0 --out " +
                       out + " --json");
  ASSERT_EQ(t.code, 0) << t.err;
  const auto j = nlohmann::json::parse(t.out);
  EXPECT_EQ(j.at("ranks").get<int>(), 2);
  EXPECT_EQ(j.at("peak_memory_per_rank").size(), 2u);
  EXPECT_GT(j.at("traffic").at("total_bytes_sent").get<int64_t>(), 0);
  EXPECT_EQ(j.at("steps").get<int>(), 2);
  // The global batch, counted once over both ranks: 2 steps * 4 sequences * 32 tokens.
  EXPECT_EQ(j.at("tokens").get<int64_t>(), 256);
  EXPECT_EQ(j.at("mesh").get<std::string>(), "dp=2");
  EXPECT_EQ(j.at("plan").at("mesh_spec").get<std::string>(), "dp=2");
  EXPECT_EQ(j.at("plan").at("world_size").get<int>(), 2);
  EXPECT_EQ(j.at("plan").at("zero").get<int>(), 3);
  EXPECT_EQ(j.at("options").at("batch_size").get<int>(), 4);
  EXPECT_EQ(j.at("options").at("seq_len").get<int>(), 32);
  EXPECT_EQ(j.at("parameters").get<int64_t>(), 126'272);
  // The checkpoint is unsharded: a single rank resumes it.
  const Result r = run("train --resume " + out + "/checkpoint --out " + out + " --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto jr = nlohmann::json::parse(r.out);
  EXPECT_EQ(jr.at("steps").get<int>(), 2);
  EXPECT_EQ(jr.at("steps_this_run").get<int>(), 0);
  EXPECT_EQ(jr.at("ranks").get<int>(), 1);
}

TEST(Cli, VerifyJsonReportsBitwiseEquivalence) {
  const Result v = run("verify --mesh dp=3 --zero 2 --steps 2 --seq-len 32 --json");
  ASSERT_EQ(v.code, 0) << v.err;
  const auto j = nlohmann::json::parse(v.out);
  EXPECT_TRUE(j.at("ok").get<bool>());
  EXPECT_TRUE(j.at("bitwise").get<bool>());
  EXPECT_EQ(j.at("losses_single"), j.at("losses_parallel"));
  EXPECT_EQ(j.at("grad_norms_single"), j.at("grad_norms_parallel"));
  // What was asked for is what ran.
  EXPECT_EQ(j.at("ranks").get<int>(), 3);
  EXPECT_EQ(j.at("device").get<std::string>(), "cpu");
  EXPECT_EQ(j.at("kernels").get<std::string>(), "exact");
  EXPECT_EQ(j.at("steps").get<int>(), 2);
  EXPECT_EQ(j.at("losses_single").size(), 2u);  // one loss per step
  EXPECT_EQ(j.at("grad_norms_parallel").size(), 2u);
  EXPECT_EQ(j.at("plan").at("mesh_spec").get<std::string>(), "dp=3");
  EXPECT_EQ(j.at("plan").at("world_size").get<int>(), 3);
  EXPECT_EQ(j.at("plan").at("zero").get<int>(), 2);
  EXPECT_EQ(j.at("peak_memory_per_rank").size(), 3u);
  // tiny: embedding, 9 tensors per layer * 2 layers, final norm, LM head.
  EXPECT_EQ(j.at("tensors").size(), 21u);
  for (const char* k : {"max_abs_err", "max_rel_err"}) EXPECT_EQ(j.at(k).get<double>(), 0.0);
}

// Gradients reduced in bf16: verify is bitwise against the replay that rounds like the wire, and
// train moves about half the bytes of the f32 reductions (the loss and norm stay f64). Asked of
// an f32 run, of a mesh with no gradient to reduce, or of the planner, it is refused by name.
TEST(Cli, GradientsReducedInBf16) {
  const Result v = run("verify --mesh dp=2 --zero 2 --dtype bf16 --grad-reduce-in-bf16 --steps 2 --seq-len 32 --json");
  ASSERT_EQ(v.code, 0) << v.err;
  const auto j = nlohmann::json::parse(v.out);
  EXPECT_TRUE(j.at("ok").get<bool>());
  EXPECT_TRUE(j.at("bitwise").get<bool>());
  EXPECT_TRUE(j.at("plan").at("bf16_grad_reduce").get<bool>());
  EXPECT_NE(j.at("strategy").get<std::string>().find("bf16 gradients"), std::string::npos);

  int64_t bytes[2] = {0, 0};
  for (int wire = 0; wire < 2; ++wire) {
    const Result t = run("train --preset tiny --mesh dp=2 --dtype bf16 --steps 1 --seq-len 32 --batch-size 4 --eval-every 0 " +
                         std::string(wire ? "--grad-reduce-in-bf16 " : "") + "--out " + tmp("bf16_wire") + " --json");
    ASSERT_EQ(t.code, 0) << t.err;
    bytes[wire] = nlohmann::json::parse(t.out).at("traffic").at("total_bytes_sent").get<int64_t>();
  }
  EXPECT_GT(bytes[1], 0);
  EXPECT_NEAR(double(bytes[1]) / double(bytes[0]), 0.5, 0.01) << bytes[1] << " vs " << bytes[0];

  expect_bad_input(run("verify --mesh dp=2 --grad-reduce-in-bf16"), "--dtype bf16");
  expect_bad_input(run("train --preset tiny --mesh dp=2 --grad-reduce-in-bf16 --out " + tmp("bf16_wire_f32")), "--dtype bf16");
  expect_bad_input(run("verify --mesh tp=2 --dtype bf16 --grad-reduce-in-bf16"), "dp x cp > 1");
  EXPECT_EQ(run("plan --preset tiny --mesh dp=2 --grad-reduce-in-bf16").code, 2);
}
// Bf16 reductions run in Bf16GradReduce.RingOverFourRanksWithinTheBounds.
LLAMA4D_TIER(Cli, GradientsReducedInBf16, full);

TEST(Cli, BadMeshIsAnInputError) {
  expect_bad_input(run("verify --mesh dp=two"), "dp=two");
  // Tensor parallelism names the constraint a model breaks (tiny has 4 heads).
  expect_bad_input(run("verify --mesh tp=3,dp=2"), "num_attention_heads");
  expect_bad_input(run("train --preset tiny --mesh tp=8 --out " + tmp("tp8")), "more ranks than");
  expect_bad_input(run("verify --mesh dp=4 --batch-size 6"), "divisible");
  expect_bad_input(run("verify --mesh dp=2 --micro-batch-size -2"), "--micro-batch-size");
  expect_bad_input(run("verify --mesh dp=2 --zero 1 --keep-params"), "--keep-params");
  expect_bad_input(run("verify --mesh dp=2 --zero 1 --reduce-once"), "--reduce-once applies to --zero 2 and 3");
  expect_bad_input(run("verify --mesh pp=3"), "every stage needs at least one layer");  // tiny has 2 layers
  expect_bad_input(run("verify --mesh pp=2 --pp-layers 1,2"), "adds up to 3 layers");
  expect_bad_input(run("train --preset tiny --mesh pp=2 --schedule pipedream --out " + tmp("pp_bad")), "pipedream");
  expect_bad_input(run("verify --preset small --seq-len 32 --mesh pp=2 --schedule interleaved --pp-chunks 2 --batch-size 6 --micro-batches 3"),
                   "not a multiple of 2");
  expect_bad_input(run("verify --mesh dp=2 --pp-chunks 2"), "pipeline parallelism");
  expect_bad_input(run("bench --mesh ep=2"), "expert");
  expect_bad_input(run("verify --mesh dp=2,dp=2"), "twice");
  expect_bad_input(run("verify --mesh dq=2"), "unknown dim");
  expect_bad_input(run("train --preset tiny --zero 3 --out " + tmp("zero_single")), "--mesh");
}

// Tensor parallelism end to end: verify on tp meshes (with and without sequence parallelism, with
// ZeRO-3 underneath, bitwise against the replay that adds TP's partial sums in rank order; with
// ring reductions held to the measured bounds), and a run saved on tp=2 x dp=2 that resumes on
// tp=4 with the sequence-parallel default.
TEST(Cli, TensorParallelVerifyTrainAndResumeOnAnotherTp) {
  for (const std::string args : {"--mesh tp=2,dp=2 --zero 3", "--mesh tp=4 --sp off", "--mesh tp=2 --dtype f64"}) {
    const Result v = run("verify " + args + " --steps 2 --seq-len 32 --json");
    ASSERT_EQ(v.code, 0) << args << "\n" << v.err;
    const auto j = nlohmann::json::parse(v.out);
    EXPECT_TRUE(j.at("ok").get<bool>()) << args;
    EXPECT_EQ(j.at("plan").at("sequence_parallel").get<bool>(), args.find("--sp off") == std::string::npos) << args;
    EXPECT_TRUE(j.at("bitwise").get<bool>()) << args;
    EXPECT_TRUE(j.at("bounds_per_step").empty()) << args << ": ordered reductions are held to the bits";
  }
  const Result ring = run("verify --mesh tp=2 --algo ring --steps 2 --seq-len 32 --json");
  ASSERT_EQ(ring.code, 0) << ring.err;
  EXPECT_FALSE(nlohmann::json::parse(ring.out).at("bounds_per_step").empty()) << "ring reductions: measured bounds";
  const std::string out = tmp("tp_resume");
  const Result first = run("train --preset tiny --seq-len 32 --batch-size 4 --steps 4 --stop-at 2 --mesh tp=2,dp=2 "
                           "--zero 3 --eval-every 0 --out " + out + " --json");
  ASSERT_EQ(first.code, 0) << first.err;
  EXPECT_NE(nlohmann::json::parse(first.out).at("strategy").get<std::string>().find("TP over 2 ranks with SP"),
            std::string::npos);
  const Result second = run("train --resume " + out + "/checkpoint --preset tiny --seq-len 32 --batch-size 4 --steps 4 "
                            "--mesh tp=4 --eval-every 0 --out " + out + " --json");
  ASSERT_EQ(second.code, 0) << second.err;
  const auto j = nlohmann::json::parse(second.out);
  EXPECT_EQ(j.at("steps_this_run").get<int>(), 2);
  EXPECT_TRUE(std::isfinite(j.at("final_loss").get<double>()));
}
// The library's sanitizer cases run tensor parallelism.
LLAMA4D_TIER(Cli, TensorParallelVerifyTrainAndResumeOnAnotherTp, full);

// Context parallelism end to end: verify on cp meshes (alone and under ZeRO-3 with full
// checkpointing), train with evaluation and a checkpoint that resumes on a data-parallel mesh,
// and bad plans named with exit 2.
TEST(Cli, ContextParallelVerifyTrainAndResume) {
  // A corpus of short documents, so that the rows hold several and the mask has work to do.
  const std::string docs = tmp("cp_documents");
  std::filesystem::create_directories(docs);
  for (int i = 0; i < 200; ++i)
    std::ofstream(docs + "/doc-" + std::to_string(1000 + i) + ".txt") << "Shard " << i << std::string(size_t(i % 9), '.');
  for (const auto& [args, algo] : {std::pair{"--mesh cp=2", "allgather"},
                                   std::pair{"--mesh cp=2,dp=2 --zero 3 --ac full --dtype f64", "allgather"},
                                   std::pair{"--mesh cp=2 --cp-algo ring --doc-mask --dtype f64 --data ", "ring"}}) {
    const bool masked = std::string(args).find("--doc-mask") != std::string::npos;
    const Result v = run(std::string("verify ") + args + (masked ? docs : "") + " --steps 2 --seq-len 32 --json");
    ASSERT_EQ(v.code, 0) << args << "\n" << v.err;
    const auto j = nlohmann::json::parse(v.out);
    EXPECT_TRUE(j.at("ok").get<bool>()) << args;
    EXPECT_EQ(j.at("plan").at("cp_algo").get<std::string>(), algo) << args;
    EXPECT_FALSE(j.at("bounds_per_step").empty()) << "CP is held to bounds, not bits";
    EXPECT_EQ(j.at("doc_mask").get<bool>(), masked);
    if (masked) {
      EXPECT_GT(j.at("document_boundaries").get<int>(), 8) << "rows of 32 over documents of 7 to 18 bytes";
    }
  }
  // Trained with document masks; the resume keeps them without being told.
  const std::string out = tmp("cp_resume");
  const Result first = run("train --preset tiny --seq-len 32 --batch-size 4 --steps 4 --stop-at 2 --mesh cp=2 "
                           "--doc-mask --eval-every 2 --out " + out + " --json");
  ASSERT_EQ(first.code, 0) << first.err;
  EXPECT_NE(nlohmann::json::parse(first.out).at("strategy").get<std::string>().find("CP over 2 ranks (allgather)"),
            std::string::npos) << first.out;
  const Result second = run("train --resume " + out + "/checkpoint --preset tiny --seq-len 32 --batch-size 4 --steps 4 "
                            "--mesh dp=2 --eval-every 0 --out " + out + " --json");
  ASSERT_EQ(second.code, 0) << second.err;
  EXPECT_EQ(nlohmann::json::parse(second.out).at("steps_this_run").get<int>(), 2);
  std::ifstream state(out + "/checkpoint/trainer_state.json");
  EXPECT_TRUE(nlohmann::json::parse(state).at("options").at("doc_mask").get<bool>());
  for (const auto& [args, says] : {std::pair{"--mesh cp=3 --seq-len 32", "not a multiple of 2*cp = 6"},
                                   std::pair{"--mesh dp=2 --cp-algo ring", "--cp-algo needs context parallelism"},
                                   std::pair{"--mesh cp=2 --cp-algo all", "expected allgather or ring"}}) {
    const Result bad = run(std::string("verify ") + args + " --steps 1");
    EXPECT_EQ(bad.code, 2) << args;
    EXPECT_NE(bad.err.find(says), std::string::npos) << args << ": " << bad.err;
  }
}
LLAMA4D_TIER(Cli, ContextParallelVerifyTrainAndResume, full);  // the library's sanitizer cases run context parallelism

// Pipeline parallelism end to end: verify is bitwise for a zero-bubble pipeline under ZeRO-3,
// train runs 1F1B and its checkpoint resumes on a data-parallel mesh, and `schedule` draws the
// timeline with the formula's bubble (text, SVG and JSON) or, with --measure, a model's.
TEST(Cli, PipelineParallelVerifyTrainResumeAndSchedule) {
  const Result v = run("verify --mesh pp=2,dp=2 --zero 3 --schedule zb-h1 --micro-batches 2 --steps 2 --seq-len 32 --json");
  ASSERT_EQ(v.code, 0) << v.err;
  const auto jv = nlohmann::json::parse(v.out);
  EXPECT_TRUE(jv.at("bitwise").get<bool>());
  EXPECT_EQ(jv.at("plan").at("pipeline").at("schedule").get<std::string>(), "zb-h1");

  const std::string out = tmp("pp_resume");
  const Result first = run("train --preset tiny --seq-len 32 --batch-size 4 --micro-batch-size 1 --steps 4 --stop-at 2 "
                           "--mesh pp=2 --eval-every 2 --out " + out + " --json");
  ASSERT_EQ(first.code, 0) << first.err;
  EXPECT_NE(nlohmann::json::parse(first.out).at("strategy").get<std::string>().find("PP over 2 ranks (1F1B, p=2, m=4)"),
            std::string::npos) << first.out;
  // Each pipeline rank reads its stages' tensors from the whole-model checkpoint, and writes them.
  const Result second = run("train --resume " + out + "/checkpoint --preset tiny --seq-len 32 --batch-size 4 --steps 4 "
                            "--stop-at 3 --mesh pp=2,dp=2 --zero 3 --micro-batch-size 1 --eval-every 0 --out " + out + " --json");
  ASSERT_EQ(second.code, 0) << second.err;
  EXPECT_EQ(nlohmann::json::parse(second.out).at("steps_this_run").get<int>(), 1);
  const Result third = run("train --resume " + out + "/checkpoint --preset tiny --seq-len 32 --batch-size 4 --steps 4 "
                           "--mesh dp=2 --eval-every 0 --out " + out + " --json");
  ASSERT_EQ(third.code, 0) << third.err;
  EXPECT_EQ(nlohmann::json::parse(third.out).at("steps_this_run").get<int>(), 1);

  const std::string svg = tmp("1f1b.svg");
  const Result s = run("schedule --pp 4 --micro-batches 8 --schedule 1f1b --svg " + svg + " --json");
  ASSERT_EQ(s.code, 0) << s.err;
  const auto js = nlohmann::json::parse(s.out);
  EXPECT_NEAR(js.at("bubble_fraction").get<double>(), 3.0 / 11.0, 1e-12);  // (p-1)/(m+p-1)
  EXPECT_NEAR(js.at("bubble_formula").get<double>(), 3.0 / 11.0, 1e-12);
  EXPECT_EQ(js.at("per_rank").at(0).at("peak_in_flight").get<int>(), 4);
  EXPECT_EQ(js.at("per_rank").at(3).at("peak_in_flight").get<int>(), 1);
  EXPECT_NE(read_file(svg).find("<svg"), std::string::npos);
  const Result text = run("schedule --pp 2 --micro-batches 2 --schedule gpipe");
  ASSERT_EQ(text.code, 0) << text.err;
  EXPECT_NE(text.out.find("rank 1 |"), std::string::npos) << text.out;
  const Result m = run("schedule --measure --preset tiny --seq-len 32 --pp 2 --micro-batches 4 --schedule zb-h1 --json");
  ASSERT_EQ(m.code, 0) << m.err;
  const auto jm = nlohmann::json::parse(m.out);
  EXPECT_GT(jm.at("bubble_fraction").get<double>(), 0.0);
  EXPECT_TRUE(jm.at("bubble_formula").is_null());
  EXPECT_GT(jm.at("per_rank").at(1).at("busy_us").get<double>(), 0.0);
  expect_bad_input(run("schedule --pp 2 --micro-batches 3 --schedule interleaved --pp-chunks 2"), "multiple");
  expect_bad_input(run("schedule --costs 1,2"), "--costs");
  expect_bad_input(run("schedule --preset tiny"), "--measure");
  expect_bad_input(run("schedule --measure --pp 1"), "--pp 2");
  expect_bad_input(run("verify --mesh dp=2 --schedule zb-h1"), "pipeline parallelism");
}
// A multi-rank verify, train and resume through the command line.
LLAMA4D_TIER(Cli, PipelineParallelVerifyTrainResumeAndSchedule, sanitizer);

TEST(Cli, ActivationCheckpointingFlag) {
  expect_bad_input(run("train --preset tiny --ac every:0 --out " + tmp("ac_bad")), "--ac");
  expect_bad_input(run("verify --ac sometimes"), "--ac");
  // verify with checkpointing under ZeRO-3 is still bitwise, and the plan says what ran.
  const Result v = run("verify --mesh dp=2 --zero 3 --ac every:sqrt --steps 2 --seq-len 32 --json");
  ASSERT_EQ(v.code, 0) << v.err;
  const auto j = nlohmann::json::parse(v.out);
  EXPECT_TRUE(j.at("ok").get<bool>());
  EXPECT_TRUE(j.at("bitwise").get<bool>());
  EXPECT_EQ(j.at("ranks").get<int>(), 2);
  EXPECT_EQ(j.at("steps").get<int>(), 2);
  EXPECT_EQ(j.at("plan").at("mesh_spec").get<std::string>(), "dp=2");
  EXPECT_EQ(j.at("plan").at("ac").get<std::string>(), "every:2");  // tiny has 2 layers: ceil(sqrt(2))
  EXPECT_EQ(j.at("plan").at("zero").get<int>(), 3);
  // bench reports MFU and HFU; full checkpointing recomputes, so HFU > MFU.
  const Result b = run("bench --preset tiny --seq-len 64 --ac full --iters 1 --warmup 0 --gemm-n 64 --gemm-seconds 0.05 --json");
  ASSERT_EQ(b.code, 0) << b.err;
  const auto jb = nlohmann::json::parse(b.out);
  EXPECT_GT(jb.at("hfu").get<double>(), jb.at("mfu").get<double>());
  EXPECT_GT(jb.at("recompute_flops_per_token").get<double>(), 0.0);
  // The CPU's ops are done when they return: nothing queued, nothing to report.
  EXPECT_TRUE(jb.at("ops_wait").is_null());
  // tiny's RoPE tables for 64 positions: cos and sin, head_dim 64 / 4 heads = 16, 8 frequencies, fp32.
  EXPECT_EQ(jb.at("peak_memory").at("other").get<int64_t>(), 2 * 64 * (16 / 2) * 4);
  expect_bad_input(run("bench --preset tiny --wait-every-op"), "--wait-every-op");
}

// --threads-sweep: the step and both GEMMs (ours, and the reference BLAS that scripts/setup.sh
// installs) on 1, 2, 4, ... threads up to --threads.
TEST(Cli, BenchSweepsThreadCountsBesideTheReferenceBlas) {
  const Result r = run("bench --preset tiny --seq-len 64 --threads 3 --threads-sweep --iters 1 --warmup 0 --gemm-n 64 "
                       "--gemm-seconds 0.03 --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_FALSE(j.at("reference_blas").is_null()) << "no OpenBLAS: scripts/setup.sh installs libopenblas0-pthread";
  EXPECT_NE(j.at("reference_blas").at("path").get<std::string>().find("blas"), std::string::npos);
  const auto& rows = j.at("threads_sweep");
#if LLAMA4D_CLI_THREADS
  const std::vector<int> expected = {1, 2, 3};
#else
  const std::vector<int> expected = {1};  // a build without OpenMP (ThreadSanitizer's) computes on one thread
#endif
  ASSERT_EQ(rows.size(), expected.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(rows[i].at("threads").get<int>(), expected[i]);
    EXPECT_GT(rows[i].at("tokens_per_s").get<double>(), 0.0);
    EXPECT_GT(rows[i].at("llama4d_flops_per_s").get<double>(), 0.0);
    EXPECT_GT(rows[i].at("reference_flops_per_s").get<double>(), 0.0);
  }
  EXPECT_TRUE(rows[0].at("tokens_per_s_over_two_threads").is_null());
  if (rows.size() > 1) {
    EXPECT_DOUBLE_EQ(rows[1].at("tokens_per_s_over_two_threads").get<double>(), 1.0);
  }

  // --sweep-threads: the counts given, in their order (a machine of many cores need not time 1
  // thread); a build that cannot run them says so.
  const std::string listed = "bench --preset tiny --seq-len 64 --sweep-threads 2,1 --iters 1 --warmup 0 --gemm-n 64 "
                             "--gemm-seconds 0.03 --json";
#if LLAMA4D_CLI_THREADS
  const Result l = run(listed);
  ASSERT_EQ(l.code, 0) << l.err;
  const auto listed_json = nlohmann::json::parse(l.out);
  const auto& listed_rows = listed_json.at("threads_sweep");
  ASSERT_EQ(listed_rows.size(), 2u);
  EXPECT_EQ(listed_rows[0].at("threads").get<int>(), 2);
  EXPECT_EQ(listed_rows[1].at("threads").get<int>(), 1);
  EXPECT_DOUBLE_EQ(listed_rows[0].at("tokens_per_s_over_two_threads").get<double>(), 1.0);
#else
  expect_bad_input(run(listed), "built without OpenMP");
#endif
  expect_bad_input(run("bench --preset tiny --seq-len 64 --sweep-threads 0"), "thread count must be in");
  expect_bad_input(run("bench --preset tiny --seq-len 64 --sweep-threads 1,2 --threads 2"), "drop --threads");
}

// --profile: the step's time by op. tiny has 2 blocks of 7 products (q, k, v, o, gate, up, down)
// and the LM head's: 15 products forward and 15 backward per step, one attention each way per
// block, and the ops' times and the time outside them add up to the step.
TEST(Cli, BenchProfilesTheStepOpByOp) {
  const std::string common = "bench --preset tiny --seq-len 64 --iters 2 --warmup 0 --gemm-n 64 --gemm-seconds 0.03 "
                             "--profile --json";
  const Result r = run(common);
  ASSERT_EQ(r.code, 0) << r.err;
  const auto p = nlohmann::json::parse(r.out).at("profile");
  EXPECT_EQ(p.at("steps").get<int>(), 2);
  std::map<std::string, nlohmann::json> ops;
  double in_ops = 0, previous = 1e300;
  for (const auto& o : p.at("by_op")) {
    ops[o.at("op").get<std::string>()] = o;
    const double s = o.at("seconds_per_step").get<double>();
    EXPECT_LE(s, previous) << "busiest first";
    previous = s;
    in_ops += s;
  }
  EXPECT_EQ(ops.at("matmul_forward").at("calls_per_step").get<double>(), 15.0);
  EXPECT_EQ(ops.at("matmul_backward").at("calls_per_step").get<double>(), 15.0);
  EXPECT_EQ(ops.at("attention_forward").at("calls_per_step").get<double>(), 2.0);
  EXPECT_EQ(ops.at("attention_backward").at("calls_per_step").get<double>(), 2.0);
  EXPECT_GT(ops.at("adamw_update").at("calls_per_step").get<double>(), 0.0);
  EXPECT_GT(ops.at("matmul_forward").at("flops_per_s").get<double>(), 0.0);
  EXPECT_TRUE(ops.at("rmsnorm_forward").at("flops_per_s").is_null());
  const double step = p.at("step_seconds").get<double>(), outside = p.at("outside_ops_seconds_per_step").get<double>();
  EXPECT_GE(outside, 0.0);
  EXPECT_NEAR(in_ops + outside, step, 1e-9 * step);
  // In a sweep, every thread count has its profile.
  const Result sweep = run(common + " --threads 2 --threads-sweep");
  ASSERT_EQ(sweep.code, 0) << sweep.err;
  const auto swept = nlohmann::json::parse(sweep.out);
  for (const auto& row : swept.at("threads_sweep")) EXPECT_EQ(row.at("profile").at("steps").get<int>(), 2);
  EXPECT_NE(sweep.err.find("speedup"), std::string::npos);
  expect_bad_input(run("bench --preset tiny --profile --mesh dp=2"), "--profile");
}
LLAMA4D_TIER(Cli, BenchProfilesTheStepOpByOp, full);  // the op profile wraps the kernels the other tests run

// bench on a mesh also times the step on the simulated cluster: per rank, compute is exactly the
// FLOPs the ops reported at --gpu-tflops, and the step is compute + exposed communication.
TEST(Cli, BenchReportsTheStepOnTheSimulatedClock) {
  const std::string common = "bench --preset tiny --seq-len 64 --mesh dp=2 --zero 3 --iters 1 --warmup 0 --gemm-n 64 "
                             "--gemm-seconds 0.05 --json";
  std::vector<nlohmann::json> sims;
  for (const char* rate : {"", " --gpu-tflops 100"}) {
    const Result b = run(common + rate);
    ASSERT_EQ(b.code, 0) << b.err;
    const nlohmann::json sim = nlohmann::json::parse(b.out).at("parallel").at("simulated");
    const double tflops = sim.at("gpu_tflops").get<double>();
    EXPECT_EQ(tflops, *rate ? 100.0 : 989.0);
    ASSERT_EQ(sim.at("per_rank").size(), 2u);
    for (const auto& r : sim.at("per_rank")) {
      const double flops = r.at("flops").get<double>(), compute = r.at("compute_us").get<double>();
      EXPECT_GT(flops, 0.0);
      EXPECT_NEAR(compute, flops / (tflops * 1e6), 1e-9 * compute);
      EXPECT_NEAR(r.at("step_us").get<double>(), compute + r.at("exposed_comm_us").get<double>(), 1e-9 * compute);
      EXPECT_GT(r.at("comm_busy_us").get<double>(), 0.0);
    }
    EXPECT_GT(sim.at("mfu").get<double>(), 0.0);
    EXPECT_GT(sim.at("compute_fraction").get<double>(), 0.0);
    EXPECT_LE(sim.at("compute_fraction").get<double>(), 1.0);
    sims.push_back(sim);
  }
  // The same FLOPs either way; only their price changed.
  EXPECT_EQ(sims[0].at("per_rank")[0].at("flops"), sims[1].at("per_rank")[0].at("flops"));
  expect_bad_input(run(common + " --gpu-tflops 0"), "--gpu-tflops");
  expect_bad_input(run("bench --preset tiny --seq-len 32 --gpu-tflops 50"), "--gpu-tflops");
}

// `plan` runs nothing: one JSON object for a 4D plan (memory by category, traffic per mesh
// dimension, bubble, MFU), the Llama 3 table, and bad input refused by name.
TEST(Cli, PlanPredictsA4DPlanAndTheLlama3Table) {
  const Result p = run("plan --preset small --mesh tp=2,cp=2,pp=2,dp=2 --zero 3 --ac selective --micro-batches 2 "
                       "--tokens 1e9 --json");
  ASSERT_EQ(p.code, 0) << p.err;
  const nlohmann::json j = nlohmann::json::parse(p.out);
  EXPECT_EQ(j.at("plan").at("world_size").get<int>(), 16);
  EXPECT_EQ(j.at("micro_batches").get<int>(), 2);
  EXPECT_GT(j.at("memory_per_gpu").at("params").get<int64_t>(), 0);
  EXPECT_TRUE(j.at("fits").get<bool>());
  EXPECT_NEAR(j.at("bubble_fraction").get<double>(), 1.0 / 3.0, 1e-12);  // (p-1)/(m+p-1), p = m = 2
  EXPECT_GT(j.at("mfu").get<double>(), 0.0);
  EXPECT_GT(j.at("days_for_budget").get<double>(), 0.0);
  // --doc-mask adds each micro-batch's document ids: 4 rows x 256 tokens of int32 per data rank.
  const Result plain = run("plan --preset small --mesh dp=2 --batch-size 8 --json");
  const Result masked = run("plan --preset small --mesh dp=2 --batch-size 8 --doc-mask --json");
  ASSERT_EQ(plain.code, 0) << plain.err;
  ASSERT_EQ(masked.code, 0) << masked.err;
  EXPECT_EQ(nlohmann::json::parse(masked.out).at("memory_per_gpu").at("activations").get<int64_t>() -
                nlohmann::json::parse(plain.out).at("memory_per_gpu").at("activations").get<int64_t>(),
            4 * 256 * 4);
  const Result t = run("plan --llama3 --json");
  ASSERT_EQ(t.code, 0) << t.err;
  const nlohmann::json table = nlohmann::json::parse(t.out);
  ASSERT_EQ(table.at("plans").size(), 3u);
  for (const nlohmann::json& row : table.at("plans")) EXPECT_TRUE(row.at("fits").get<bool>()) << row.dump();
  ASSERT_EQ(table.at("own_plans").size(), 2u);  // 8B and 70B, which the paper gives no layout for
  for (const nlohmann::json& row : table.at("own_plans")) EXPECT_TRUE(row.at("fits").get<bool>()) << row.dump();
  const Result big = run("plan --preset llama3-405b --mesh dp=8 --zero 1 --precision bf16 --seq-len 8192");
  ASSERT_EQ(big.code, 0) << big.err;
  EXPECT_NE(big.out.find("DOES NOT FIT"), std::string::npos) << big.out;
  expect_bad_input(run("plan --preset small --mesh tp=4"), "num_attention_heads");
  expect_bad_input(run("plan --preset small --mesh dp=2 --precision fp8"), "--precision");
  expect_bad_input(run("plan --preset small --mesh dp=2 --efficiency 2"), "--efficiency");
  // Nothing is silently replaced: a micro-batch count the rows do not divide, both micro-batch
  // flags at once, and plan flags that --llama3 would ignore are refused by name.
  expect_bad_input(run("plan --preset small --mesh dp=2 --batch-size 8 --micro-batches 3"), "--micro-batches 3");
  expect_bad_input(run("plan --preset small --mesh dp=2 --micro-batches 2 --micro-batch-size 2"), "not both");
  expect_bad_input(run("plan --llama3 --mesh dp=2"), "--mesh");
}

// A Llama 3 preset is planned at the paper's step unless flags say otherwise: 8K sequences, 16M
// tokens, bf16, micro-batches of one sequence (issue 51: 405B on tp=8,pp=16,dp=64 failed, 8 rows
// not dividing 64, and 70B planned 8 x 256 fp32 tokens). A plan with fewer micro-batches than
// stages says what its bubble means.
TEST(Cli, PlanOfALlama3PresetDefaultsToThePapersStep) {
  const Result r = run("plan --preset llama3-405b --mesh tp=8,cp=1,pp=16,dp=64 --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("seq_len").get<int64_t>(), 8192);
  EXPECT_EQ(j.at("seq_len").get<int64_t>() * j.at("batch_size").get<int64_t>(), int64_t(16) << 20);
  EXPECT_EQ(j.at("precision").get<std::string>(), "bf16");
  EXPECT_EQ(j.at("micro_batch_size").get<int64_t>(), 1);
  EXPECT_EQ(j.at("micro_batches").get<int64_t>(), 2048 / 64);
  EXPECT_TRUE(j.at("notes").empty()) << j.at("notes").dump();
  // The flags given win; m = 2 < p = 4 gets its note, in the table and the JSON.
  const Result few = run("plan --preset llama3-70b --mesh tp=8,pp=4,dp=4 --batch-size 8 --micro-batches 2 --json");
  ASSERT_EQ(few.code, 0) << few.err;
  const nlohmann::json f = nlohmann::json::parse(few.out);
  EXPECT_EQ(f.at("batch_size").get<int64_t>(), 8);
  ASSERT_EQ(f.at("notes").size(), 1u);
  EXPECT_NE(f.at("notes")[0].get<std::string>().find("never fills"), std::string::npos);
  const Result text = run("plan --preset llama3-70b --mesh tp=8,pp=4,dp=4 --batch-size 8 --micro-batches 2");
  ASSERT_EQ(text.code, 0) << text.err;
  EXPECT_NE(text.out.find("note: m = 2 micro-batches for p = 4 stages"), std::string::npos) << text.out;
  // Other presets keep their defaults.
  const Result small = run("plan --preset small --mesh dp=2 --json");
  ASSERT_EQ(small.code, 0) << small.err;
  EXPECT_EQ(nlohmann::json::parse(small.out).at("seq_len").get<int64_t>(), 256);
}

TEST(Cli, ThreadCountIsBounded) {
  expect_bad_input(run("train --preset tiny --threads 100000 --out " + tmp("threads")), "thread");
}

TEST(Cli, RealShapesAreNotAllocatedUnlessForced) {
  expect_bad_input(run("train --preset llama3-405b --out " + tmp("huge")), "--force");
}

}  // namespace
