// How pmoe-bench reports: rows are JSON objects (typed values, one per measured configuration);
// the same rows become a markdown table on stdout, a CSV file, a JSON document carrying the
// machine, the commit and the config, and a PNG plot of a sweep.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace pmoe::bench {

struct Column {
  std::string header;                                    // markdown header
  std::function<std::string(const nlohmann::json&)> cell;  // formats one row's cell
};

// A column showing row[key] with printf `format` ("%.2f"), or as text for strings and integers.
Column column(std::string header, std::string key, const char* format = nullptr);

void print_markdown(const std::vector<Column>& columns, const nlohmann::json& rows);

// Every key of the first row, in order, as CSV columns; values unformatted.
void write_csv(const std::string& path, const nlohmann::json& rows);

// {machine, commit, config, rows} plus the members of `extra`, pretty-printed.
void write_json(const std::string& path, const nlohmann::json& config, const nlohmann::json& rows,
                const nlohmann::json& extra = nlohmann::json::object());

// What --plot draws: y over x, one line per value of `series`, one panel per value of `panel`;
// or, with `bars`, one bar per row (x names it), whiskers from y_min to y_max.
struct PlotSpec {
  std::string x, x_label;  // a column, and the axis label in words with its unit
  std::string y, y_label;
  std::string title;
  std::string series;                   // "" for one line
  std::string panel, panel_label;       // "" for one panel; "tokens per rank" -> "... 128"
  bool log_y = false;                   // for series that differ by orders of magnitude
  bool bars = false;
  std::string y_min, y_max;             // bars only; "" for none
  bool log_x = false;                   // x values that double (EP sizes)
};

// A PNG of `rows` drawn by tools/pmoe-bench/plot_sweep.py with matplotlib. Throws pmoe::Error if
// it fails.
void plot_sweep(const std::string& png_path, const nlohmann::json& rows, const PlotSpec& spec);

std::string format(const char* fmt, double value);

}  // namespace pmoe::bench
