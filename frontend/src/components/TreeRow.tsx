// The tree browser's virtualized list: rows of a fixed height (no measuring), a modest
// overscan, and memoized rows with stable callbacks, so a scroll step renders only the
// rows that came into view, and neither the scroll nor a row re-renders the rest of the
// browser (toolbar, detail panel).

import { useVirtualizer } from "@tanstack/react-virtual";
import { memo, useCallback, useEffect, useLayoutEffect, useRef, type CSSProperties, type KeyboardEvent } from "react";
import type { Row } from "../lib/tree";
import { untrained } from "../lib/types";

export const ROW_HEIGHT = 22; // px, as .tree-row in styles.css
const OVERSCAN = 6; // rows beyond each edge: covers a wheel step without mounting 40 rows
const rowHeight = () => ROW_HEIGHT;

// Each row is its own layout and paint island: a new row never relayouts its siblings.
const ROW_STYLE: CSSProperties = { contain: "layout paint style", height: ROW_HEIGHT };

/** A callback whose identity never changes but that always calls the latest `fn`, so
 * memoized children are not re-rendered because a parent re-created a closure. */
export function useStableCallback<A extends unknown[], R>(fn: (...args: A) => R): (...args: A) => R {
  const latest = useRef(fn);
  useLayoutEffect(() => {
    latest.current = fn;
  });
  return useCallback((...args: A) => latest.current(...args), []);
}

interface TreeRowProps {
  row: Row;
  index: number;
  top: number;
  selected: boolean;
  onSelect: (index: number) => void;
  onToggle: (id: number, expanded: boolean) => void;
}

export const TreeRow = memo(function TreeRow({ row, index, top, selected, onSelect, onToggle }: TreeRowProps) {
  const { node } = row;
  const cls = `tree-row${selected ? " selected" : ""}${untrained(node) ? " untrained" : ""}`;
  return (
    <div
      className={cls}
      style={{ ...ROW_STYLE, transform: `translateY(${top}px)`, paddingLeft: 8 + row.level * 16 }}
      data-index={index}
      onClick={() => onSelect(index)}
    >
      <button
        className="twisty"
        aria-label={row.expanded ? "collapse" : "expand"}
        disabled={!row.expandable}
        onClick={(e) => {
          e.stopPropagation();
          onToggle(node.id, row.expanded);
        }}
      >
        {row.expandable ? (row.expanded ? "▾" : "▸") : "·"}
      </button>
      <span className={`badge kind-${node.kind}`}>{node.kind}</span>
      {row.hiddenRetries > 0 && <span className="badge">+{row.hiddenRetries} retries</span>}
      {untrained(node) && <span className="badge" title="path sampling (train.max_paths) left this out">not trained</span>}
      <span className="preview">{node.preview || `tokens ${node.token_start}–${node.token_end}`}</span>
    </div>
  );
});

interface TreeRowsProps {
  rows: Row[];
  selected: number;
  onSelect: (index: number) => void;
  onToggle: (id: number, expanded: boolean) => void;
  onKeyDown: (e: KeyboardEvent) => void;
}

/** The scrolling list. Pass stable callbacks (useStableCallback) so that only a change of
 * rows or selection re-renders it from the parent; scrolling re-renders it alone. */
export const TreeRows = memo(function TreeRows({ rows, selected, onSelect, onToggle, onKeyDown }: TreeRowsProps) {
  const scroller = useRef<HTMLDivElement>(null);
  const getScrollElement = useCallback(() => scroller.current, []);
  const virt = useVirtualizer({ count: rows.length, getScrollElement, estimateSize: rowHeight, overscan: OVERSCAN });

  useEffect(() => {
    if (selected < rows.length) virt.scrollToIndex(selected, { align: "auto" });
  }, [selected, rows.length]); // eslint-disable-line react-hooks/exhaustive-deps

  return (
    <div className="scroll tree-rows" ref={scroller} tabIndex={0} onKeyDown={onKeyDown} data-testid="tree-rows">
      <div style={{ height: virt.getTotalSize(), position: "relative", contain: "strict", width: "100%" }}>
        {virt.getVirtualItems().map((v) => {
          const r = rows[v.index];
          return (
            <TreeRow
              key={r.node.id}
              row={r}
              index={v.index}
              top={v.start}
              selected={v.index === selected}
              onSelect={onSelect}
              onToggle={onToggle}
            />
          );
        })}
      </div>
    </div>
  );
});
