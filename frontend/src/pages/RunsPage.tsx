// Runs list with filters (team, experiment, status, policy, backend) and bulk cancel.
// Cancel and launch show only to a writer in some team; a viewer's runs are not cancelled.

import { useCallback, useEffect, useRef, useState } from "react";
import { Link, useNavigate } from "react-router-dom";
import { api, listAll, qs } from "../lib/api";
import { WRITE_ROLES, type Experiment, type Page, type Run, type Team } from "../lib/types";

const STATUSES = ["queued", "starting", "running", "paused", "succeeded", "failed", "cancelled"];
const ACTIVE = ["queued", "starting", "running"];

export function RunsPage() {
  const [teams, setTeams] = useState<Team[]>([]);
  const [experiments, setExperiments] = useState<Experiment[]>([]);
  const [filters, setFilters] = useState({ team: "", experiment: "", status: "", policy: "", backend: "" });
  const [runs, setRuns] = useState<Run[]>([]);
  const [next, setNext] = useState<string | null>(null);
  const [picked, setPicked] = useState<Set<number>>(new Set());
  const [message, setMessage] = useState("");
  const navigate = useNavigate();

  useEffect(() => {
    listAll<Team>("/api/teams/").then(setTeams).catch(() => undefined);
  }, []);
  useEffect(() => {
    listAll<Experiment>(`/api/experiments/${qs({ team: filters.team })}`).then(setExperiments).catch(() => undefined);
  }, [filters.team]);

  const latest = useRef(0);
  const load = useCallback(async () => {
    const ticket = ++latest.current;
    const page = await api<Page<Run>>(`/api/runs/${qs({ ...filters, page_size: 100 })}`);
    if (ticket !== latest.current) return; // a newer request (other filters) won the race
    setRuns(page.results);
    setNext(page.next);
  }, [filters]);

  useEffect(() => {
    void load().catch((e) => setMessage(String(e)));
    const timer = setInterval(() => void load().catch(() => undefined), 5000);
    return () => clearInterval(timer);
  }, [load]);

  const more = async () => {
    if (!next) return;
    const u = new URL(next, window.location.origin);
    const page = await api<Page<Run>>(u.pathname + u.search);
    setRuns((r) => [...r, ...page.results]);
    setNext(page.next);
  };

  const toggle = (id: number) =>
    setPicked((s) => {
      const n = new Set(s);
      if (n.has(id)) n.delete(id);
      else n.add(id);
      return n;
    });

  const canWrite = teams.some((t) => t.role !== null && WRITE_ROLES.includes(t.role));
  const readOnlyIds = new Set(runs.filter((r) => r.can_edit === false).map((r) => r.id));
  const cancellable = [...picked].filter((id) => !readOnlyIds.has(id));

  const cancelPicked = async () => {
    const ids = cancellable;
    const results = await Promise.allSettled(ids.map((id) => api(`/api/runs/${id}/cancel/`, { method: "POST", json: {} })));
    const failed = results.filter((r) => r.status === "rejected").length;
    setMessage(`cancel requested for ${ids.length - failed} run(s)${failed ? `, ${failed} refused` : ""}`);
    setPicked(new Set());
    await load();
  };

  const set = (k: keyof typeof filters) => (e: React.ChangeEvent<HTMLSelectElement>) =>
    setFilters((f) => ({ ...f, [k]: e.target.value, ...(k === "team" ? { experiment: "" } : {}) }));

  return (
    <div>
      <h2>Runs</h2>
      <div className="filters">
        <select value={filters.team} onChange={set("team")} aria-label="team">
          <option value="">all teams</option>
          {teams.map((t) => (
            <option key={t.id} value={t.id}>
              {t.name}
            </option>
          ))}
        </select>
        <select value={filters.experiment} onChange={set("experiment")} aria-label="experiment">
          <option value="">all experiments</option>
          {experiments.map((x) => (
            <option key={x.id} value={x.id}>
              {x.name}
            </option>
          ))}
        </select>
        <select value={filters.status} onChange={set("status")} aria-label="status">
          <option value="">any status</option>
          {STATUSES.map((s) => (
            <option key={s}>{s}</option>
          ))}
        </select>
        <select value={filters.policy} onChange={set("policy")} aria-label="policy">
          <option value="">any policy</option>
          {["colocate", "async", "elastic"].map((s) => (
            <option key={s}>{s}</option>
          ))}
        </select>
        <select value={filters.backend} onChange={set("backend")} aria-label="backend">
          <option value="">any backend</option>
          {["real", "sim"].map((s) => (
            <option key={s}>{s}</option>
          ))}
        </select>
        {canWrite && (
          <button disabled={!cancellable.length} onClick={() => void cancelPicked()}>
            cancel selected ({cancellable.length})
          </button>
        )}
        <button disabled={picked.size < 2} onClick={() => navigate(`/compare?runs=${[...picked].join(",")}`)}>
          compare selected
        </button>
        {canWrite && (
          <Link to="/launch" className="button">
            launch…
          </Link>
        )}
      </div>
      {message && <p className="note">{message}</p>}
      <table className="runs" data-testid="runs-table">
        <thead>
          <tr>
            <th />
            <th>id</th>
            <th>name</th>
            <th>status</th>
            <th>policy</th>
            <th>backend</th>
            <th>step</th>
            <th>created</th>
          </tr>
        </thead>
        <tbody>
          {runs.map((r) => (
            <tr key={r.id}>
              <td>
                <input type="checkbox" checked={picked.has(r.id)} onChange={() => toggle(r.id)} aria-label={`select run ${r.id}`} />
              </td>
              <td>{r.id}</td>
              <td>
                <Link to={`/runs/${r.id}`}>{r.name || `run ${r.id}`}</Link>
              </td>
              <td>
                <span className={`status status-${r.status}`}>{r.status}</span>
                {ACTIVE.includes(r.status) ? " ●" : ""}
              </td>
              <td>{r.policy}</td>
              <td>{r.backend}</td>
              <td>
                {r.step}/{r.steps}
              </td>
              <td>{new Date(r.created_at).toLocaleString()}</td>
            </tr>
          ))}
        </tbody>
      </table>
      {runs.length === 0 && <p className="muted">no runs match</p>}
      {next && <button onClick={() => void more()}>more</button>}
    </div>
  );
}
