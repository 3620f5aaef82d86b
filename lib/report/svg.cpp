#include "report/svg.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

namespace hisparse::svg {
namespace {

// Chart geometry (pixels): plot area inside the margins, legend right of it.
constexpr int kWidth = 760;
constexpr int kHeight = 400;
constexpr double kLeft = 72, kTop = 40, kLegend = 190, kBottom = 56;

std::string num(double v) {
  return fmt::format("{:.2f}", v);
}

void draw_legend(Canvas& c, double x, double y, const std::vector<std::string>& names,
                 const std::vector<std::string>& colours) {
  for (std::size_t i = 0; i < names.size(); ++i) {
    const double row = y + 18.0 * static_cast<double>(i);
    c.rect(x, row - 9, 12, 12, colours[i]);
    std::string name = names[i];
    if (name.size() > 26) name = name.substr(0, 25) + "…";
    c.text(x + 18, row + 1, name, 11);
  }
}

struct Axis {
  double lo = 0, hi = 1;
  std::vector<double> ticks;
};

Axis linear_axis(double lo, double hi) {
  if (!(hi > lo)) {
    const double pad = lo == 0 ? 1.0 : std::abs(lo) * 0.5;
    lo -= pad, hi += pad;
  }
  Axis a;
  a.ticks = nice_ticks(lo, hi);
  a.lo = a.ticks.front();
  a.hi = a.ticks.back();
  return a;
}

}  // namespace

std::string escaped(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char ch : text) {
    switch (ch) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += ch;
    }
  }
  return out;
}

std::string hex_colour(std::uint32_t argb) {
  return fmt::format("#{:06x}", argb & 0xffffffu);
}

