// Trajectory-tree browser: virtualized rows, children fetched on expand, kind badges,
// a detail panel, search within the tree and arrow-key navigation.

import { useVirtualizer } from "@tanstack/react-virtual";
import { useCallback, useEffect, useMemo, useRef, useState } from "react";
import { keyMove, ROOT, TreeModel } from "../lib/tree";
import { apiTreeSource, type TreeSource } from "../lib/treeSource";
import type { TreeInfo, TreeNode } from "../lib/types";

const rowHeight = () => 22;

export function TreeBrowser({ tree, source: given }: { tree: TreeInfo; source?: TreeSource }) {
  const source = useMemo(() => given ?? apiTreeSource(tree.id), [given, tree.id]);
  const model = useRef(new TreeModel());
  const [version, setVersion] = useState(0);
  const [selected, setSelected] = useState(0);
  const [aggregate, setAggregate] = useState(false);
  const [query, setQuery] = useState("");
  const [hits, setHits] = useState<TreeNode[] | null>(null);
  const [error, setError] = useState("");
  const bump = () => setVersion((v) => v + 1);
  const mounted = useRef<TreeSource | null>(null);

  const load = useCallback(
    async (parent: number, next?: string) => {
      try {
        const page = await source.children(parent, next);
        model.current.addChildren(parent, page.nodes, page.next);
        bump();
        // The first page shows at once; the rest stream in behind it (rows are virtual).
        if (page.next && mounted.current === source) void load(parent, page.next);
      } catch (err) {
        setError(String(err));
      }
    },
    [source],
  );

  useEffect(() => {
    mounted.current = source;
    model.current = new TreeModel();
    setSelected(0);
    setHits(null);
    void load(ROOT);
  }, [load]);

  const rows = useMemo(() => model.current.flatten(aggregate), [version, aggregate]); // eslint-disable-line react-hooks/exhaustive-deps
  const scroller = useRef<HTMLDivElement>(null);
  const getScrollElement = useCallback(() => scroller.current, []);
  const virt = useVirtualizer({ count: rows.length, getScrollElement, estimateSize: rowHeight, overscan: 20 });

  const expand = async (id: number) => {
    model.current.expanded.add(id);
    if (!model.current.children.has(id)) await load(id);
    bump();
  };
  const collapse = (id: number) => {
    model.current.expanded.delete(id);
    bump();
  };
  const select = (i: number) => setSelected(i);
  useEffect(() => {
    if (selected < rows.length) virt.scrollToIndex(selected, { align: "auto" });
  }, [selected, rows.length]); // eslint-disable-line react-hooks/exhaustive-deps

  const onKey = (e: React.KeyboardEvent) => {
    const move = keyMove(rows, selected, e.key);
    if (move.kind === "none") return;
    e.preventDefault();
    if (move.kind === "select") select(move.index);
    else if (move.kind === "expand") void expand(move.id);
    else collapse(move.id);
  };

  const search = async (e: React.FormEvent) => {
    e.preventDefault();
    if (!query.trim()) return setHits(null);
    try {
      setHits(await source.search(query));
    } catch (err) {
      setError(String(err));
    }
  };

  const reveal = async (node: TreeNode) => {
    const path = await source.path(node.id);
    for (const anc of path) {
      if (anc.id === node.id) break;
      model.current.expanded.add(anc.id);
      if (!model.current.children.has(anc.id)) {
        const page = await source.children(anc.id);
        model.current.addChildren(anc.id, page.nodes, page.next);
      }
    }
    const flat = model.current.flatten(aggregate);
    bump();
    const i = flat.findIndex((r) => r.node.id === node.id);
    if (i >= 0) select(i);
  };

  const current = rows[selected]?.node;
  return (
    <div className="tree-browser" data-testid="tree-browser">
      <div className="toolbar">
        <b>group {tree.group_id}</b> · {tree.nodes} nodes · {tree.rollouts} rollouts · dedup ×{tree.dedup_ratio.toFixed(2)}
        <label>
          <input type="checkbox" checked={aggregate} onChange={(e) => setAggregate(e.target.checked)} /> collapse retries
        </label>
        <form onSubmit={search}>
          <input placeholder="search text in this tree" value={query} onChange={(e) => setQuery(e.target.value)} data-testid="tree-search" />
        </form>
      </div>
      {error && <p className="error">{error}</p>}
      {hits && (
        <div className="hits" data-testid="tree-hits">
          {hits.length === 0 ? <span className="muted">no match</span> : null}
          {hits.slice(0, 50).map((h) => (
            <button key={h.id} className="linkish" onClick={() => void reveal(h)}>
              {h.kind} · {h.preview.slice(0, 60)}
            </button>
          ))}
        </div>
      )}
      <div className="tree-split">
        <div className="scroll tree-rows" ref={scroller} tabIndex={0} onKeyDown={onKey} data-testid="tree-rows">
          <div style={{ height: virt.getTotalSize(), position: "relative" }}>
            {virt.getVirtualItems().map((v) => {
              const r = rows[v.index];
              return (
                <div
                  key={r.node.id}
                  className={`tree-row${v.index === selected ? " selected" : ""}`}
                  style={{ transform: `translateY(${v.start}px)`, paddingLeft: 8 + r.level * 16 }}
                  onClick={() => setSelected(v.index)}
                >
                  <button
                    className="twisty"
                    aria-label={r.expanded ? "collapse" : "expand"}
                    disabled={!r.expandable}
                    onClick={(e) => {
                      e.stopPropagation();
                      void (r.expanded ? collapse(r.node.id) : expand(r.node.id));
                    }}
                  >
                    {r.expandable ? (r.expanded ? "▾" : "▸") : "·"}
                  </button>
                  <span className={`badge kind-${r.node.kind}`}>{r.node.kind}</span>
                  {r.hiddenRetries > 0 && <span className="badge">+{r.hiddenRetries} retries</span>}
                  <span className="preview">{r.node.preview || `tokens ${r.node.token_start}–${r.node.token_end}`}</span>
                </div>
              );
            })}
          </div>
        </div>
        <div className="detail" data-testid="tree-detail">
          {current ? (
            <dl>
              <dt>kind</dt>
              <dd>{current.kind}</dd>
              <dt>depth</dt>
              <dd>{current.depth}</dd>
              <dt>tokens</dt>
              <dd>
                {current.token_start}–{current.token_end} ({current.token_end - current.token_start}), trainable {current.trainable}
              </dd>
              <dt>advantage</dt>
              <dd>{current.advantage === null ? "—" : current.advantage.toFixed(3)}</dd>
              <dt>leaves below</dt>
              <dd>{current.leaves}</dd>
              <dt>text</dt>
              <dd>
                <pre>{current.preview}</pre>
              </dd>
            </dl>
          ) : (
            <p className="muted">select a node (arrow keys: ↑↓ move, ← parent, → expand)</p>
          )}
        </div>
      </div>
    </div>
  );
}
