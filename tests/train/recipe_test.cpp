// Recipe files: stages, lengths in steps or tokens, the LR across stages, and bad input named
// by stage and key.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <numbers>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/io/toml_file.h"
#include "core/train/recipe.h"
#include "core/train/stage_flags.h"

namespace llama4d {
namespace {

using nlohmann::json;

json two_stages() {
  return json::parse(R"({"seed": 7, "stages": [
    {"name": "ramp", "steps": 4, "batch_size": 8, "seq_len": 32, "dp": 2,
     "data": {"a": 1}, "lr": {"shape": "warmup", "from": 0, "to": 0.004}},
    {"name": "anneal", "tokens": 3072, "batch_size": 4, "seq_len": 64, "cp": 2,
     "data": {"a": 1, "b": 3}, "lr": {"shape": "cosine", "from": 0.004, "to": 0.0}}]})");
}

TEST(Recipe, ParsesStagesAndTheirLengths) {
  const Recipe r = parse_recipe(two_stages(), 128);
  EXPECT_EQ(r.seed, 7u);
  ASSERT_EQ(r.stages.size(), 2u);
  EXPECT_EQ(r.stages[0].steps, 4);
  EXPECT_EQ(r.stages[1].steps, 3072 / (4 * 64));  // 12
  EXPECT_EQ(r.stages[1].cp, 2);
  ASSERT_EQ(r.stages[1].data.size(), 2u);
  EXPECT_EQ(r.stages[1].data[1].path, "b");
  EXPECT_EQ(r.stages[1].data[1].weight, 3);
  EXPECT_EQ(r.total_steps(), 16);
  EXPECT_EQ(r.locate(3), (std::pair<size_t, int64_t>{0, 3}));
  EXPECT_EQ(r.locate(4), (std::pair<size_t, int64_t>{1, 0}));
  EXPECT_THROW(r.locate(16), InputError);
}

TEST(Recipe, LearningRateFollowsEachStagesSegment) {
  const Recipe r = parse_recipe(two_stages(), 128);
  // Warmup: 0.004 * k / 4 over steps 0..3.
  for (int k = 0; k < 4; ++k) EXPECT_DOUBLE_EQ(r.lr_at(k), 0.004 * k / 4.0);
  // Cosine from 0.004 to 0 over 12 steps: 0.004 * (1 + cos(pi k / 12)) / 2.
  for (int k = 0; k < 12; ++k) EXPECT_NEAR(r.lr_at(4 + k), 0.004 * (1 + std::cos(std::numbers::pi * k / 12)) / 2, 1e-17);
}

void expect_refused(json j, const std::string& needle, int64_t max_positions = 128) {
  try {
    parse_recipe(j, max_positions);
    ADD_FAILURE() << "accepted: " << needle;
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Recipe, BadInputNamesTheStageAndTheKey) {
  json j = two_stages();
  j["stages"][1]["batchsize"] = 4;
  expect_refused(j, "recipe stage 2 (\"anneal\") key \"batchsize\": unknown key");
  j = two_stages();
  j["stages"][0]["dp"] = 3;
  expect_refused(j, "stage 1 (\"ramp\") key \"batch_size\"");
  j = two_stages();
  j["stages"][1]["seq_len"] = 256;
  expect_refused(j, "stage 2 (\"anneal\") key \"seq_len\"");
  j = two_stages();
  j["stages"][1]["data"]["b"] = 0;
  expect_refused(j, "key \"data\": weight of b must be a number > 0");
  j["stages"][1]["data"]["b"] = -2;
  expect_refused(j, "weight of b");
  j = two_stages();
  j["stages"][1]["tokens"] = 3000;  // not a whole number of 256-token steps
  expect_refused(j, "key \"tokens\"");
  j = two_stages();
  j["stages"][0]["tokens"] = 1024;  // both steps and tokens
  expect_refused(j, "exactly one");
  j = two_stages();
  j["stages"][1]["seq_len"] = 34;  // not a multiple of 2·cp = 4
  expect_refused(j, "2·cp");
  j = two_stages();
  j["stages"][0]["lr"]["shape"] = "step";
  expect_refused(j, "stage 1 (\"ramp\") lr key \"shape\"");
  j = two_stages();
  j["stages"][0]["steps"] = 1.5;
  expect_refused(j, "key \"steps\": must be a whole number");
  j = two_stages();
  j["speed"] = 1;
  expect_refused(j, "recipe key \"speed\": unknown key");
  expect_refused(json::parse(R"({"stages": []})"), "recipe key \"stages\"");
}

// A recipe file in TOML is the recipe its keys spell in JSON: the stages written as [[stages]]
// tables give the same stages, the same fingerprint (what a resume is checked against) and the
// file's name as the recipe's. The oracle is two_stages(), parsed from JSON text by nlohmann.
TEST(Recipe, TomlFileIsTheSameRecipeAsItsJson) {
  const std::filesystem::path path = std::filesystem::temp_directory_path() / "llama4d_recipe_two_stages.toml";
  {
    std::ofstream out(path);
    out << R"(seed = 7

[[stages]]
name = "ramp"
steps = 4
batch_size = 8
seq_len = 32
dp = 2
data = { a = 1 }
lr = { shape = "warmup", from = 0, to = 0.004 }

[[stages]]
name = "anneal"
tokens = 3072
batch_size = 4
seq_len = 64
cp = 2
data = { a = 1, b = 3 }
lr = { shape = "cosine", from = 0.004, to = 0.0 }
)";
  }
  const Recipe toml = load_recipe(path.string(), 128);
  Recipe json_recipe = parse_recipe(two_stages(), 128);
  json_recipe.name = "llama4d_recipe_two_stages";  // load_recipe names a recipe without "name" by its file
  EXPECT_EQ(toml.name, json_recipe.name);
  EXPECT_EQ(toml.fingerprint(), json_recipe.fingerprint());
  ASSERT_EQ(toml.stages.size(), 2u);
  EXPECT_EQ(toml.stages[1].steps, 12);  // 3072 tokens of 4 x 64
  EXPECT_EQ(toml.stages[1].mesh(), json_recipe.stages[1].mesh());
  std::filesystem::remove(path);
}

