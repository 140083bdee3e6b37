// A trajectory tree loaded lazily (children by parent) and flattened into visible rows
// for a virtualized list; keyboard moves work on those rows.

import type { TreeInfo, TreeNode } from "./types";

export const ROOT = -1; // key of the (virtual) parent of the root nodes

export interface Row {
  node: TreeNode;
  level: number;
  expanded: boolean;
  loaded: boolean; // its children are known
  expandable: boolean;
  hiddenRetries: number; // aggregated mode: retry siblings folded into this row
}

export class TreeModel {
  readonly children = new Map<number, TreeNode[]>();
  readonly more = new Map<number, string>(); // next-page URL of a parent's children
  readonly byId = new Map<number, TreeNode>();
  readonly expanded = new Set<number>();

  /** Add a page of children of `parent` (ROOT for the roots). */
  addChildren(parent: number, nodes: TreeNode[], next: string | null = null): void {
    const list = this.children.get(parent) ?? [];
    const seen = new Set(list.map((n) => n.id));
    for (const n of nodes) {
      if (seen.has(n.id)) continue;
      list.push(n);
      this.byId.set(n.id, n);
    }
    // Pages arrive in path order; sort only when they did not.
    if (!inOrder(list)) list.sort((a, b) => (a.path_key < b.path_key ? -1 : a.path_key > b.path_key ? 1 : 0));
    this.children.set(parent, list);
    if (next) this.more.set(parent, next);
    else this.more.delete(parent);
  }

  /** The visible rows, depth first. `aggregate` folds retry siblings into their first. */
  flatten(aggregate = false): Row[] {
    const rows: Row[] = [];
    const walk = (parent: number, level: number): void => {
      const kids = this.children.get(parent) ?? [];
      let lastKept: Row | null = null;
      for (const node of kids) {
        if (aggregate && node.kind === "retry" && lastKept && lastKept.node.kind === "retry") {
          lastKept.hiddenRetries++;
          continue;
        }
        const loaded = this.children.has(node.id);
        const expanded = this.expanded.has(node.id);
        const row: Row = {
          node,
          level,
          expanded,
          loaded,
          expandable: !loaded || (this.children.get(node.id)?.length ?? 0) > 0,
          hiddenRetries: 0,
        };
        rows.push(row);
        lastKept = row;
        if (expanded && loaded) walk(node.id, level + 1);
      }
    };
    walk(ROOT, 0);
    return rows;
  }

  /** The chain of ancestors of a node that are loaded (root first). */
  ancestors(id: number): number[] {
    const out: number[] = [];
    let cur = this.byId.get(id)?.parent ?? null;
    while (cur !== null && cur !== undefined) {
      out.unshift(cur);
      cur = this.byId.get(cur)?.parent ?? null;
    }
    return out;
  }
}

export type KeyMove =
  | { kind: "select"; index: number }
  | { kind: "expand"; id: number }
  | { kind: "collapse"; id: number }
  | { kind: "none" };

/** What an arrow key does on the flat rows: up/down move, left = collapse or go to the
 * parent, right = expand or go to the first child. */
export function keyMove(rows: Row[], index: number, key: string): KeyMove {
  const row = rows[index];
  if (!row) return rows.length ? { kind: "select", index: 0 } : { kind: "none" };
  switch (key) {
    case "ArrowDown":
      return { kind: "select", index: Math.min(rows.length - 1, index + 1) };
    case "ArrowUp":
      return { kind: "select", index: Math.max(0, index - 1) };
    case "ArrowLeft": {
      // An expanded node whose children turned out to be none has nothing to fold: go up.
      if (row.expanded && row.expandable) return { kind: "collapse", id: row.node.id };
      for (let i = index - 1; i >= 0; i--) if (rows[i].level < row.level) return { kind: "select", index: i };
      return { kind: "none" };
    }
    case "ArrowRight": {
      if (!row.expanded && row.expandable) return { kind: "expand", id: row.node.id };
      const next = rows[index + 1];
      if (row.expanded && next && next.level > row.level) return { kind: "select", index: index + 1 };
      return { kind: "none" };
    }
    default:
      return { kind: "none" };
  }
}

function inOrder(list: TreeNode[]): boolean {
  for (let i = 1; i < list.length; i++) if (list[i - 1].path_key > list[i].path_key) return false;
  return true;
}

/** A tree's name in lists: its group, and the training step when it is one step's part of
 * the group (the trainer weighs each step's part on its own; 0: an upload, weighed whole). */
export function treeLabel(tree: Pick<TreeInfo, "group_id" | "step">): string {
  return tree.step ? `${tree.group_id} · step ${tree.step}` : tree.group_id;
}
