// `pmoe-bench moe --benchmark_type batch_size|topk|feature_dim`: Simple, TP and EP MoE layers
// over one sweep: the table of the Simple/TP/EP MoE comparison report this project started from,
// measured under pmoe's protocol. Defaults are that report's: 4 ranks, 4 experts, feature 32,
// hidden 128, output 64, relu, batch 8, top-k 2; sweeps batch 8/16/32/64, top-k 1/2/4 or feature
// 32/64/128/256. The swept axis's own flag (--batch, --topk, --feature) runs that one value;
// --values lists several. --preset runs a real model's layer shape.
//
// Every setting is first checked against the plain reference (every token when that is cheap,
// otherwise the first and last token of every rank's share); a mismatch exits non-zero.
#include <mpi.h>

#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "expert_stage_model.hpp"
#include "moe_bench.hpp"
#include "moe_presets.hpp"
#include "pmoe/error.hpp"
#include "pmoe/moe.hpp"
#include "report.hpp"
#include "subcommands.hpp"

namespace pmoe::bench {
namespace {

struct Options {
  std::string benchmark_type = "batch_size";
  std::string values;  // the sweep's values; empty: see sweep_values
  std::string preset;
  int ranks = 4;
  int experts = 4, feature = 32, hidden = 128, output = 64, batch = 8, topk = 2;
  std::string act = "relu";
  std::string dtype = "f32";
  std::string variants = "simple,tp,ep";
  int micro_batches = 1;
  int blas_threads = 0;
  int iters = 20, warmup = 3;
  uint64_t seed = 1;
  bool gemm_rate = false;
  std::string json_path, csv_path, plot_path;
  std::string device = "cpu";  // or "cuda"
};

std::vector<MoeVariantKind> parse_variants(const std::string& text) {
  std::vector<MoeVariantKind> out;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t end = std::min(text.find(',', start), text.size());
    const std::string item = text.substr(start, end - start);
    if (item == "simple")
      out.push_back(MoeVariantKind::simple);
    else if (item == "tp")
      out.push_back(MoeVariantKind::tp);
    else if (item == "ep")
      out.push_back(MoeVariantKind::ep);
    else
      throw Error(detail::cat("--variants: '", item, "' is not simple, tp or ep"));
    start = end + 1;
  }
  return out;
}

// The flag that sets the swept axis alone (--batch for batch_size, ...) and its value in `o`.
const char* axis_flag(const Options& o) {
  if (o.benchmark_type == "batch_size") return "--batch";
  if (o.benchmark_type == "topk") return "--topk";
  return "--feature";
}

int axis_value(const Options& o) {
  if (o.benchmark_type == "batch_size") return o.batch;
  if (o.benchmark_type == "topk") return o.topk;
  return o.feature;
}

// The values swept: --values; else the one value of the axis's own flag or of the preset (a
// one-point sweep: `moe --batch 8` runs batch 8, not the whole sweep); else the report's sweep
// for the type. Both --values and the axis's flag: an error, as neither could win silently.
std::vector<int> sweep_values(const Options& o, const CLI::App& cmd) {
  const char* flag = axis_flag(o);
  const bool axis_given = cmd.get_option(flag)->count() > 0;
  PMOE_CHECK(o.values.empty() || !axis_given, flag, " ", axis_value(o),
             " and --values ", o.values, " both set the ", o.benchmark_type,
             " sweep; give one: ", flag, " N runs N alone, --values A,B,... sweeps");
  if (!o.values.empty()) return parse_int_list(o.values, "--values");
  if (axis_given || !o.preset.empty()) return {axis_value(o)};
  if (o.benchmark_type == "batch_size") return {8, 16, 32, 64};
  if (o.benchmark_type == "topk") return {1, 2, 4};
  return {32, 64, 128, 256};
}

// The rows checked against the reference: all of them when the reference is cheap, otherwise
// the first and last token of every rank's EP share (each rank's output is then checked).
std::vector<int> rows_to_check(const MoeConfig& c, int batch, int ranks) {
  const double macs =
      double(batch) * c.top_k *
      (double(c.w1_halves()) * c.hidden_dim * c.ffn_dim + double(c.ffn_dim) * c.out_dim());
  if (macs <= 3e8) return reference::all_rows(batch);
  std::vector<int> rows;
  for (int r = 0; r < ranks; ++r) {
    const RowRange share = shard_rows(batch, ranks, r);
    if (share.size() > 0) rows.push_back(share.begin);
    if (share.size() > 1) rows.push_back(share.end - 1);
  }
  return rows;
}

std::string joined(const std::vector<int64_t>& values) {
  std::string out;
  for (int64_t v : values) out += (out.empty() ? "" : ",") + std::to_string(v);
  return out;
}

nlohmann::json row_json(const std::string& variant, const MoeConfig& c, int batch,
                        const std::string& key, int value, const MoeRunResult& r) {
  return {{"variant", variant},
          {key, value},
          {"batch_size", batch},
          {"topk", c.top_k},
          {"feature_dim", c.hidden_dim},
          {"min_ms", r.ms.min},
          {"median_ms", r.ms.median},
          {"max_ms", r.ms.max},
          {"mean_ms", r.ms.mean},
          {"std_ms", r.ms.std},
          {"max_mem_mb", r.max_mem_mb},
          {"weights_mb_per_rank", r.weights_mb},
          {"workspace_mb_per_rank", r.workspace_mb},
          {"peak_rss_mb", r.rss_mb},
          {"gflop_per_rank", r.gflop_max},
          {"mb_moved_per_rank", r.mb_moved_max},
          {"route_ms", r.route_ms},
          {"dispatch_ms", r.dispatch_ms},
          {"experts_ms", r.experts_ms},
          {"combine_ms", r.combine_ms},
          {"reduce_ms", r.reduce_ms},
          {"gemm_tflops", r.gemm_tflops},
          {"gemm_rows_issued_per_used", r.issued_per_used},
          {"ranks", r.ranks},
          {"blas_threads", r.blas_threads},
          {"check_max_rel_error", r.check_error},
          {"checked_rows", r.checked_rows},
          {"expert_gemm", r.expert_gemm.empty() ? std::string("-") : r.expert_gemm}};
}

nlohmann::json gemm_rate_json(const std::string& key, int value, const GemmRate& g) {
  return {{key, value},
          {"rank", g.rank},
          {"rows", g.rows},
          {"local_experts", g.experts},
          {"gflop", g.gflop},
          {"grouped_ms", g.grouped_ms},
          {"grouped_gflops", g.grouped_ms > 0 ? g.gflop / g.grouped_ms * 1e3 : 0.0},
          {"dense_ms", g.dense_ms},
          {"dense_gflops", g.dense_ms > 0 ? g.gflop / g.dense_ms * 1e3 : 0.0},
          {"ratio", g.grouped_ms > 0 ? g.dense_ms / g.grouped_ms : 0.0}};
}

// The expert stage's model (expert_stage_model.hpp) for the same preset, batch and groups, on
// each GPU it knows: printed beside the measurements, so that every run on a GPU checks it. The
// model prices one rank holding every expert: --ranks 1, a bf16 swiglu layer.
void print_expert_stage_model(const Options& o, int batch, const std::vector<int64_t>& groups) {
  if (o.ranks != 1) return;
  ExpertStageShape s;
  s.feature = o.feature;
  s.ffn = o.hidden;
  s.output = o.output == 0 ? o.feature : o.output;
  s.tokens = batch;
  s.top_k = o.topk;
  s.group_rows = groups;
  if (o.act != "swiglu" || o.dtype != "bf16" || s.rows() != int64_t(batch) * o.topk) return;
  for (const std::string& gpu : gpu_names()) {
    const ExpertStagePrediction p = predict_expert_stage(find_gpu(gpu), s);
    std::printf("model (%s, pmoe-bench model expert-stage): pmoe %.3f ms, torch._grouped_mm %.3f "
                "ms, pmoe's rate %.2f of torch's\n",
                gpu.c_str(), p.pmoe.us * 1e-3, p.torch.us * 1e-3, p.ratio());
  }
}

// Beside pmoe's expert stage on a device (and the kernels its GEMMs took), torch._grouped_mm's
// on the same GPU, shapes and rows, each expert's group as pmoe's router made it
// (tools/torch_grouped_mm.py --group-sizes; one line a batch: its time and TFLOP/s, or why it
// did not run), for the presets' batch sweeps. Only where the script is found; its failure is
// printed, not raised: it is a baseline, not pmoe's check.
void print_torch_grouped_mm(const Options& o, const std::vector<nlohmann::json>& rows,
                            const std::map<int, std::vector<int64_t>>& group_sizes) {
  if (o.preset.empty() || o.benchmark_type != "batch_size") return;
  std::string script = std::string(PMOE_SOURCE_DIR) + "/tools/torch_grouped_mm.py";
  if (std::FILE* f = std::fopen(script.c_str(), "r")) {
    std::fclose(f);
  } else {
    script = "tools/torch_grouped_mm.py";  // a copy of the tree elsewhere (a GPU machine's)
  }
  std::printf("\nThe same expert stage, pmoe against torch._grouped_mm on this device\n\n");
  int last_batch = -1;
  for (const nlohmann::json& r : rows) {
    const int batch = r.value("batch_size", 0);
    std::printf("pmoe (%s), %s expert stage, batch %d: %.3f ms, %.1f TFLOP/s, expert GEMMs: %s\n",
                r.value("variant", std::string("?")).c_str(), o.preset.c_str(), batch,
                r.value("experts_ms", 0.0), r.value("gemm_tflops", 0.0),
                r.value("expert_gemm", std::string("?")).c_str());
    if (batch == last_batch) continue;  // torch's once a batch, after the first layer's line
    last_batch = batch;
    std::string command = "python3 '" + script + "' --preset '" + o.preset + "' --batch " +
                          std::to_string(batch);
    if (const auto sizes = group_sizes.find(batch); sizes != group_sizes.end())
      command += " --experts " + std::to_string(sizes->second.size()) + " --group-sizes " +
                 joined(sizes->second);
    command += " 2>&1";
    std::string out;
    if (std::FILE* pipe = popen(command.c_str(), "r")) {
      char buffer[512];
      while (std::fgets(buffer, sizeof buffer, pipe)) out += buffer;
      const int status = pclose(pipe);
      if (status != 0) out += "torch._grouped_mm: '" + command + "' failed\n";
    } else {
      out = "torch._grouped_mm: not run: cannot start '" + command + "'\n";
    }
    std::printf("%s", out.c_str());
    if (const auto sizes = group_sizes.find(batch); sizes != group_sizes.end())
      print_expert_stage_model(o, batch, sizes->second);
  }
}

void run(Options o, const CLI::App& cmd) {
  PMOE_CHECK(o.benchmark_type == "batch_size" || o.benchmark_type == "topk" ||
                 o.benchmark_type == "feature_dim",
             "--benchmark_type must be batch_size, topk or feature_dim, got '", o.benchmark_type,
             "'");
  PMOE_CHECK(o.iters >= 1 && o.warmup >= 0, "--iters must be >= 1 and --warmup >= 0");
  PMOE_CHECK(o.device == "cpu" || o.device == "cuda", "--device must be cpu or cuda, got '",
             o.device, "'");
  PMOE_CHECK(o.device == "cpu" || cuda_device_count() > 0,
             "--device cuda: this build or machine has no CUDA device (GPU or emulated)");
  std::string preset_note;
  if (!o.preset.empty()) {
    const MoePreset& p = find_moe_preset(o.preset);
    auto unless_given = [&](const char* flag, auto& field, auto value) {
      if (cmd.get_option(flag)->count() == 0) field = value;
    };
    unless_given("--feature", o.feature, p.feature);
    unless_given("--hidden", o.hidden, p.ffn);
    unless_given("--output", o.output, 0);
    unless_given("--experts", o.experts, p.experts);
    unless_given("--topk", o.topk, p.top_k);
    unless_given("--batch", o.batch, p.batch);
    unless_given("--act", o.act, std::string("swiglu"));
    if (cmd.get_option("--gemm-rate")->count() == 0) o.gemm_rate = true;
    preset_note = p.note;
  }
  o.ranks = rank_counts_to_run(cmd.get_option("--ranks")->count() > 0, {o.ranks})[0];
  const std::vector<MoeVariantKind> variants = parse_variants(o.variants);
  const std::vector<int> values = sweep_values(o, cmd);

  const std::string runtime_label =
      o.device == "cpu"  ? "cpu"
      : cuda_emulated() ? "emulated CUDA (times: emulation, not GPU speed)"
                        : "CUDA GPU";
  nlohmann::json rows = nlohmann::json::array(), rates = nlohmann::json::array();
  std::vector<std::pair<int, MoeRunResult>> ep_results;
  std::map<int, std::vector<int64_t>> group_sizes;  // batch -> each expert's rows (torch's groups)
  for (int value : values) {
    MoeConfig c;
    c.hidden_dim = o.benchmark_type == "feature_dim" ? value : o.feature;
    c.ffn_dim = o.hidden;
    c.output_dim = o.output;
    c.num_experts = o.experts;
    c.top_k = o.benchmark_type == "topk" ? value : o.topk;
    c.act = parse_activation(o.act);
    c.dtype = parse_dtype(o.dtype);
    c.seed = o.seed;
    c.device_stats = o.device == "cuda";  // phase times, traffic and rows in use, from the device
    c.validate();
    const int batch = o.benchmark_type == "batch_size" ? value : o.batch;
    const Buffer x = reference::make_moe_input(c, batch, o.seed + 1);
    const auto expected = reference::reference_moe(c, x, rows_to_check(c, batch, o.ranks));
    if (o.device == "cuda" && !o.preset.empty() && o.benchmark_type == "batch_size" &&
        is_printing_rank())
      group_sizes[batch] = routed_group_sizes(c, x);
    for (MoeVariantKind v : variants) {
      MoeRunSpec spec;
      spec.variant = v;
      spec.config = c;
      spec.batch = batch;
      spec.ranks = o.ranks;
      spec.micro_batches = o.micro_batches;
      spec.iters = o.iters;
      spec.warmup = o.warmup;
      spec.gemm_rate = o.gemm_rate;
      spec.blas_threads = o.blas_threads;
      spec.device = o.device == "cuda" ? Device::cuda(0) : Device::cpu();
      const MoeRunResult r = run_moe_variant(spec, x, expected);
      rows.push_back(row_json(variant_key(v), c, batch, o.benchmark_type, value, r));
      if (const auto sizes = group_sizes.find(batch); sizes != group_sizes.end())
        rows.back()["group_sizes"] = sizes->second;  // each expert's rows, as torch gets them
      for (const GemmRate& g : r.gemm_rates)
        rates.push_back(gemm_rate_json(o.benchmark_type, value, g));
      if (is_printing_rank())
        std::fprintf(stderr, "  %s %s=%d: median %.3f ms\n", variant_key(v),
                     o.benchmark_type.c_str(), value, r.ms.median);
    }
  }
  if (!is_printing_rank()) return;

  const nlohmann::json config = {{"benchmark_type", o.benchmark_type},
                                 {"values", values},
                                 {"preset", o.preset},
                                 {"preset_note", preset_note},
                                 {"ranks", o.ranks},
                                 {"experts", o.experts},
                                 {"feature_dim", o.feature},
                                 {"hidden_dim", o.hidden},
                                 {"output_dim", o.output == 0 ? o.feature : o.output},
                                 {"batch_size", o.batch},
                                 {"topk", o.topk},
                                 {"act", o.act},
                                 {"dtype", o.dtype},
                                 {"micro_batches", o.micro_batches},
                                 {"iters", o.iters},
                                 {"warmup", o.warmup},
                                 {"seed", o.seed},
                                 {"launcher", launched_by_mpi() ? "mpirun" : "threads"},
                                 {"device", o.device},
                                 {"runtime", runtime_label}};
  std::printf(
      "\nMoE layers, %s sweep: %s; ranks=%d experts=%d feature=%s hidden=%d output=%s "
      "batch=%s top-k=%s %s %s, micro_batches=%d; %d iterations after %d warm-ups, "
      "time = slowest rank per iteration\n",
      o.benchmark_type.c_str(),
      o.preset.empty() ? "the MoE layer comparison report's shape" : o.preset.c_str(), o.ranks,
      o.experts, o.benchmark_type == "feature_dim" ? "swept" : std::to_string(o.feature).c_str(),
      o.hidden, o.output == 0 ? "feature" : std::to_string(o.output).c_str(),
      o.benchmark_type == "batch_size" ? "swept" : std::to_string(o.batch).c_str(),
      o.benchmark_type == "topk" ? "swept" : std::to_string(o.topk).c_str(), o.act.c_str(),
      o.dtype.c_str(), o.micro_batches, o.iters, o.warmup);
  if (!preset_note.empty()) std::printf("%s\n", preset_note.c_str());
  if (o.device == "cuda")
    std::printf(
        "Device: %s. Thread ranks share GPU 0, one stream each; a forward is timed to the "
        "end of its stream, its phases by the layer's events around them; Max Memory is "
        "the peak device memory in use while the layers and their x and y existed, per "
        "rank holding a layer (%s).\n",
        runtime_label.c_str(),
        cuda_emulated() ? "the emulated allocator's peak"
                        : "cudaMemGetInfo sampled after building and after timing");
  std::printf("\n");
  const std::string key = o.benchmark_type;
  std::vector<Column> times = {column("variant", "variant"), column(key, key),
                               column("Min Duration (ms)", "min_ms", "%.3f"),
                               column("Median Duration (ms)", "median_ms", "%.3f"),
                               column("Max Duration (ms)", "max_ms", "%.3f"),
                               column("Max Memory (MB)", "max_mem_mb", "%.2f")};
  if (o.device == "cuda") times.push_back(column("expert GEMMs", "expert_gemm"));
  print_markdown(times, rows);
  std::printf(
      "\nPer rank (max over ranks): work, traffic, memory, and the median time of each "
      "phase of a forward; over all ranks: the expert GEMMs' rate (FLOPs of the rows in use per "
      "second of the slowest expert stage) and rows issued / rows in use\n\n");
  print_markdown({column("variant", "variant"),
                  column(key, key),
                  {"mean ± std (ms)",
                   [](const nlohmann::json& r) {
                     return format("%.3f", r["mean_ms"]) + " ± " + format("%.3f", r["std_ms"]);
                   }},
                  column("GFLOP", "gflop_per_rank", "%.4f"),
                  column("MB moved", "mb_moved_per_rank", "%.4f"),
                  column("weights MB", "weights_mb_per_rank", "%.2f"),
                  column("workspace MB", "workspace_mb_per_rank", "%.2f"),
                  column("peak RSS MB", "peak_rss_mb", "%.0f"),
                  column("route", "route_ms", "%.3f"),
                  column("dispatch", "dispatch_ms", "%.3f"),
                  column("experts", "experts_ms", "%.3f"),
                  column("combine/sum", "combine_ms", "%.3f"),
                  column("all-reduce", "reduce_ms", "%.3f"),
                  column("GEMM TFLOP/s", "gemm_tflops", "%.4f"),
                  column("issued/used", "gemm_rows_issued_per_used", "%.2f"),
                  column("max rel. error", "check_max_rel_error", "%.1e")},
                 rows);
  if (!rates.empty()) {
    std::printf(
        "\nEP expert GEMMs vs a dense BLAS GEMM of the same FLOPs, per rank, all ranks "
        "at once (medians)\n\n");
    print_markdown(
        {column(key, key), column("rank", "rank"), column("rows", "rows"),
         column("local experts", "local_experts"), column("GFLOP", "gflop", "%.3f"),
         column("expert stage (ms)", "grouped_ms", "%.2f"),
         column("GFLOP/s", "grouped_gflops", "%.2f"), column("dense GEMM (ms)", "dense_ms", "%.2f"),
         column("GFLOP/s", "dense_gflops", "%.2f"), column("ratio", "ratio", "%.3f")},
        rates);
  }
  if (o.device == "cuda") print_torch_grouped_mm(o, rows, group_sizes);
  if (!o.json_path.empty()) write_json(o.json_path, config, rows, {{"gemm_rate", rates}});
  if (!o.csv_path.empty()) write_csv(o.csv_path, rows);
  if (!o.plot_path.empty()) {
    PlotSpec spec;
    spec.x = key;
    spec.x_label = key == "batch_size"    ? "batch size (tokens per forward)"
                   : key == "topk"        ? "experts per token (top-k)"
                                          : "feature dimension (elements per token)";
    spec.y = "median_ms";
    spec.y_label = "median forward time (ms, slowest rank)";
    spec.series = "variant";
    spec.title = detail::cat("MoE layers on ", o.ranks, " ranks (",
                             o.preset.empty() ? std::string("default shape") : o.preset, ")");
    plot_sweep(o.plot_path, rows, spec);
  }
}

}  // namespace

