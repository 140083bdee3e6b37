// In-browser performance check on synthetic data (no server): a run page's worth of
// charts (10 × 100k points) and a 100k-node tree. Results land in window.__gyreBench
// and on the page; tests/e2e/test_bench.py reads them.

import { useEffect, useMemo, useState } from "react";
import { Chart } from "../components/Chart";
import { TreeBrowser } from "../components/TreeBrowser";
import { memoryTreeSource } from "../lib/treeSource";
import type { TreeInfo, TreeNode } from "../lib/types";

declare global {
  interface Window {
    __gyreBench?: Record<string, number | boolean>;
  }
}

const LABELS = ["value"];
const frame = () => new Promise<number>((r) => requestAnimationFrame(r));
const painted = async () => (await frame(), await frame());

function series(n: number, seed: number): [number[], ...number[][]] {
  const x = new Array<number>(n);
  const y = new Array<number>(n);
  let v = 0;
  for (let i = 0; i < n; i++) {
    x[i] = i;
    v += Math.sin(i * 0.001 * seed) + (((i * 2654435761) % 1000) / 1000 - 0.5);
    y[i] = v;
  }
  return [x, y];
}

function nodes(n: number): TreeNode[] {
  const kinds = ["continue", "compaction", "subagent", "retry"];
  return Array.from({ length: n }, (_, i) => ({
    id: i + 1,
    parent: null,
    kind: kinds[i % 7 === 0 ? (i % 4) : 0],
    depth: 0,
    path_key: String(i).padStart(6, "0"),
    token_start: i * 16,
    token_end: i * 16 + 16,
    trainable: 16,
    preview: `call ${i}: tool output line`,
    advantage: null,
    leaves: 0,
  }));
}

export function BenchPage() {
  const [stage, setStage] = useState<"charts" | "tree" | "done">("charts");
  const [result, setResult] = useState<Record<string, number | boolean>>({});
  const points = 100_000;
  const t0 = useMemo(() => performance.now(), []);
  const nCharts = Number(new URLSearchParams(window.location.hash.split("?")[1] ?? "").get("charts") ?? 10);
  const charts = useMemo(() => Array.from({ length: nCharts }, (_, i) => series(points, i + 1)), [nCharts]);
  const [treeNodes, setTreeNodes] = useState<TreeNode[]>([]);
  const source = useMemo(() => memoryTreeSource(treeNodes), [treeNodes]);
  const info: TreeInfo = { id: 0, run: 0, group_id: "bench", step: 0, rollouts: 0, nodes: treeNodes.length, depth: 0, tokens_unique: 0, tokens_per_call: 0, dedup_ratio: 1, branch_counts: {} };
  const [treeT0, setTreeT0] = useState(0);

  useEffect(() => {
    if (stage !== "charts") return;
    void painted().then(() => {
      setResult((r) => ({ ...r, chartsMs: Math.round(performance.now() - t0) }));
      setTreeNodes(nodes(100_000)); // the synthetic data is made before the clock starts
      setTreeT0(performance.now());
      setStage("tree");
    });
  }, [stage, t0]);

  useEffect(() => {
    if (stage !== "tree") return;
    let alive = true;
    void (async () => {
      while (alive && !document.querySelector("[data-testid=tree-rows] .tree-row")) await frame();
      const firstRows = Math.round(performance.now() - treeT0);
      const box = document.querySelector<HTMLElement>("[data-testid=tree-rows]")!;
      // Half the frames scroll like a wheel (a few rows), half jump like a dragged thumb.
      let last = await frame();
      const frames: number[] = [];
      for (let i = 1; i <= 120; i++) {
        box.scrollTop = i % 2 ? box.scrollTop + 66 : (box.scrollHeight * i) / 120;
        const now = await frame();
        frames.push(now - last);
        last = now;
      }
      frames.sort((a, b) => a - b);
      const out = {
        treeFirstRowsMs: firstRows,
        scrollFrameP50Ms: Math.round(frames[60]),
        scrollFrameP95Ms: Math.round(frames[113]),
        scrollWorstFrameMs: Math.round(frames[119]),
        scrollLongFrames: frames.filter((f) => f > 50).length,
      };
      setResult((r) => {
        const all = { ...r, ...out, done: true };
        window.__gyreBench = all;
        return all;
      });
      setStage("done");
    })();
    return () => {
      alive = false;
    };
  }, [stage, treeT0]);

  return (
    <div>
      <h2>Dashboard benchmark</h2>
      <pre data-testid="bench-result">{JSON.stringify(result, null, 1)}</pre>
      {stage !== "charts" && <TreeBrowser tree={info} source={source} />}
      <div className="grid">
        {charts.map((data, i) => (
          <Chart key={i} title={`series ${i}`} labels={LABELS} data={data} />
        ))}
      </div>
    </div>
  );
}
