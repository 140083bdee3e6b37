// Launch a sweep: a base config (from a preset, editable as JSON), the fields to vary
// (a grid of values, or random choices and ranges), and how many runs may run at once;
// then the compare page shows it. Below, the experiment's sweeps.

import { useEffect, useState } from "react";
import { Link, useNavigate } from "react-router-dom";
import { api, ApiError, listAll } from "../lib/api";
import type { PresetsResponse } from "../lib/config";
import { buildParams, errorLines, type ParamRow, type Sweep } from "../lib/sweep";
import type { Experiment } from "../lib/types";

const START: ParamRow[] = [
  { field: "train.lr", values: "1e-4, 3e-4", log: false },
  { field: "seed", values: "1, 2", log: false },
];

export function SweepPage() {
  const navigate = useNavigate();
  const [experiments, setExperiments] = useState<Experiment[]>([]);
  const [experiment, setExperiment] = useState("");
  const [presets, setPresets] = useState<PresetsResponse | null>(null);
  const [base, setBase] = useState("{}");
  const [name, setName] = useState("");
  const [mode, setMode] = useState<"grid" | "random">("grid");
  const [rows, setRows] = useState<ParamRow[]>(START);
  const [samples, setSamples] = useState(4);
  const [seed, setSeed] = useState(0);
  const [cap, setCap] = useState(2);
  const [errors, setErrors] = useState<string[]>([]);
  const [sweeps, setSweeps] = useState<Sweep[]>([]);

  useEffect(() => {
    listAll<Experiment>("/api/experiments/").then((xs) => {
      setExperiments(xs);
      setExperiment((cur) => cur || (xs.length ? String(xs[0].id) : ""));
    });
    api<PresetsResponse>("/api/config/presets/")
      .then((p) => {
        setPresets(p);
        setBase((cur) => (cur === "{}" ? JSON.stringify(p.default ?? {}, null, 2) : cur)); // unless edited
      })
      .catch(() => undefined);
  }, []);
  useEffect(() => {
    if (experiment) listAll<Sweep>(`/api/sweeps/?experiment=${experiment}`).then(setSweeps).catch(() => undefined);
  }, [experiment]);

  const setRow = (i: number, change: Partial<ParamRow>) =>
    setRows((rs) => rs.map((r, j) => (j === i ? { ...r, ...change } : r)));

  const submit = async (e: React.FormEvent) => {
    e.preventDefault();
    let config: unknown;
    try {
      config = JSON.parse(base);
    } catch (err) {
      return setErrors([`base_config: not JSON (${String(err)})`]);
    }
    const body = {
      experiment: Number(experiment), name, base_config: config, mode,
      params: buildParams(rows, mode), samples: mode === "random" ? samples : 0, seed, max_concurrent: cap,
    }; // prettier-ignore
    setErrors([]);
    try {
      const made = await api<Sweep>("/api/sweeps/", { method: "POST", json: body });
      navigate(`/compare?sweep=${made.id}`);
    } catch (err) {
      setErrors(err instanceof ApiError ? errorLines(err.body) : [String(err)]);
    }
  };

  return (
    <div>
      <h2>Launch a sweep</h2>
      <form onSubmit={submit} className="sweep-form" data-testid="sweep-form">
        <p>
          experiment{" "}
          <select aria-label="experiment" value={experiment} onChange={(e) => setExperiment(e.target.value)}>
            {experiments.map((x) => (
              <option key={x.id} value={x.id}>
                {x.name}
              </option>
            ))}
          </select>{" "}
          name <input name="sweep-name" value={name} onChange={(e) => setName(e.target.value)} />
        </p>
        <p>
          base config from preset{" "}
          <select
            aria-label="sweep preset"
            defaultValue=""
            onChange={(e) => presets && setBase(JSON.stringify(presets.presets[e.target.value] ?? presets.default, null, 2))}
          >
            <option value="">default</option>
            {Object.keys(presets?.presets ?? {}).map((p) => (
              <option key={p} value={p}>
                {p}
              </option>
            ))}
          </select>
        </p>
        <textarea name="base-config" rows={10} cols={80} value={base} onChange={(e) => setBase(e.target.value)} />
        <p>
          <label>
            <input type="radio" name="mode" checked={mode === "grid"} onChange={() => setMode("grid")} /> grid (every
            combination)
          </label>{" "}
          <label>
            <input type="radio" name="mode" checked={mode === "random"} onChange={() => setMode("random")} /> random
          </label>
          {mode === "random" && (
            <>
              {" "}
              samples <input name="samples" type="number" size={4} value={samples} onChange={(e) => setSamples(Number(e.target.value))} /> seed{" "}
              <input name="seed" type="number" value={seed} onChange={(e) => setSeed(Number(e.target.value))} />
            </>
          )}{" "}
          · at most <input name="max_concurrent" size={4} type="number" value={cap} onChange={(e) => setCap(Number(e.target.value))} /> runs
          at once
        </p>
        <table data-testid="sweep-params">
          <thead>
            <tr>
              <th>config field</th>
              <th>values {mode === "random" ? "(a, b, c to choose from, or low .. high)" : "(comma-separated)"}</th>
              {mode === "random" && <th>log</th>}
              <th />
            </tr>
          </thead>
          <tbody>
            {rows.map((r, i) => (
              <tr key={i}>
                <td>
                  <input name={`field-${i}`} value={r.field} onChange={(e) => setRow(i, { field: e.target.value })} />
                </td>
                <td>
                  <input name={`values-${i}`} size={40} value={r.values} onChange={(e) => setRow(i, { values: e.target.value })} />
                </td>
                {mode === "random" && (
                  <td>
                    <input type="checkbox" checked={r.log} onChange={(e) => setRow(i, { log: e.target.checked })} />
                  </td>
                )}
                <td>
                  <button type="button" onClick={() => setRows((rs) => rs.filter((_, j) => j !== i))}>
                    remove
                  </button>
                </td>
              </tr>
            ))}
          </tbody>
        </table>
        <p>
          <button type="button" onClick={() => setRows((rs) => [...rs, { field: "", values: "", log: false }])}>
            add field
          </button>{" "}
          <button type="submit" data-testid="launch-sweep">
            launch sweep
          </button>
        </p>
        {errors.map((line) => (
          <p key={line} className="error" data-testid="sweep-error">
            {line}
          </p>
        ))}
      </form>
      <h3>Sweeps of this experiment</h3>
      <table data-testid="sweeps">
        <tbody>
          {sweeps.map((s) => (
            <tr key={s.id}>
              <td>
                <Link to={`/compare?sweep=${s.id}`}>{s.name || `sweep ${s.id}`}</Link>
              </td>
              <td>{s.mode}</td>
              <td>{s.run_count} runs</td>
              <td>{s.status}</td>
            </tr>
          ))}
        </tbody>
      </table>
    </div>
  );
}
