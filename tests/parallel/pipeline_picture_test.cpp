// The pipeline picture on timelines written by hand: each action a span of a chosen modelled
// duration (end_span's extra time), each idle gap a wait for a receive (join_comm), so every box,
// busy time and bubble below is known from the numbers in this file, not from the code under test.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/comm/trace.h"
#include "core/error.h"
#include "core/parallel/pipeline_picture.h"

namespace llama4d {
namespace {

const RankTrace::Clock::time_point kOrigin{};

void action(RankTrace& t, const std::string& name, double us) {
  t.begin_span(name);
  t.end_span(us);
}

// GPipe on 2 ranks, 2 micro-batches, forward 10 us and backward 20 us, communication free:
//   rank 0: F0 [0,10]  F1 [10,20]  waits for rank 1's B0 until 50  B0 [50,70]  B1 [70,90]
//   rank 1: waits for F0 until 10  F0 [10,20]  F1 [20,30]  B0 [30,50]  B1 [50,70]
// plus things that are not actions: a nested span, a wait, a comm-lane event, a top-level span
// whose name starts with an op word.
struct Gpipe {
  RankTrace r0{0, kOrigin, 100}, r1{1, kOrigin, 100};
  Gpipe() {
    r0.begin_span("forward mb 0 chunk 0");
    action(r0, "forward layer 0", 4);  // nested: inside the box, not a box
    r0.end_span(6);
    action(r0, "forward mb 1 chunk 0", 10);
    r0.join_comm(50, "recv grad mb 0");
    action(r0, "backward mb 0 chunk 0", 20);
    action(r0, "backward mb 1 chunk 0", 20);

    r1.join_comm(10, "recv mb 0");
    action(r1, "forward mb 0 chunk 0", 10);
    action(r1, "forward mb 1 chunk 0", 10);
    action(r1, "backward mb 0 chunk 0", 20);
    action(r1, "backward mb 1 chunk 0", 20);
    action(r1, "backward head", 0);
    r1.add_comm("forward mb 9 chunk 0", "send", 0, 0, 70, 70, 80);  // comm lane: not a box
  }
  PipelinePicture picture(std::string title = "GPipe, p=2, m=2") const { return pipeline_picture({&r0, &r1}, title); }
};

TEST(PipelinePicture, BoxesAreTheTopLevelActionSpans) {
  const PipelinePicture p = Gpipe().picture();
  EXPECT_EQ(p.title, "GPipe, p=2, m=2");
  EXPECT_EQ(p.ranks, 2);
  EXPECT_EQ(p.end_us, 90);
  struct Want {
    int rank;
    double start, end;
    char op;
    int mb;
  };
  const std::vector<Want> want = {{0, 0, 10, 'F', 0},  {0, 10, 20, 'F', 1},  {0, 50, 70, 'B', 0},
                                  {0, 70, 90, 'B', 1}, {1, 10, 20, 'F', 0},  {1, 20, 30, 'F', 1},
                                  {1, 30, 50, 'B', 0}, {1, 50, 70, 'B', 1}};
  ASSERT_EQ(p.boxes.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    SCOPED_TRACE("box " + std::to_string(i));
    const PipelineBox& b = p.boxes[i];
    EXPECT_EQ(b.rank, want[i].rank);
    EXPECT_EQ(b.start_us, want[i].start);
    EXPECT_EQ(b.end_us, want[i].end);
    EXPECT_EQ(b.op, want[i].op);
    EXPECT_EQ(b.micro_batch, want[i].mb);
    EXPECT_EQ(b.chunk, 0);
  }
}

TEST(PipelinePicture, BusyTimeAndBubble) {
  const PipelinePicture p = Gpipe().picture();
  // Each rank: 2 forwards of 10 + 2 backwards of 20 = 60 us busy in a 90 us step.
  EXPECT_EQ(p.busy_us(), (std::vector<double>{60, 60}));
  const std::vector<double> bubble = p.bubble_fraction();
  ASSERT_EQ(bubble.size(), 2u);
  EXPECT_DOUBLE_EQ(bubble[0], 1.0 / 3);
  EXPECT_DOUBLE_EQ(bubble[1], 1.0 / 3);
  EXPECT_EQ(PipelinePicture{}.bubble_fraction(), std::vector<double>{});
}

TEST(PipelinePicture, TextOfGpipe) {
  // 18 cells of 5 us: a forward is 2 cells, a backward 4.
  EXPECT_EQ(pipeline_text(Gpipe().picture(), 18),
            "GPipe, p=2, m=2  (90 us, one cell = 5 us)\n"
            "rank 0 |F0F1......B0  B1  | 33.3% bubble\n"
            "rank 1 |..F0F1B0  B1  ....| 33.3% bubble\n"
            "        0            90 us\n"
            "F forward, B backward, . idle; the number is the micro-batch\n");
  EXPECT_THROW(pipeline_text(Gpipe().picture(), 0), InputError);
}

TEST(PipelinePicture, TextOfSplitBackwardAndChunks) {
  // One rank, two chunks, zero bubble's split backward, 5 us cells: F 2 cells, I and W 1 each,
  // too narrow for "I0", so no box shows its micro-batch.
  RankTrace t(0, kOrigin, 100);
  action(t, "forward mb 0 chunk 0", 10);
  action(t, "forward mb 0 chunk 1", 10);
  action(t, "backward-input mb 0 chunk 1", 5);
  action(t, "backward-weight mb 0 chunk 1", 5);
  action(t, "backward-input mb 0 chunk 0", 5);
  action(t, "backward-weight mb 0 chunk 0", 5);
  const PipelinePicture p = pipeline_picture({&t}, "ZB, p=1, v=2");
  EXPECT_EQ(p.bubble_fraction(), std::vector<double>{0});
  EXPECT_EQ(pipeline_text(p, 8),
            "ZB, p=1, v=2  (40 us, one cell = 5 us)\n"
            "rank 0 |F f iwIW| 0.0% bubble\n"
            "        0  40 us\n"
            "F forward, I backward-input, W backward-weight, . idle; one letter per action (some boxes are too "
            "narrow for their micro-batch: more columns show them); lowercase: chunk >= 1\n");
}

TEST(PipelinePicture, TextNumbersEveryBoxOrNone) {
  // Forwards of 1, 2, 1 and 2 cells: numbering the wide ones only drew "FF1FF3", where no box
  // could be told from its neighbour (issue 51); with 2 cells each, every box says its number.
  RankTrace t(0, kOrigin, 100);
  for (int mb = 0; mb < 4; ++mb) action(t, pipeline_span_name('F', mb, 0), mb % 2 ? 10 : 5);
  const std::string narrow = pipeline_text(pipeline_picture({&t}, "mixed"), 6);
  EXPECT_NE(narrow.find("rank 0 |FF FF | 0.0% bubble\n"), std::string::npos) << narrow;
  RankTrace u(0, kOrigin, 100);
  for (int mb = 0; mb < 4; ++mb) action(u, pipeline_span_name('F', mb, 0), 10);
  const std::string even = pipeline_text(pipeline_picture({&u}, "even"), 8);
  EXPECT_NE(even.find("rank 0 |F0F1F2F3| 0.0% bubble\n"), std::string::npos) << even;
}

TEST(PipelinePicture, TextNamesChunksWhenCaseIsNotEnough) {
  // Three chunks of 20 us: with 4 cells a box every label fits its chunk; with 3 none does, and
  // no box says its chunk (all or none, so the labels read the same way).
  RankTrace t(0, kOrigin, 100);
  for (int c = 0; c < 3; ++c) action(t, pipeline_span_name('F', 0, c), 20);
  const PipelinePicture p = pipeline_picture({&t}, "v=3");
  const std::string wide = pipeline_text(p, 12), narrow = pipeline_text(p, 9);
  EXPECT_NE(wide.find("rank 0 |F0:0f0:1f0:2| 0.0% bubble\n"), std::string::npos) << wide;
  EXPECT_NE(wide.find("F forward, . idle; the number is the micro-batch, :c the chunk (lowercase: chunk >= 1)\n"),
            std::string::npos)
      << wide;
  EXPECT_NE(narrow.find("rank 0 |F0 f0 f0 | 0.0% bubble\n"), std::string::npos) << narrow;
  EXPECT_NE(narrow.find("F forward, . idle; the number is the micro-batch; lowercase: chunk >= 1\n"), std::string::npos)
      << narrow;
}

TEST(PipelinePicture, ShortBoxesKeepACell) {
  // A 1 us action in 10 us cells would round to nothing; it takes one cell instead.
  RankTrace t(0, kOrigin, 100);
  action(t, "forward mb 7 chunk 0", 1);
  t.join_comm(40, "recv");
  const PipelinePicture p = pipeline_picture({&t}, "short");
  EXPECT_NE(pipeline_text(p, 4).find("rank 0 |F...| 97.5% bubble\n"), std::string::npos);
}

TEST(PipelinePicture, SpanNamesRoundTrip) {
  EXPECT_EQ(pipeline_span_name('F', 3, 0), "forward mb 3 chunk 0");
  EXPECT_EQ(pipeline_span_name('B', 0, 2), "backward mb 0 chunk 2");
  EXPECT_EQ(pipeline_span_name('I', 12, 1), "backward-input mb 12 chunk 1");
  EXPECT_EQ(pipeline_span_name('W', 5, 3), "backward-weight mb 5 chunk 3");
  EXPECT_THROW(pipeline_span_name('X', 0, 0), InputError);
  EXPECT_THROW(pipeline_span_name('F', -1, 0), InputError);
  RankTrace t(0, kOrigin, 100);
  action(t, pipeline_span_name('W', 5, 3), 1);
  const PipelinePicture p = pipeline_picture({&t}, "");
  ASSERT_EQ(p.boxes.size(), 1u);
  EXPECT_EQ(p.boxes[0].op, 'W');
  EXPECT_EQ(p.boxes[0].micro_batch, 5);
  EXPECT_EQ(p.boxes[0].chunk, 3);
}

TEST(PipelinePicture, MalformedActionNameIsAnError) {
  for (const std::string name : {"forward mb x chunk 0", "backward mb 1 chunk", "forward mb -1 chunk 0",
                                  "backward-weight mb 1 chunk 0 ", "forward mb", "backward-input mb 1  chunk 0"}) {
    SCOPED_TRACE(name);
    RankTrace t(0, kOrigin, 100);
    action(t, name, 1);
    try {
      pipeline_picture({&t}, "bad");
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("\"" + name + "\""), std::string::npos) << e.what();
    }
  }
}

// Tag names in document order must nest: every <x ...> closed by </x>, or self-closing.
bool balanced_tags(const std::string& xml, int& elements) {
  std::vector<std::string> open;
  elements = 0;
  for (size_t i = xml.find('<'); i != std::string::npos; i = xml.find('<', i + 1)) {
    const size_t end = xml.find('>', i);
    if (end == std::string::npos) return false;
    const std::string tag = xml.substr(i + 1, end - i - 1);
    if (tag.starts_with("?")) continue;  // the XML declaration
    if (tag.starts_with("/")) {
      if (open.empty() || open.back() != tag.substr(1)) return false;
      open.pop_back();
      continue;
    }
    ++elements;
    if (!tag.ends_with("/")) open.push_back(tag.substr(0, tag.find(' ')));
  }
  return open.empty();
}

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t i = s.find(what); i != std::string::npos; i = s.find(what, i + 1)) ++n;
  return n;
}

