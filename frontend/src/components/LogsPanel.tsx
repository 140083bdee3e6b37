// A run's log lines (the runtime's and the worker's): a search box, a level filter and a
// follow toggle. Following re-reads the lines after the newest one held (every second
// while the run is active, every 5 s after) and keeps the view scrolled to the bottom.

import { useEffect, useRef, useState } from "react";
import { api } from "../lib/api";
import { lastSeq, logsUrl, mergeLines, PAGE, type LogFilter } from "../lib/logs";
import type { LogLevel, LogLine, LogPage } from "../lib/types";

const FOLLOW_MS = 1000;
const IDLE_MS = 5000; // a finished run's last lines may land just after its status

export function LogsPanel({ runId, active }: { runId: number; active: boolean }) {
  const [lines, setLines] = useState<LogLine[]>([]);
  const [filter, setFilter] = useState<LogFilter>({ q: "", level: "" });
  const [typed, setTyped] = useState("");
  const [follow, setFollow] = useState(true);
  const [error, setError] = useState("");
  const held = useRef<LogLine[]>([]);
  const shown = useRef(""); // the run and filter the held lines are of
  const box = useRef<HTMLDivElement>(null);

  useEffect(() => {
    let stop = false;
    let timer: ReturnType<typeof setTimeout> | undefined;
    const key = `${runId}|${filter.q}|${filter.level}`;
    if (shown.current !== key) {
      shown.current = key;
      held.current = [];
      setLines([]);
    }
    const read = async () => {
      try {
        const page = await api<LogPage>(logsUrl(runId, filter, lastSeq(held.current)));
        if (stop) return;
        setError("");
        const next = mergeLines(held.current, page.lines);
        if (next !== held.current) {
          held.current = next;
          setLines(next);
        }
        if (page.lines.length === PAGE && lastSeq(held.current) > 0) {
          timer = setTimeout(() => void read(), 0); // more waiting
          return;
        }
      } catch (e) {
        if (!stop) setError(String(e));
      }
      if (!stop && follow) timer = setTimeout(() => void read(), active ? FOLLOW_MS : IDLE_MS);
    };
    void read();
    return () => {
      stop = true;
      clearTimeout(timer);
    };
  }, [runId, filter, follow, active]);

  useEffect(() => {
    const el = box.current;
    if (follow && el) el.scrollTop = el.scrollHeight;
  }, [lines, follow]);

  return (
    <div className="logs-panel">
      <form
        className="logs-controls"
        onSubmit={(e) => {
          e.preventDefault();
          setFilter({ ...filter, q: typed });
        }}
      >
        <input
          type="search"
          placeholder="search the log"
          value={typed}
          onChange={(e) => setTyped(e.target.value)}
          data-testid="logs-search"
        />
        <button type="submit">search</button>
        <select
          value={filter.level}
          onChange={(e) => setFilter({ ...filter, level: e.target.value as LogLevel | "" })}
          data-testid="logs-level"
        >
          <option value="">every level</option>
          <option value="info">info and above</option>
          <option value="warning">warnings and errors</option>
          <option value="error">errors</option>
        </select>
        <label>
          <input type="checkbox" checked={follow} onChange={(e) => setFollow(e.target.checked)} data-testid="logs-follow" />{" "}
          follow
        </label>
        <span className="muted">{lines.length} lines</span>
      </form>
      {error && <p className="error">{error}</p>}
      <div className="scroll logs" ref={box} style={{ height: 240 }} data-testid="logs">
        {lines.length === 0 && <p className="muted">no log lines{filter.q || filter.level ? " match" : " yet"}</p>}
        {lines.map((l) => (
          <div key={l.seq} className={`log-line log-${l.level}`} data-testid="log-line">
            <span className="seq">{l.time.slice(11, 23)}</span> <span className="log-source">{l.source}</span>{" "}
            <span className="log-level">{l.level}</span> <code>{l.text}</code>
          </div>
        ))}
      </div>
    </div>
  );
}