// TOML's own errors name the file, line and column; a value JSON has no kind for names its key.
TEST(Recipe, BadTomlIsRefusedNamingWhere) {
  const auto refused = [](const std::string& text, const std::string& needle) {
    try {
      parse_toml(text, "r.toml");
      ADD_FAILURE() << "accepted: " << text;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  refused("seed = 7\nstages = [\n", "r.toml:");
  refused("seed = 7\nseed = 8\n", "r.toml:2:");                          // a key twice
  refused("[[stages]]\nwhen = 2026-12-03\n", "key stages[0].when: a date");
  refused("[[stages]]\nlr = { to = nan }\n", "key stages[0].lr.to");
  EXPECT_EQ(parse_toml("a = { b = [1, 2.5, \"c\", true] }\n", "r.toml"),
            json::parse(R"({"a": {"b": [1, 2.5, "c", true]}})"));
}

// --stage's text becomes the recipe JSON a file would hold: numbers as numbers, lr's three
// fields, data's sources with their weights (1 where left out, a ':' inside a path kept), and the
// default data where none is given.
TEST(StageFlags, SpellTheRecipeJsonOfAFile) {
  const json j = stage_flags_recipe({"name=ramp,steps=4,batch_size=8,seq_len=32,dp=2,lr=warmup:0:4e-3",
                                     "tokens=3072,batch_size=4,seq_len=64,cp=2,lr=cosine:4e-3:0,data=a+b:3+c:d:0.5"},
                                    7, "corpus");
  EXPECT_EQ(j.at("name"), "stages");
  EXPECT_EQ(j.at("seed"), 7);
  const json& s = j.at("stages");
  EXPECT_EQ(s[0].at("name"), "ramp");
  EXPECT_TRUE(s[0].at("steps").is_number_integer());
  EXPECT_EQ(s[0].at("steps"), 4);
  EXPECT_EQ(s[0].at("data"), json({{"corpus", 1}}));
  EXPECT_EQ(s[0].at("lr"), json({{"shape", "warmup"}, {"from", 0.0}, {"to", 4e-3}}));
  EXPECT_EQ(s[1].at("data"), json({{"a", 1}, {"b", 3}, {"c:d", 0.5}}));
  const Recipe r = parse_recipe(j, 128);
  EXPECT_EQ(r.stages[1].steps, 3072 / (4 * 64));
  EXPECT_EQ(r.stages[1].lr.shape, LrSegment::Shape::cosine);
}

TEST(StageFlags, BadTextIsRefusedNamingTheStageAndKey) {
  const auto refuses = [](const std::vector<std::string>& stages, const std::string& what) {
    try {
      stage_flags_recipe(stages, 1, "corpus");
      ADD_FAILURE() << "accepted " << stages.back();
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  refuses({"steps=1", "steps"}, "--stage 2 ('steps'): 'steps' is not KEY=VALUE");
  refuses({"=3"}, "is not KEY=VALUE");
  refuses({"lr=cosine:1"}, "key \"lr\": 'cosine:1' is not SHAPE:FROM:TO");
  refuses({"lr=cosine:x:1"}, "key \"lr\" FROM 'x'");
  refuses({"seq_len=1,seq_len=2"}, "key \"seq_len\": given twice");
  refuses({"data=a+a:2"}, "a is given twice");
  refuses({"data=:2"}, "has a source with no path");
}

}  // namespace
}  // namespace llama4d
