import { describe, expect, it } from "vitest";
import { buildParams, commonMetrics, errorLines, nextSort, parseValues, sortRows, type SweepRunRow } from "../lib/sweep";

function row(index: number, lr: number, score: number | null, status = "succeeded", loss?: number): SweepRunRow {
  return {
    run: 100 + index, index, name: `s #${index + 1}`, values: { "train.lr": lr, "scheduler.policy": index % 2 ? "colocate" : "elastic" },
    status, launched: true, step: 2, steps: 2, benchmark_step: score === null ? null : 2,
    benchmark: score === null ? {} : { repo: score }, score, metrics: loss === undefined ? {} : { loss },
  }; // prettier-ignore
}

const rows = [row(0, 3e-4, 0.5), row(1, 1e-4, null, "running"), row(2, 1e-3, 0.7), row(3, 1e-4, 0.5)];

describe("sweep table sorting", () => {
  it("sorts by a swept number field both ways, ties in sweep order", () => {
    expect(sortRows(rows, { key: "values.train.lr", dir: "asc" }).map((r) => r.index)).toEqual([1, 3, 0, 2]);
    expect(sortRows(rows, { key: "values.train.lr", dir: "desc" }).map((r) => r.index)).toEqual([2, 0, 1, 3]);
  });

  it("puts a run without a score last in both directions", () => {
    expect(sortRows(rows, { key: "score", dir: "desc" }).map((r) => r.index)).toEqual([2, 0, 3, 1]);
    expect(sortRows(rows, { key: "score", dir: "asc" }).map((r) => r.index)).toEqual([0, 3, 2, 1]);
  });

  it("sorts strings and metrics, and leaves the input alone", () => {
    expect(sortRows(rows, { key: "values.scheduler.policy", dir: "asc" }).map((r) => r.index)).toEqual([1, 3, 0, 2]);
    const withLoss = [row(0, 1, null, "succeeded", 0.3), row(1, 1, null, "succeeded", 0.1)];
    expect(sortRows(withLoss, { key: "metric:loss", dir: "asc" }).map((r) => r.index)).toEqual([1, 0]);
    expect(rows.map((r) => r.index)).toEqual([0, 1, 2, 3]);
    expect(commonMetrics(withLoss)).toEqual(["loss"]);
  });

  it("a click flips the column's direction; a new score column starts best first", () => {
    expect(nextSort(null, "score")).toEqual({ key: "score", dir: "desc" });
    expect(nextSort(null, "values.seed")).toEqual({ key: "values.seed", dir: "asc" });
    expect(nextSort({ key: "score", dir: "desc" }, "score")).toEqual({ key: "score", dir: "asc" });
  });
});

describe("sweep form", () => {
  it("parses values and ranges into the API's params", () => {
    expect(parseValues("1e-4, 3e-4, elastic, true,")).toEqual([1e-4, 3e-4, "elastic", true]);
    const rowsIn = [
      { field: "train.lr", values: "1e-5 .. 1e-3", log: true },
      { field: "seed", values: "1, 2", log: false },
      { field: " ", values: "9", log: false },
    ];
    expect(buildParams(rowsIn, "random")).toEqual({ "train.lr": { low: 1e-5, high: 1e-3, log: true }, seed: [1, 2] });
    expect(buildParams(rowsIn, "grid")["train.lr"]).toEqual(["1e-5 .. 1e-3"]);
  });

  it("shows each refused field of an error answer", () => {
    expect(errorLines({ 'params["train.lr"]': ["-1: must be > 0"], base_config: { steps: ["must be > 0"] } })).toEqual([
      'params["train.lr"]: -1: must be > 0',
      "base_config.steps: must be > 0",
    ]);
  });
});
