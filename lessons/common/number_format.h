#pragma once
// Numbers as the lessons print them in prose and tables: a fixed number of decimals ("12.35"), or a
// number of significant digits ("0.00389", "3.39e+38").
#include <string>

namespace llama4d::lesson {

std::string fixed(double v, int decimals);          // printf's %.*f: fixed(2.0 / 3, 2) = "0.67"
std::string significant(double v, int digits = 3);  // printf's %.*g: significant(1.0 / 3) = "0.333"

}  // namespace llama4d::lesson
