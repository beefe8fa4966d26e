#pragma once
// Plain-text tables with aligned columns, for summaries a learner reads in a terminal.
#include <string>
#include <vector>

namespace llama4d {

// First row is the header; numeric-looking cells are right-aligned, text left-aligned.
std::string format_table(const std::vector<std::vector<std::string>>& rows);

}  // namespace llama4d
