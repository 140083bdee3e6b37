// One run, live: status and controls, the current long phase (model build, warm start,
// benchmark, ...), GPU role timeline, rollout progress, metrics, trajectory trees, the
// checkpoints (download for the team's members, export to a Hugging Face directory for its
// writers), the log lines and the event log. Controls show only to a caller who may use them
// (`can_edit` from the API: a writer in the run's team); `readOnly` hides them (share links).

import { useEffect, useState } from "react";
import { useNavigate } from "react-router-dom";
import { EventLog } from "../components/EventLog";
import { LogsPanel } from "../components/LogsPanel";
import { MetricsGrid } from "../components/MetricsGrid";
import { PhaseBar } from "../components/PhaseBar";
import { RoleTimelineView } from "../components/RoleTimelineView";
import { SysMetricsView } from "../components/SysMetricsView";
import { RolloutPanel } from "../components/RolloutPanel";
import { TreeBrowser } from "../components/TreeBrowser";
import { api, listAll } from "../lib/api";
import { type Checkpoint, exportCell, exportsPending } from "../lib/checkpoints";
import { treeLabel } from "../lib/tree";
import type { Run, TreeInfo } from "../lib/types";
import { useRunLive } from "../lib/useRunLive";

export function RunView({ runId, readOnly = false }: { runId: number; readOnly?: boolean }) {
  const [run, setRun] = useState<Run | null>(null);
  const [error, setError] = useState("");
  const [shareUrl, setShareUrl] = useState("");
  const [trees, setTrees] = useState<TreeInfo[]>([]);
  const [tree, setTree] = useState<TreeInfo | null>(null);
  const [checkpoints, setCheckpoints] = useState<Checkpoint[]>([]);
  const { live, version, state, paused, togglePause, cursor } = useRunLive(runId);
  const navigate = useNavigate();

  const refresh = () =>
    api<Run>(`/api/runs/${runId}/`)
      .then(setRun)
      .catch((e) => setError(String(e)));

  useEffect(() => {
    void refresh();
    // eslint-disable-next-line react-hooks/exhaustive-deps
  }, [runId, live.lastStatus]);

  const active = run !== null && ["queued", "starting", "running"].includes(run.status);
  useEffect(() => {
    if (!active) return;
    const timer = setInterval(() => void refresh(), 3000); // step and times between status events
    return () => clearInterval(timer);
    // eslint-disable-next-line react-hooks/exhaustive-deps
  }, [active, runId]);

  useEffect(() => {
    listAll<TreeInfo>(`/api/trees/?run=${runId}`, 5)
      .then(setTrees)
      .catch(() => setTrees([]));
  }, [runId, live.lastStatus]);

  const reached = run?.step;
  const [asked, setAsked] = useState(0); // an export was asked for: read the table again
  const pending = exportsPending(checkpoints);
  useEffect(() => {
    let timer: ReturnType<typeof setTimeout> | undefined;
    api<Checkpoint[]>(`/api/runs/${runId}/checkpoints/`)
      .then((list) => setCheckpoints(Array.isArray(list) ? list : []))
      .catch(() => setCheckpoints([]));
    if (pending) timer = setTimeout(() => setAsked((n) => n + 1), 2000); // until the export ends
    return () => clearTimeout(timer);
  }, [runId, live.lastStatus, reached, asked, pending]);

  const exportCheckpoint = async (version: number) => {
    setError("");
    try {
      await api(`/api/runs/${runId}/checkpoints/${version}/export/`, { method: "POST", json: {} });
      setAsked((n) => n + 1);
    } catch (e) {
      setError(String(e));
    }
  };

  const act = async (verb: string) => {
    setError("");
    try {
      setRun(await api<Run>(`/api/runs/${runId}/${verb}/`, { method: "POST", json: {} }));
    } catch (e) {
      setError(String(e));
    }
  };

  const share = async () => {
    try {
      const link = await api<{ key: string }>("/api/share-links/", { method: "POST", json: { run: runId } });
      setShareUrl(`${window.location.origin}/#/share/${link.key}`);
    } catch (e) {
      setError(String(e));
    }
  };

  if (!run) return <p>{error || "loading…"}</p>;
  const status = run.status;
  const canEdit = !readOnly && run.can_edit === true;
  return (
    <div className="run-page">
      <header className="run-head">
        <h2>
          Run #{run.id} {run.name}
        </h2>
        <span className={`status status-${status}`} data-testid="run-status">
          {status}
        </span>
        <span className="muted">
          {run.policy} · {run.backend} · step {run.step}/{run.steps}
          {run.source === "reported" && " · reported from a terminal"}
        </span>
        <span className={`live live-${state}`} data-testid="stream-state">
          {state} · seq {cursor()}
        </span>
        <button onClick={togglePause} data-testid="pause">
          {paused ? "resume live" : "pause live"}
        </button>
        {canEdit && (
          <>
            <button onClick={() => void act("cancel")} disabled={!["queued", "starting", "running"].includes(status)}>
              cancel
            </button>
            <button onClick={() => void act("pause")} disabled={status !== "running"}>
              pause run
            </button>
            <button onClick={() => void act("resume")} disabled={!["paused", "cancelled", "failed"].includes(status)}>
              resume
            </button>
            <button onClick={() => navigate(`/launch?fork=${run.id}`)}>fork</button>
            <button onClick={() => void share()} data-testid="share">
              share
            </button>
          </>
        )}
      </header>
      {shareUrl && (
        <p className="share-url">
          read-only link (shown once): <input readOnly value={shareUrl} data-testid="share-url" size={80} />
        </p>
      )}
      {error && <p className="error">{error}</p>}
      {run.error && <pre className="error">{run.error}</pre>}
      <PhaseBar events={live.events} version={version} />
      <section>
        <h3>GPU role timeline</h3>
        <RoleTimelineView timeline={live.timeline} version={version} />
        <SysMetricsView store={live.sys} version={version} span={live.timeline.tMax} />
      </section>
      <section>
        <h3>Rollouts</h3>
        <RolloutPanel tracker={live.rollouts} version={version} />
      </section>
      <section>
        <h3>Metrics</h3>
        <MetricsGrid store={live.metrics} version={version} />
      </section>
      <section>
        <h3>Trajectory trees</h3>
        {trees.length === 0 && <p className="muted">no trees stored for this run</p>}
        <div className="tree-list">
          {trees.map((t) => (
            <button key={t.id} className={tree?.id === t.id ? "active" : ""} onClick={() => setTree(t)}>
              {treeLabel(t)} ({t.nodes})
            </button>
          ))}
        </div>
        {tree && <TreeBrowser tree={tree} />}
      </section>
      <section>
        <h3>Checkpoints</h3>
        {checkpoints.length === 0 ? (
          <p className="muted">no checkpoints stored for this run</p>
        ) : (
          <table data-testid="checkpoints">
            <thead>
              <tr>
                <th>step</th>
                <th>version</th>
                <th>size</th>
                <th>benchmark at this step</th>
                <th />
                <th>Hugging Face export</th>
              </tr>
            </thead>
            <tbody>
              {checkpoints.map((c) => (
                <tr key={c.version}>
                  <td>{c.step}</td>
                  <td>{c.version}</td>
                  <td>{(c.size_bytes / 1e6).toFixed(1)} MB</td>
                  <td>
                    {Object.entries(c.benchmark)
                      .map(([suite, score]) => `${suite} ${score.toFixed(3)}`)
                      .join(", ") || "—"}
                  </td>
                  <td>{!readOnly && <a href={`/api/runs/${runId}/checkpoints/${c.version}/download/`}>download</a>}</td>
                  <ExportTd runId={runId} c={c} canExport={canEdit} canDownload={!readOnly} onExport={exportCheckpoint} />
                </tr>
              ))}
            </tbody>
          </table>
        )}
      </section>
      <section>
        <h3>Logs</h3>
        <LogsPanel runId={runId} active={active} />
      </section>
      <section>
        <h3>Event log</h3>
        <EventLog events={live.events} version={version} />
      </section>
    </div>
  );
}

function ExportTd(props: {
  runId: number;
  c: Checkpoint;
  canExport: boolean;
  canDownload: boolean;
  onExport: (version: number) => Promise<void>;
}) {
  const { runId, c } = props;
  const cell = exportCell(c.export, props.canExport, props.canDownload);
  return (
    <td data-testid={`export-${c.version}`}>
      <span className="export-status">{cell.text}</span>{" "}
      {cell.canAsk && (
        <button onClick={() => void props.onExport(c.version)} data-testid={`export-button-${c.version}`}>
          {c.export ? "export again" : "export"}
        </button>
      )}
      {cell.canDownload && (
        <a href={`/api/runs/${runId}/checkpoints/${c.version}/export/download/`} data-testid={`export-download-${c.version}`}>
          download HF directory
        </a>
      )}
    </td>
  );
}
