// Launch (or fork) a run: a form generated from the config schema, presets, and the
// API's validation errors shown next to their fields.

import { useEffect, useMemo, useState } from "react";
import { useNavigate, useSearchParams } from "react-router-dom";
import { api, ApiError, listAll } from "../lib/api";
import {
  apiErrors,
  buildConfig,
  defaults,
  flattenConfig,
  groups,
  presetValues,
  type FieldErrors,
  type FormValues,
  type PresetsResponse,
} from "../lib/config";
import snapshot from "../lib/schema.snapshot.json";
import type { ConfigSchema, Experiment, Run, Team } from "../lib/types";

export function LaunchPage() {
  const [params] = useSearchParams();
  const forkOf = params.get("fork");
  const navigate = useNavigate();
  const [schema, setSchema] = useState<ConfigSchema | null>(null);
  const [schemaNote, setSchemaNote] = useState("");
  const [values, setValues] = useState<FormValues>({});
  const [errors, setErrors] = useState<FieldErrors>({});
  const [teams, setTeams] = useState<Team[]>([]);
  const [experiments, setExperiments] = useState<Experiment[]>([]);
  const [experiment, setExperiment] = useState("");
  const [newExperiment, setNewExperiment] = useState("");
  const [busy, setBusy] = useState(false);
  const [presets, setPresets] = useState<Record<string, FormValues>>({});

  useEffect(() => {
    api<ConfigSchema>("/api/config/schema/")
      .then(setSchema)
      .catch(() => {
        setSchema(snapshot as ConfigSchema);
        setSchemaNote("the server has no /api/config/schema/: using the schema bundled at build time");
      });
    api<PresetsResponse>("/api/config/presets/")
      .then((resp) => setPresets(presetValues(resp)))
      .catch(() => undefined); // the form works without presets
    listAll<Team>("/api/teams/").then(setTeams).catch(() => undefined);
    listAll<Experiment>("/api/experiments/").then((xs) => {
      setExperiments(xs);
      setExperiment((cur) => cur || (xs.length ? String(xs[0].id) : "new"));
    });
  }, []);

  useEffect(() => {
    if (!schema) return;
    const base = defaults(schema);
    setValues(base);
    if (!forkOf) return;
    api<Run>(`/api/runs/${forkOf}/`).then((run) => {
      setValues({ ...base, ...flattenConfig(run.config ?? {}) });
      setExperiment(String(run.experiment));
    });
  }, [schema, forkOf]);

  const sections = useMemo(() => (schema ? groups(schema) : []), [schema]);

  const applyPreset = (name: string) => {
    if (!schema || !presets[name]) return;
    setValues({ ...defaults(schema), ...presets[name] });
    setErrors({});
  };

  const submit = async (e: React.FormEvent) => {
    e.preventDefault();
    if (!schema) return;
    const { config, errors: local } = buildConfig(schema, values);
    if (Object.keys(local).length) return setErrors(local);
    setBusy(true);
    setErrors({});
    try {
      let expId = experiment;
      if (experiment === "new") {
        const team = teams.find((t) => t.role && t.role !== "viewer") ?? teams[0];
        if (!team) throw new Error("you are in no team: ask an admin to add you");
        const x = await api<Experiment>("/api/experiments/", { method: "POST", json: { team: team.id, name: newExperiment || "experiment" } });
        expId = String(x.id);
      }
      const run = forkOf
        ? await api<Run>(`/api/runs/${forkOf}/fork/`, { method: "POST", json: { changes: config, name: String(config.name ?? "") } })
        : await api<Run>("/api/runs/", { method: "POST", json: { experiment: Number(expId), name: String(config.name ?? ""), config } });
      navigate(`/runs/${run.id}`);
    } catch (err) {
      setErrors(err instanceof ApiError ? apiErrors(err.body) : { _form: [String(err)] });
    } finally {
      setBusy(false);
    }
  };

  if (!schema) return <p>loading the config schema…</p>;
  return (
    <form className="launch" onSubmit={submit} data-testid="launch-form">
      <h2>{forkOf ? `Fork run #${forkOf}` : "Launch a run"}</h2>
      {schemaNote && <p className="muted">{schemaNote}</p>}
      <div className="filters">
        <label>
          preset{" "}
          <select onChange={(e) => applyPreset(e.target.value)} defaultValue="" aria-label="preset">
            <option value="">defaults</option>
            {Object.keys(presets).map((p) => (
              <option key={p}>{p}</option>
            ))}
          </select>
        </label>
        {!forkOf && (
          <label>
            experiment{" "}
            <select value={experiment} onChange={(e) => setExperiment(e.target.value)} aria-label="experiment">
              {experiments.map((x) => (
                <option key={x.id} value={x.id}>
                  {x.name}
                </option>
              ))}
              <option value="new">new experiment…</option>
            </select>
          </label>
        )}
        {experiment === "new" && <input placeholder="experiment name" value={newExperiment} onChange={(e) => setNewExperiment(e.target.value)} />}
      </div>
      {(errors._form ?? errors.experiment ?? errors.config) && (
        <p className="error" data-testid="form-error">
          {[...(errors._form ?? []), ...(errors.experiment ?? []), ...(errors.config ?? [])].join("; ")}
        </p>
      )}
      {sections.map(([section, paths]) => (
        <fieldset key={section}>
          <legend>{section}</legend>
          {paths.map((path) => {
            const entry = schema[path];
            const err = errors[path];
            const value = values[path] ?? "";
            const set = (v: string) => setValues((vs) => ({ ...vs, [path]: v }));
            return (
              <label key={path} className={`field${err ? " invalid" : ""}`} title={entry.help}>
                <span className="name">{path}</span>
                {entry.choices ? (
                  <select name={path} value={value} onChange={(e) => set(e.target.value)}>
                    {entry.choices.map((c) => (
                      <option key={String(c)}>{String(c)}</option>
                    ))}
                  </select>
                ) : entry.type === "bool" ? (
                  <select name={path} value={value} onChange={(e) => set(e.target.value)}>
                    <option>true</option>
                    <option>false</option>
                  </select>
                ) : (
                  <input
                    name={path}
                    value={value}
                    inputMode={entry.type === "int" || entry.type === "float" ? "decimal" : undefined}
                    onChange={(e) => set(e.target.value)}
                  />
                )}
                <span className="help">{entry.help}</span>
                {err && <span className="field-error">{err.join("; ")}</span>}
              </label>
            );
          })}
        </fieldset>
      ))}
      <button type="submit" disabled={busy} data-testid="launch">
        {forkOf ? "fork" : "launch"}
      </button>
    </form>
  );
}
