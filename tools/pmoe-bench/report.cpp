#include "report.hpp"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "bench_common.hpp"
#include "pmoe/error.hpp"

namespace pmoe::bench {

std::string format(const char* fmt, double value) {
  char text[64];
  std::snprintf(text, sizeof text, fmt, value);
  return text;
}

namespace {

std::string plain(const nlohmann::json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_null()) return "";
  return v.dump();
}

}  // namespace

Column column(std::string header, std::string key, const char* fmt) {
  return {std::move(header), [key, fmt](const nlohmann::json& row) {
            const nlohmann::json& v = row.at(key);
            return fmt && v.is_number() ? format(fmt, v.get<double>()) : plain(v);
          }};
}

void print_markdown(const std::vector<Column>& columns, const nlohmann::json& rows) {
  std::string header = "|", rule = "|";
  for (const Column& c : columns) {
    header += " " + c.header + " |";
    rule += "---|";
  }
  std::printf("%s\n%s\n", header.c_str(), rule.c_str());
  for (const auto& row : rows) {
    std::string line = "|";
    for (const Column& c : columns) line += " " + c.cell(row) + " |";
    std::printf("%s\n", line.c_str());
  }
  std::fflush(stdout);
}

void write_csv(const std::string& path, const nlohmann::json& rows) {
  std::ofstream out(path);
  PMOE_CHECK(out.good(), "cannot write ", path);
  if (rows.empty()) return;
  std::vector<std::string> keys;
  for (const auto& item : rows.front().items()) keys.push_back(item.key());
  for (size_t i = 0; i < keys.size(); ++i) out << (i ? "," : "") << keys[i];
  out << "\n";
  for (const auto& row : rows) {
    for (size_t i = 0; i < keys.size(); ++i) {
      std::string cell = row.contains(keys[i]) ? plain(row[keys[i]]) : "";
      if (cell.find_first_of(",\"") != std::string::npos) {
        std::string quoted = "\"";
        for (char ch : cell) quoted += ch == '"' ? std::string("\"\"") : std::string(1, ch);
        cell = quoted + "\"";
      }
      out << (i ? "," : "") << cell;
    }
    out << "\n";
  }
}

void write_json(const std::string& path, const nlohmann::json& config, const nlohmann::json& rows,
                const nlohmann::json& extra) {
  nlohmann::json doc = {{"machine", machine_info()}, {"commit", git_commit()}, {"config", config}};
  for (const auto& item : extra.items()) doc[item.key()] = item.value();
  doc["rows"] = rows;
  std::ofstream out(path);
  PMOE_CHECK(out.good(), "cannot write ", path);
  out << doc.dump(2) << "\n";
}

void plot_sweep(const std::string& png_path, const nlohmann::json& rows, const PlotSpec& spec) {
  auto temporary = [] {
    char path[] = "/tmp/pmoe-plot-XXXXXX";
    const int fd = mkstemp(path);
    PMOE_CHECK(fd >= 0, "plot: cannot create a temporary file");
    close(fd);
    return std::string(path);
  };
  const std::string csv_path = temporary(), spec_path = temporary();
  write_csv(csv_path, rows);
  {
    std::ofstream out(spec_path);
    out << nlohmann::json{{"x", spec.x},           {"x_label", spec.x_label},
                          {"y", spec.y},           {"y_label", spec.y_label},
                          {"title", spec.title},   {"series", spec.series},
                          {"panel", spec.panel},   {"panel_label", spec.panel_label},
                          {"log_y", spec.log_y},   {"bars", spec.bars},
                          {"y_min", spec.y_min},   {"y_max", spec.y_max},
                          {"log_x", spec.log_x}}
               .dump();
  }
  const std::string command = std::string("python3 '") + PMOE_SOURCE_DIR +
                              "/tools/pmoe-bench/plot_sweep.py' '" + csv_path + "' '" + png_path +
                              "' '" + spec_path + "'";
  const int status = std::system(command.c_str());
  std::remove(csv_path.c_str());
  std::remove(spec_path.c_str());
  PMOE_CHECK(status == 0, "plot: '", command, "' failed (is matplotlib installed? ",
             "scripts/setup.sh installs it)");
}

}  // namespace pmoe::bench