TEST(PipelinePicture, SvgIsWellFormed) {
  const PipelinePicture p = Gpipe().picture("GPipe <p=2> & \"m=2\"");
  const std::string svg = pipeline_svg(p);
  ASSERT_TRUE(svg.starts_with("<?xml")) << svg;
  int elements = 0;
  EXPECT_TRUE(balanced_tags(svg, elements)) << svg;
  EXPECT_GT(elements, 20);
  EXPECT_EQ(count(svg, "<svg "), 1u);
  EXPECT_EQ(count(svg, "<rect "), p.boxes.size() + 1);  // the background and one per box
  // The title, escaped; no raw '&' outside an entity anywhere.
  EXPECT_NE(svg.find("GPipe &lt;p=2&gt; &amp; &quot;m=2&quot;"), std::string::npos);
  for (size_t i = svg.find('&'); i != std::string::npos; i = svg.find('&', i + 1))
    EXPECT_NE(svg.find(';', i), std::string::npos);
  // Micro-batch numbers inside the boxes (the axis ticks are 0, 20, ..., 80: no "1").
  EXPECT_EQ(count(svg, ">1</text>"), 4u);
  EXPECT_NE(svg.find("rank 1: backward mb 0 chunk 0, 30 to 50 us"), std::string::npos);
  EXPECT_EQ(count(svg, "33.3% bubble"), 2u);
  EXPECT_EQ(pipeline_svg(p), svg);  // deterministic
}

}  // namespace
}  // namespace llama4d
