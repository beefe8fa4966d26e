#include "core/parallel/pipeline_picture.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string_view>

#include "core/error.h"

namespace llama4d {

namespace {

// The four kinds of action, in the order the legends list them. Forward blue and backward green
// as in Narayanan et al.'s figures; zero bubble's two halves of a backward orange (input) and
// purple (weight).
struct OpKind {
  char letter;
  const char* word;    // in span names and legends
  int r, g, b;         // SVG fill for chunk 0
};
constexpr OpKind kOps[] = {
    {'F', "forward", 59, 120, 194},
    {'B', "backward", 63, 154, 79},
    {'I', "backward-input", 224, 138, 30},
    {'W', "backward-weight", 142, 99, 181},
};

const OpKind* op_by_letter(char letter) {
  for (const OpKind& k : kOps)
    if (k.letter == letter) return &k;
  return nullptr;
}

const OpKind* op_by_word(std::string_view word) {
  for (const OpKind& k : kOps)
    if (word == k.word) return &k;
  return nullptr;
}

// A non-negative decimal integer that is all of `s` (no sign, no spaces).
std::optional<int> parse_index(std::string_view s) {
  if (s.empty() || !std::isdigit(static_cast<unsigned char>(s[0]))) return std::nullopt;
  int v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

// The action a span name describes: nullopt for names that are not actions at all ("forward
// layer 3", "wait: recv"); an Error for a name that starts like an action ("<op> mb") but is
// not "<op> mb <m> chunk <c>".
std::optional<PipelineBox> parse_action(const std::string& name, int rank) {
  const std::string_view s = name;
  const size_t space = s.find(' ');
  if (space == std::string_view::npos) return std::nullopt;
  const OpKind* op = op_by_word(s.substr(0, space));
  std::string_view rest = s.substr(space + 1);
  if (!op || !(rest == "mb" || rest.starts_with("mb "))) return std::nullopt;
  const auto bad = [&] {
    return Error("pipeline picture: rank " + std::to_string(rank) + " has a span \"" + name +
                 "\", which is not \"" + op->word + " mb <micro-batch> chunk <chunk>\"");
  };
  rest.remove_prefix(std::min<size_t>(3, rest.size()));
  const size_t sep = rest.find(" chunk ");
  if (sep == std::string_view::npos) throw bad();
  const std::optional<int> mb = parse_index(rest.substr(0, sep)), chunk = parse_index(rest.substr(sep + 7));
  if (!mb || !chunk) throw bad();
  PipelineBox box;
  box.rank = rank;
  box.op = op->letter;
  box.micro_batch = *mb;
  box.chunk = *chunk;
  return box;
}

// Deterministic number formatting (printf in the "C" locale the library never changes).
std::string fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}
std::string num(double v) { return fmt("%.6g", v); }
std::string coord(double v) { return fmt("%.2f", v); }
std::string percent(double fraction) { return fmt("%.1f", 100 * fraction) + "%"; }

int max_chunk(const PipelinePicture& p) {
  int c = 0;
  for (const PipelineBox& b : p.boxes) c = std::max(c, b.chunk);
  return c;
}

// Each rank's boxes in start order (the order they are drawn in).
std::vector<std::vector<PipelineBox>> boxes_by_rank(const PipelinePicture& p) {
  std::vector<std::vector<PipelineBox>> lanes(size_t(std::max(p.ranks, 0)));
  for (const PipelineBox& b : p.boxes)
    if (b.rank >= 0 && b.rank < p.ranks) lanes[size_t(b.rank)].push_back(b);
  for (auto& lane : lanes)
    std::stable_sort(lane.begin(), lane.end(),
                     [](const PipelineBox& a, const PipelineBox& b) { return a.start_us < b.start_us; });
  return lanes;
}

// The letters and words of the ops that occur, in kOps order, for the legends.
std::vector<const OpKind*> ops_present(const PipelinePicture& p) {
  std::vector<const OpKind*> out;
  for (const OpKind& k : kOps)
    if (std::any_of(p.boxes.begin(), p.boxes.end(), [&](const PipelineBox& b) { return b.op == k.letter; }))
      out.push_back(&k);
  return out;
}

std::string xml_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default: out += c;
    }
  }
  return out;
}

