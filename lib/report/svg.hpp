// A small SVG writer and the three chart kinds report.html draws with it: XY (lines or points,
// optional log2 x axis and reference line), and stacked bars. Output is plain inline SVG markup
// (no scripts, no external resources), sized in pixels.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace hisparse::svg {

/// Text escaped for XML content and attribute values.
[[nodiscard]] std::string escaped(std::string_view text);
/// "#rrggbb" of a 0xAARRGGBB colour (alpha ignored).
[[nodiscard]] std::string hex_colour(std::uint32_t argb);
/// A fixed palette for series: colour i (cycles).
[[nodiscard]] std::string palette(std::size_t i);

/// Builds one <svg> element.
class Canvas {
 public:
  Canvas(int width, int height);
  void line(double x1, double y1, double x2, double y2, std::string_view stroke, double width = 1,
            std::string_view dash = {});
  void rect(double x, double y, double w, double h, std::string_view fill,
            std::string_view tooltip = {});
  void circle(double cx, double cy, double r, std::string_view fill, std::string_view tooltip = {});
  void polyline(const std::vector<std::pair<double, double>>& points, std::string_view stroke,
                double width = 2);
  /// anchor: "start" | "middle" | "end"; rotate in degrees about (x, y).
  void text(double x, double y, std::string_view content, double size = 12,
            std::string_view anchor = "start", double rotate = 0, std::string_view fill = "#222");
  [[nodiscard]] std::string str() const;

 private:
  int width_;
  int height_;
  std::string body_;
};

/// Round tick values covering [lo, hi] (steps of 1, 2 or 5 times a power of ten), about `count`.
[[nodiscard]] std::vector<double> nice_ticks(double lo, double hi, int count = 5);
/// A tick label: integers without decimals, others with up to 3 significant digits.
[[nodiscard]] std::string tick_label(double v);

struct Series {
  std::string name;
  std::vector<std::pair<double, double>> points;  ///< (x, y); drawn in x order
  std::string colour;                             ///< "" = palette by position
};

/// A symbol drawn just above one data point (e.g. a regression gate's verdict), with a tooltip.
struct Mark {
  double x = 0, y = 0;  ///< in data coordinates
  std::string symbol;   ///< a short text, e.g. "▼"
  std::string colour;
  std::string tooltip;
};

struct XYChart {
  std::string title;
  std::string x_label;
  std::string y_label;
  std::vector<Series> series;
  bool log2_x = false;  ///< x ticks at powers of two (values must be > 0)
  bool lines = true;    ///< connect each series' points
  bool y_from_zero = true;
  std::optional<double> reference_y;  ///< dashed horizontal line (e.g. speedup 1.0)
  std::string reference_label;
  std::vector<Mark> marks;
};

struct StackedBarChart {
  std::string title;
  std::string y_label;
  std::vector<std::string> bars;            ///< one label per bar
  std::vector<std::string> stacks;          ///< one name per stack segment
  std::vector<std::string> colours;         ///< per stack
  std::vector<std::vector<double>> values;  ///< [bar][stack], >= 0
};

[[nodiscard]] std::string render(const XYChart& chart);
[[nodiscard]] std::string render(const StackedBarChart& chart);

}  // namespace hisparse::svg