std::string palette(std::size_t i) {
  static const char* colours[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                  "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
  return colours[i % (sizeof(colours) / sizeof(colours[0]))];
}

Canvas::Canvas(int width, int height) : width_(width), height_(height) {}

void Canvas::line(double x1, double y1, double x2, double y2, std::string_view stroke, double width,
                  std::string_view dash) {
  body_ += fmt::format(R"(<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="{}" stroke-width="{}")",
                       num(x1), num(y1), num(x2), num(y2), escaped(stroke), num(width));
  if (!dash.empty()) body_ += fmt::format(R"( stroke-dasharray="{}")", escaped(dash));
  body_ += "/>\n";
}

void Canvas::rect(double x, double y, double w, double h, std::string_view fill,
                  std::string_view tooltip) {
  body_ += fmt::format(R"(<rect x="{}" y="{}" width="{}" height="{}" fill="{}")", num(x), num(y),
                       num(std::max(0.0, w)), num(std::max(0.0, h)), escaped(fill));
  body_ += tooltip.empty() ? "/>\n" : fmt::format("><title>{}</title></rect>\n", escaped(tooltip));
}

void Canvas::circle(double cx, double cy, double r, std::string_view fill,
                    std::string_view tooltip) {
  body_ += fmt::format(R"(<circle cx="{}" cy="{}" r="{}" fill="{}")", num(cx), num(cy), num(r),
                       escaped(fill));
  body_ +=
      tooltip.empty() ? "/>\n" : fmt::format("><title>{}</title></circle>\n", escaped(tooltip));
}

void Canvas::polyline(const std::vector<std::pair<double, double>>& points, std::string_view stroke,
                      double width) {
  std::string coords;
  for (const auto& [x, y] : points)
    coords += fmt::format("{}{},{}", coords.empty() ? "" : " ", num(x), num(y));
  body_ += fmt::format(R"(<polyline points="{}" fill="none" stroke="{}" stroke-width="{}"/>)",
                       coords, escaped(stroke), num(width)) +
           "\n";
}

void Canvas::text(double x, double y, std::string_view content, double size,
                  std::string_view anchor, double rotate, std::string_view fill) {
  body_ += fmt::format(R"(<text x="{}" y="{}" font-size="{}" text-anchor="{}" fill="{}")", num(x),
                       num(y), num(size), escaped(anchor), escaped(fill));
  if (rotate != 0)
    body_ += fmt::format(R"x( transform="rotate({} {} {})")x", num(rotate), num(x), num(y));
  body_ += fmt::format(">{}</text>\n", escaped(content));
}

std::string Canvas::str() const {
  return fmt::format(
      R"(<svg xmlns="http://www.w3.org/2000/svg" width="{0}" height="{1}" viewBox="0 0 {0} {1}" )"
      R"(font-family="sans-serif" role="img">)"
      "\n<rect width=\"{0}\" height=\"{1}\" fill=\"#ffffff\"/>\n{2}</svg>",
      width_, height_, body_);
}

std::vector<double> nice_ticks(double lo, double hi, int count) {
  if (!std::isfinite(lo) || !std::isfinite(hi)) return {0, 1};
  if (hi < lo) std::swap(lo, hi);
  if (hi == lo) hi = lo + 1;
  const double raw = (hi - lo) / std::max(1, count);
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  const double norm = raw / magnitude;
  const double step = (norm < 1.5 ? 1 : norm < 3 ? 2 : norm < 7 ? 5 : 10) * magnitude;
  // Multiples of the step, each computed from its integer index (no accumulated rounding).
  const auto first = static_cast<long long>(std::floor(lo / step + 1e-9));
  auto last = static_cast<long long>(std::ceil(hi / step - 1e-9));
  if (last <= first) last = first + 1;
  std::vector<double> ticks;
  for (long long k = first; k <= last && ticks.size() < 100; ++k)
    ticks.push_back(static_cast<double>(k) * step);
  return ticks;
}

std::string tick_label(double v) {
  if (std::abs(v - std::round(v)) < 1e-9 * std::max(1.0, std::abs(v)) && std::abs(v) < 1e15)
    return fmt::format("{}", static_cast<long long>(std::llround(v)));
  return fmt::format("{:.3g}", v);
}

std::string render(const XYChart& chart) {
  Canvas c(kWidth, kHeight);
  const double right = kWidth - kLegend, bottom = kHeight - kBottom;
  c.text(kWidth / 2.0, 22, chart.title, 15, "middle");
  double x_lo = std::numeric_limits<double>::infinity(), x_hi = -x_lo;
  double y_lo = x_lo, y_hi = -x_lo;
  for (const auto& s : chart.series)
    for (const auto& [x, y] : s.points) {
      if (!std::isfinite(x) || !std::isfinite(y) || (chart.log2_x && x <= 0)) continue;
      const double xv = chart.log2_x ? std::log2(x) : x;
      x_lo = std::min(x_lo, xv), x_hi = std::max(x_hi, xv);
      y_lo = std::min(y_lo, y), y_hi = std::max(y_hi, y);
    }
  if (!std::isfinite(x_lo)) {
    c.text(kWidth / 2.0, kHeight / 2.0, "no data", 14, "middle", 0, "#777");
    return c.str();
  }
  if (chart.reference_y)
    y_lo = std::min(y_lo, *chart.reference_y), y_hi = std::max(y_hi, *chart.reference_y);
  if (chart.y_from_zero) y_lo = std::min(y_lo, 0.0);
  const Axis ya = linear_axis(y_lo, y_hi);
  Axis xa;
  if (chart.log2_x) {
    xa.lo = std::floor(x_lo), xa.hi = std::ceil(x_hi);
    if (xa.hi == xa.lo) xa.lo -= 1, xa.hi += 1;
    for (double t = xa.lo; t <= xa.hi; t += 1) xa.ticks.push_back(t);
  } else {
    xa = linear_axis(x_lo, x_hi);
  }
  auto px = [&](double x) {
    const double v = chart.log2_x ? std::log2(x) : x;
    return kLeft + (v - xa.lo) / (xa.hi - xa.lo) * (right - kLeft);
  };
  auto py = [&](double y) { return bottom - (y - ya.lo) / (ya.hi - ya.lo) * (bottom - kTop); };
  for (double t : ya.ticks) {
    c.line(kLeft, py(t), right, py(t), "#e5e5e5");
    c.text(kLeft - 6, py(t) + 4, tick_label(t), 11, "end");
  }
  for (double t : xa.ticks) {
    const double x = kLeft + (t - xa.lo) / (xa.hi - xa.lo) * (right - kLeft);
    c.line(x, bottom, x, bottom + 5, "#444");
    c.text(x, bottom + 18, tick_label(chart.log2_x ? std::exp2(t) : t), 11, "middle");
  }
  c.line(kLeft, bottom, right, bottom, "#444");
  c.line(kLeft, kTop, kLeft, bottom, "#444");
  c.text((kLeft + right) / 2, kHeight - 14, chart.x_label, 12, "middle");
  c.text(18, (kTop + bottom) / 2, chart.y_label, 12, "middle", -90);
  if (chart.reference_y) {
    c.line(kLeft, py(*chart.reference_y), right, py(*chart.reference_y), "#555", 1, "5,4");
    if (!chart.reference_label.empty())
      c.text(right - 4, py(*chart.reference_y) - 5, chart.reference_label, 10, "end", 0, "#555");
  }
  std::vector<std::string> names, colours;
  for (std::size_t i = 0; i < chart.series.size(); ++i) {
    const auto& s = chart.series[i];
    const std::string colour = s.colour.empty() ? palette(i) : s.colour;
    auto pts = s.points;
    std::erase_if(pts, [&](const auto& p) {
      return !std::isfinite(p.first) || !std::isfinite(p.second) || (chart.log2_x && p.first <= 0);
    });
    std::stable_sort(pts.begin(), pts.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    std::vector<std::pair<double, double>> pixels;
    for (const auto& [x, y] : pts) pixels.emplace_back(px(x), py(y));
    if (chart.lines && pixels.size() > 1) c.polyline(pixels, colour);
    for (std::size_t k = 0; k < pts.size(); ++k)
      c.circle(pixels[k].first, pixels[k].second, 3.5, colour,
               fmt::format("{}: {} = {}, {} = {}", s.name, chart.x_label, tick_label(pts[k].first),
                           chart.y_label, fmt::format("{:.4g}", pts[k].second)));
    names.push_back(s.name);
    colours.push_back(colour);
  }
  for (const auto& m : chart.marks) {
    if (!std::isfinite(m.x) || !std::isfinite(m.y) || (chart.log2_x && m.x <= 0)) continue;
    c.text(px(m.x), py(m.y) - 8, m.symbol, 13, "middle", 0, m.colour);
    if (!m.tooltip.empty()) c.circle(px(m.x), py(m.y) - 12, 7, "transparent", m.tooltip);
  }
  draw_legend(c, right + 16, kTop + 8, names, colours);
  return c.str();
}

std::string render(const StackedBarChart& chart) {
  const int height = kHeight + 60;  // room for slanted bar labels
  Canvas c(kWidth, height);
  const double right = kWidth - kLegend, bottom = height - kBottom - 60;
  c.text(kWidth / 2.0, 22, chart.title, 15, "middle");
  if (chart.bars.empty()) {
    c.text(kWidth / 2.0, height / 2.0, "no data", 14, "middle", 0, "#777");
    return c.str();
  }
  double top_total = 0;
  for (const auto& row : chart.values) {
    double total = 0;
    for (double v : row) total += std::max(0.0, v);
    top_total = std::max(top_total, total);
  }
  const Axis ya = linear_axis(0, top_total > 0 ? top_total : 1);
  auto py = [&](double y) { return bottom - (y - ya.lo) / (ya.hi - ya.lo) * (bottom - kTop); };
  for (double t : ya.ticks) {
    c.line(kLeft, py(t), right, py(t), "#e5e5e5");
    c.text(kLeft - 6, py(t) + 4, tick_label(t), 11, "end");
  }
  c.line(kLeft, bottom, right, bottom, "#444");
  c.line(kLeft, kTop, kLeft, bottom, "#444");
  c.text(18, (kTop + bottom) / 2, chart.y_label, 12, "middle", -90);
  const double slot = (right - kLeft) / static_cast<double>(chart.bars.size());
  const double width = std::min(60.0, slot * 0.7);
  for (std::size_t b = 0; b < chart.bars.size(); ++b) {
    const double x = kLeft + slot * (static_cast<double>(b) + 0.5);
    double base = 0;
    for (std::size_t s = 0; s < chart.stacks.size(); ++s) {
      const double v = b < chart.values.size() && s < chart.values[b].size()
                           ? std::max(0.0, chart.values[b][s])
                           : 0.0;
      if (v <= 0) continue;
      c.rect(x - width / 2, py(base + v), width, py(base) - py(base + v), chart.colours[s],
             fmt::format("{}: {} {:.4g} {}", chart.bars[b], chart.stacks[s], v, chart.y_label));
      base += v;
    }
    std::string label = chart.bars[b];
    if (label.size() > 34) label = label.substr(0, 33) + "…";
    c.text(x, bottom + 14, label, 10, "end", -35);
  }
  draw_legend(c, right + 16, kTop + 8, chart.stacks, chart.colours);
  return c.str();
}

}  // namespace hisparse::svg