// A round tick step (1, 2 or 5 times a power of ten) giving at most about eight ticks.
double tick_step(double end_us) {
  const double raw = end_us / 8;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0})
    if (m * mag >= raw) return m * mag;
  return 10 * mag;
}

}  // namespace

std::vector<double> PipelinePicture::busy_us() const {
  std::vector<double> busy(size_t(std::max(ranks, 0)), 0.0);
  for (const PipelineBox& b : boxes)
    if (b.rank >= 0 && b.rank < ranks) busy[size_t(b.rank)] += b.end_us - b.start_us;
  return busy;
}

std::vector<double> PipelinePicture::bubble_fraction() const {
  std::vector<double> f = busy_us();
  // An empty step (end 0) has no time to be idle in.
  for (double& x : f) x = end_us > 0 ? 1 - x / end_us : 0;
  return f;
}

std::string pipeline_span_name(char op, int micro_batch, int chunk) {
  const OpKind* k = op_by_letter(op);
  if (!k) throw InputError(std::string("a pipeline action is F, B, I or W, got '") + op + "'");
  if (micro_batch < 0 || chunk < 0)
    throw InputError("a pipeline action's micro-batch and chunk count from 0, got " + std::to_string(micro_batch) +
                     " and " + std::to_string(chunk));
  return std::string(k->word) + " mb " + std::to_string(micro_batch) + " chunk " + std::to_string(chunk);
}

PipelinePicture pipeline_picture(const std::vector<const RankTrace*>& ranks, std::string title) {
  PipelinePicture p;
  p.title = std::move(title);
  p.ranks = int(ranks.size());
  for (int r = 0; r < p.ranks; ++r) {
    const RankTrace& trace = *ranks[size_t(r)];
    p.end_us = std::max(p.end_us, trace.sim_now_us());
    for (const TraceEvent& e : trace.events()) {
      if (e.lane != TraceLane::compute || e.category != TraceCategory::compute || e.depth != 0) continue;
      std::optional<PipelineBox> box = parse_action(e.name, r);
      if (!box) continue;
      box->start_us = e.sim_start_us;
      box->end_us = e.sim_end_us;
      p.end_us = std::max(p.end_us, e.sim_end_us);
      p.boxes.push_back(*box);
    }
  }
  return p;
}

