#pragma once
// Numbers as the lessons' tables and notes print them.
#include <string>

namespace llama4d::lesson {

// v with `digits` digits after the point: fixed(2.345, 1) -> "2.3" (printf's %.*f).
std::string fixed(double v, int digits);
// v with `digits` significant digits, in exponent form when that is shorter: sci(1.5e-7) ->
// "1.5e-07" (printf's %.*g).
std::string sci(double v, int digits = 3);

}  // namespace llama4d::lesson
