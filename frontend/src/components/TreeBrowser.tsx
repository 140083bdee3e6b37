// Trajectory-tree browser: virtualized rows, children fetched on expand, kind badges,
// a detail panel (with the selected node's tokens), search within the tree and arrow-key
// navigation.

import { useCallback, useEffect, useMemo, useRef, useState } from "react";
import { apiNodeTokens, type NodeTokens, type NodeTokensSource } from "../lib/nodeTokens";
import { keyMove, ROOT, TreeModel, treeLabel } from "../lib/tree";
import { apiTreeSource, type TreeSource } from "../lib/treeSource";
import type { TreeInfo, TreeNode } from "../lib/types";
import { NodeTokensView } from "./NodeTokensView";
import { TreeRows, useStableCallback } from "./TreeRow";

export function TreeBrowser({
  tree,
  source: given,
  tokens: givenTokens,
}: {
  tree: TreeInfo;
  source?: TreeSource;
  tokens?: NodeTokensSource; // a node's tokens; from the API unless the nodes come from memory
}) {
  const source = useMemo(() => given ?? apiTreeSource(tree.id), [given, tree.id]);
  const tokenSource = useMemo(() => givenTokens ?? (given ? undefined : apiNodeTokens(tree.id)), [givenTokens, given, tree.id]);
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

  const expand = async (id: number) => {
    model.current.expanded.add(id);
    if (!model.current.children.has(id)) await load(id);
    bump();
  };
  const collapse = (id: number) => {
    model.current.expanded.delete(id);
    bump();
  };
  const select = useCallback((i: number) => setSelected(i), []);
  const toggle = useStableCallback((id: number, expanded: boolean) => void (expanded ? collapse(id) : expand(id)));

  const onKey = (e: React.KeyboardEvent) => {
    const move = keyMove(rows, selected, e.key);
    if (move.kind === "none") return;
    e.preventDefault();
    if (move.kind === "select") select(move.index);
    else if (move.kind === "expand") void expand(move.id);
    else collapse(move.id);
  };
  const onRowsKey = useStableCallback(onKey);

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
  const [tokens, setTokens] = useState<{ id: number; data: NodeTokens | null; error: string } | null>(null);
  const currentId = current?.id;
  useEffect(() => {
    if (currentId === undefined || !tokenSource) return setTokens(null);
    let live = true;
    setTokens({ id: currentId, data: null, error: "" });
    tokenSource(currentId).then(
      (data) => live && setTokens({ id: currentId, data, error: "" }),
      (err) => live && setTokens({ id: currentId, data: null, error: String(err) }),
    );
    return () => {
      live = false; // a later selection wins over a slow answer
    };
  }, [currentId, tokenSource]);
  return (
    <div className="tree-browser" data-testid="tree-browser">
      <div className="toolbar">
        <b>group {treeLabel(tree)}</b> · {tree.nodes} nodes · {tree.rollouts} rollouts · dedup ×{tree.dedup_ratio.toFixed(2)}
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
        <TreeRows rows={rows} selected={selected} onSelect={select} onToggle={toggle} onKeyDown={onRowsKey} />
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
                {current.taken != null && `, trained by its step ${current.taken}`}
              </dd>
              <dt>advantage</dt>
              <dd>{current.advantage === null ? "—" : current.advantage.toFixed(3)}</dd>
              <dt>leaves below</dt>
              <dd>{current.leaves}</dd>
              <dt>text</dt>
              <dd>
                <pre>{current.preview}</pre>
              </dd>
              {tokens && tokens.id === current.id && (
                <>
                  <dt>token detail</dt>
                  <dd>
                    {tokens.error ? (
                      <span className="error">{tokens.error}</span>
                    ) : tokens.data ? (
                      <NodeTokensView tokens={tokens.data} />
                    ) : (
                      <span className="muted">loading tokens…</span>
                    )}
                  </dd>
                </>
              )}
            </dl>
          ) : (
            <p className="muted">select a node (arrow keys: ↑↓ move, ← parent, → expand)</p>
          )}
        </div>
      </div>
    </div>
  );
}