std::string pipeline_text(const PipelinePicture& p, int columns) {
  if (columns < 1) throw InputError("a pipeline picture needs at least one column, got " + std::to_string(columns));
  const double per_cell = p.end_us / columns;
  const auto cell = [&](double t) {
    return per_cell > 0 ? int(std::clamp<double>(std::lround(t / per_cell), 0, columns)) : 0;
  };

  // Layout. Box edges round to the nearest cell boundary, so back-to-back boxes tile without
  // gaps. A box shorter than half a cell still gets one cell (pushing the next one right) rather
  // than vanishing: the picture may stretch, but it never hides an action.
  struct Placed {
    PipelineBox box;
    int from, to;  // cells [from, to)
  };
  std::vector<std::vector<Placed>> rows;
  for (const auto& lane : boxes_by_rank(p)) {
    rows.emplace_back();
    int cursor = 0;
    for (const PipelineBox& b : lane) {
      const int from = std::max(cursor, cell(b.start_us));
      if (from >= columns) break;
      const int to = std::min(std::max(cell(b.end_us), from + 1), columns);
      rows.back().push_back({b, from, to});
      cursor = to;
    }
  }

  // Labels: the op letter, lowercase for chunks >= 1 (the text's lighter shade), then the
  // micro-batch where it fits. With more than two chunks case cannot tell chunk 1 from 2, so
  // ":chunk" is appended, but only if it fits in every box: a picture where some boxes say
  // their chunk and some do not would read as two different things.
  const int last_chunk = max_chunk(p);
  const auto letter = [](const PipelineBox& b) {
    return b.chunk > 0 ? char(std::tolower(static_cast<unsigned char>(b.op))) : b.op;
  };
  const auto with_chunk = [&](const PipelineBox& b) {
    return letter(b) + std::to_string(b.micro_batch) + ":" + std::to_string(b.chunk);
  };
  bool show_chunk = last_chunk > 1;
  for (const auto& row : rows)
    for (const Placed& x : row) show_chunk = show_chunk && int(with_chunk(x.box).size()) <= x.to - x.from;
  // The micro-batch likewise, all or none: where narrow boxes lose their number and wide ones
  // keep it, neighbours run together ("FF1FF3" for F F1 F F3) and no box can be told apart.
  bool show_number = true;
  for (const auto& row : rows)
    for (const Placed& x : row)
      show_number = show_number && int((letter(x.box) + std::to_string(x.box.micro_batch)).size()) <= x.to - x.from;

  const std::string last_rank = "rank " + std::to_string(std::max(p.ranks - 1, 0));
  const std::vector<double> bubble = p.bubble_fraction();
  std::string out = p.title + "  (" + num(p.end_us) + " us, one cell = " + num(per_cell) + " us)\n";
  for (int r = 0; r < p.ranks; ++r) {
    std::string cells(size_t(columns), '.');
    for (const Placed& x : rows[size_t(r)]) {
      const size_t width = size_t(x.to - x.from);
      std::string label = show_chunk    ? with_chunk(x.box)
                          : show_number ? letter(x.box) + std::to_string(x.box.micro_batch)
                                        : std::string(1, letter(x.box));
      label.resize(width, ' ');
      cells.replace(size_t(x.from), width, label);
    }
    std::string name = "rank " + std::to_string(r);
    name.resize(last_rank.size(), ' ');
    out += name + " |" + cells + "| " + percent(bubble[size_t(r)]) + " bubble\n";
  }

  const std::string right = num(p.end_us) + " us";
  // "0" under the first cell, the end under the last one.
  const int gap = std::max(1, columns - 1 - int(right.size()));
  out += std::string(last_rank.size() + 2, ' ') + "0" + std::string(size_t(gap), ' ') + right + "\n";

  std::string legend;
  for (const OpKind* k : ops_present(p)) legend += std::string(1, k->letter) + " " + k->word + ", ";
  legend += show_number ? ". idle; the number is the micro-batch"
                        : ". idle; one letter per action (some boxes are too narrow for their micro-batch: more "
                          "columns show them)";
  if (last_chunk >= 1) legend += show_chunk ? ", :c the chunk (lowercase: chunk >= 1)" : "; lowercase: chunk >= 1";
  return out + legend + "\n";
}