void add_moe_command(CLI::App& app) {
  auto o = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "moe", "Simple vs TP vs EP MoE layers (the table of the MoE layer comparison report)");
  cmd->add_option("--benchmark_type", o->benchmark_type, "batch_size, topk or feature_dim")
      ->capture_default_str();
  cmd->add_option("--values", o->values,
                  "the sweep's values, comma-separated (default: batch 8,16,32,64; top-k 1,2,4; "
                  "feature 32,64,128,256; or the swept axis's own flag, one value)");
  cmd->add_option("--preset", o->preset, "mixtral-8x7b, deepseek-v3 or qwen3-30b-a3b");
  cmd->add_option("--ranks", o->ranks, "ranks (threads; under mpirun, the processes)")
      ->capture_default_str();
  cmd->add_option("--experts", o->experts, "number of experts")->capture_default_str();
  cmd->add_option("--feature", o->feature,
                  "feature (input) width; given with --benchmark_type feature_dim, the one value run")
      ->capture_default_str();
  cmd->add_option("--hidden", o->hidden, "expert hidden width")->capture_default_str();
  cmd->add_option("--output", o->output, "expert output width, 0 = feature")->capture_default_str();
  cmd->add_option("--batch", o->batch,
                  "tokens per forward (whole batch); given with --benchmark_type batch_size, the "
                  "one value run")
      ->capture_default_str();
  cmd->add_option("--topk", o->topk,
                  "experts per token; given with --benchmark_type topk, the one value run")
      ->capture_default_str();
  cmd->add_option("--act", o->act, "relu, gelu or swiglu")->capture_default_str();
  cmd->add_option("--dtype", o->dtype, "f32 or bf16")->capture_default_str();
  cmd->add_option("--variants", o->variants, "which layers, comma-separated")
      ->capture_default_str();
  cmd->add_option("--micro-batches", o->micro_batches, "EP micro-batches, 1 or 2")
      ->capture_default_str();
  cmd->add_option("--blas-threads", o->blas_threads,
                  "BLAS threads per rank; 0: Simple all cores, TP/EP cores / ranks")
      ->capture_default_str();
  cmd->add_option("--iters", o->iters, "timed iterations")->capture_default_str();
  cmd->add_option("--warmup", o->warmup, "untimed warm-up iterations")->capture_default_str();
  cmd->add_option("--seed", o->seed, "weights and input seed")->capture_default_str();
  cmd->add_flag("--gemm-rate", o->gemm_rate,
                "EP: also time dense GEMMs of the same FLOPs per rank (on with --preset)");
  cmd->add_option("--device", o->device,
                  "cpu, or cuda: the layers on the CUDA backend (the emulated device where no GPU "
                  "is visible: checked, times labelled emulation)")
      ->capture_default_str();
  cmd->add_option("--json", o->json_path, "write {machine, commit, config, rows} to this file");
  cmd->add_option("--csv", o->csv_path, "write the rows as CSV to this file");
  cmd->add_option("--plot", o->plot_path, "draw median time over the sweep into this PNG");
  cmd->callback([o, cmd] { run(*o, *cmd); });
}

}  // namespace pmoe::bench
