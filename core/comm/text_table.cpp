#include "core/comm/text_table.h"

#include <algorithm>
#include <cctype>

namespace llama4d {

namespace {

bool numeric(const std::string& s) {
  if (s.empty()) return false;
  const char c = s[0];
  return std::isdigit(static_cast<unsigned char>(c)) || ((c == '-' || c == '.') && s.size() > 1);
}

}  // namespace

std::string format_table(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width;
  for (const auto& row : rows) {
    if (width.size() < row.size()) width.resize(row.size(), 0);
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  }
  std::string out;
  for (size_t r = 0; r < rows.size(); ++r) {
    std::string line;
    for (size_t c = 0; c < rows[r].size(); ++c) {
      const std::string& cell = rows[r][c];
      const std::string pad(width[c] - cell.size(), ' ');
      if (c) line += "  ";
      line += (r > 0 && numeric(cell)) ? pad + cell : cell + pad;
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + '\n';
    if (r == 0) {
      size_t total = 0;
      for (size_t w : width) total += w;
      out += std::string(total + 2 * (width.empty() ? 0 : width.size() - 1), '-') + '\n';
    }
  }
  return out;
}

}  // namespace llama4d