std::string pipeline_svg(const PipelinePicture& p) {
  // Layout in pixels: lane names on the left, bubbles on the right, the axis and legend below.
  constexpr double kLeft = 70, kPlot = 960, kRight = 110, kTop = 44, kLane = 26, kGap = 6;
  const double width = kLeft + kPlot + kRight;
  const double lanes_bottom = kTop + p.ranks * (kLane + kGap);
  const double height = lanes_bottom + 64;
  const double scale = p.end_us > 0 ? kPlot / p.end_us : 0;
  const auto x = [&](double t) { return kLeft + t * scale; };
  const auto lane_y = [&](int r) { return kTop + r * (kLane + kGap); };
  const int last_chunk = max_chunk(p);
  const std::vector<double> bubble = p.bubble_fraction();

  std::string s = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  s += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + coord(width) + "\" height=\"" + coord(height) +
       "\" viewBox=\"0 0 " + coord(width) + " " + coord(height) + "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  s += "<rect x=\"0\" y=\"0\" width=\"" + coord(width) + "\" height=\"" + coord(height) + "\" fill=\"white\"/>\n";
  s += "<text x=\"" + coord(kLeft) + "\" y=\"24\" font-size=\"16\" font-weight=\"bold\">" + xml_escape(p.title) +
       "</text>\n";

  for (int r = 0; r < p.ranks; ++r) {
    const double mid = lane_y(r) + kLane / 2;
    s += "<text x=\"" + coord(kLeft - 8) + "\" y=\"" + coord(mid + 4) + "\" text-anchor=\"end\">rank " +
         std::to_string(r) + "</text>\n";
    s += "<line x1=\"" + coord(kLeft) + "\" y1=\"" + coord(lane_y(r) + kLane) + "\" x2=\"" + coord(kLeft + kPlot) +
         "\" y2=\"" + coord(lane_y(r) + kLane) + "\" stroke=\"#ccc\"/>\n";
    s += "<text x=\"" + coord(kLeft + kPlot + 8) + "\" y=\"" + coord(mid + 4) + "\">" + percent(bubble[size_t(r)]) +
         " bubble</text>\n";
  }

  for (const auto& lane : boxes_by_rank(p)) {
    for (const PipelineBox& b : lane) {
      const OpKind& k = *op_by_letter(b.op);
      // Later chunks mix towards white, up to 60%, so chunk 0 keeps the op's full colour.
      const double light = last_chunk > 0 ? 0.6 * b.chunk / last_chunk : 0;
      const auto mix = [&](int c) { return std::to_string(int(std::lround(c + (255 - c) * light))); };
      const double x0 = x(b.start_us), w = std::max(0.0, x(b.end_us) - x0), y0 = lane_y(b.rank);
      const std::string mb = std::to_string(b.micro_batch);
      s += "<rect x=\"" + coord(x0) + "\" y=\"" + coord(y0) + "\" width=\"" + coord(w) + "\" height=\"" +
           coord(kLane) + "\" fill=\"rgb(" + mix(k.r) + "," + mix(k.g) + "," + mix(k.b) +
           ")\" stroke=\"white\" stroke-width=\"0.5\"><title>" +
           xml_escape("rank " + std::to_string(b.rank) + ": " + pipeline_span_name(b.op, b.micro_batch, b.chunk) +
                      ", " + num(b.start_us) + " to " + num(b.end_us) + " us") +
           "</title></rect>\n";
      // The number shrinks to fit a narrow box; it is always written, so the document says
      // which micro-batch every box is even when it is too small to read.
      const double font = std::clamp(w / (0.65 * double(mb.size()) + 0.3), 1.0, 12.0);
      s += "<text x=\"" + coord(x0 + w / 2) + "\" y=\"" + coord(y0 + kLane / 2 + font * 0.35) +
           "\" text-anchor=\"middle\" font-size=\"" + coord(font) + "\" fill=\"" + (light < 0.3 ? "white" : "black") +
           "\">" + mb + "</text>\n";
    }
  }

  // Time axis.
  const double axis_y = lanes_bottom + 4;
  s += "<line x1=\"" + coord(kLeft) + "\" y1=\"" + coord(axis_y) + "\" x2=\"" + coord(kLeft + kPlot) + "\" y2=\"" +
       coord(axis_y) + "\" stroke=\"black\"/>\n";
  const double step = p.end_us > 0 ? tick_step(p.end_us) : 1;
  for (int i = 0; i * step <= p.end_us * (1 + 1e-12); ++i) {
    const double t = i * step, tx = x(t);
    s += "<line x1=\"" + coord(tx) + "\" y1=\"" + coord(axis_y) + "\" x2=\"" + coord(tx) + "\" y2=\"" +
         coord(axis_y + 5) + "\" stroke=\"black\"/>\n";
    s += "<text x=\"" + coord(tx) + "\" y=\"" + coord(axis_y + 18) + "\" text-anchor=\"middle\">" + num(t) +
         "</text>\n";
  }
  s += "<text x=\"" + coord(kLeft + kPlot + 8) + "\" y=\"" + coord(axis_y + 18) + "\">time (&#181;s)</text>\n";

  // Legend: coloured words (not swatches), so the document's rects are the background and boxes.
  std::string legend;
  for (const OpKind* k : ops_present(p))
    legend += "<tspan fill=\"rgb(" + std::to_string(k->r) + "," + std::to_string(k->g) + "," + std::to_string(k->b) +
              ")\" font-weight=\"bold\">" + k->word + "</tspan>   ";
  legend += "numbers are micro-batches";
  if (last_chunk > 0) legend += "; lighter shades are later model chunks";
  s += "<text x=\"" + coord(kLeft) + "\" y=\"" + coord(axis_y + 44) + "\" xml:space=\"preserve\">" + legend +
       "</text>\n";
  return s + "</svg>\n";
}

}  // namespace llama4d
