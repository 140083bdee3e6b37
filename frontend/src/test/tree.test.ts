import { describe, expect, it } from "vitest";
import { keyMove, ROOT, TreeModel, treeLabel } from "../lib/tree";
import type { TreeNode } from "../lib/types";

function node(id: number, parent: number | null, path_key: string, kind = "continue"): TreeNode {
  return { id, parent, kind, depth: path_key.split(".").length - 1, path_key, token_start: 0, token_end: 10, trainable: 5, preview: `n${id}`, advantage: null, leaves: 1 };
}

function model() {
  const m = new TreeModel();
  m.addChildren(ROOT, [node(1, null, "0000")]);
  m.addChildren(1, [node(3, 1, "0000.0001", "retry"), node(2, 1, "0000.0000"), node(4, 1, "0000.0002", "retry")]);
  m.addChildren(2, [node(5, 2, "0000.0000.0000", "compaction")]);
  return m;
}

describe("TreeModel.flatten", () => {
  it("shows only the roots until a node is expanded, children in path order", () => {
    const m = model();
    expect(m.flatten().map((r) => r.node.id)).toEqual([1]);
    m.expanded.add(1);
    expect(m.flatten().map((r) => [r.node.id, r.level])).toEqual([
      [1, 0],
      [2, 1],
      [3, 1],
      [4, 1],
    ]);
    m.expanded.add(2);
    expect(m.flatten().map((r) => r.node.id)).toEqual([1, 2, 5, 3, 4]);
  });

  it("treats an unloaded node as expandable and a loaded empty one as a leaf", () => {
    const m = model();
    m.expanded.add(1);
    m.addChildren(3, []);
    const rows = m.flatten();
    expect(rows.find((r) => r.node.id === 2)!.expandable).toBe(true);
    expect(rows.find((r) => r.node.id === 3)!.expandable).toBe(false);
    expect(rows.find((r) => r.node.id === 4)!.loaded).toBe(false);
  });

  it("folds consecutive retry siblings in aggregated mode", () => {
    const m = model();
    m.expanded.add(1);
    const rows = m.flatten(true);
    expect(rows.map((r) => r.node.id)).toEqual([1, 2, 3]);
    expect(rows[2].hiddenRetries).toBe(1);
  });

  it("does not duplicate a page that arrives twice and remembers the next page", () => {
    const m = model();
    m.addChildren(ROOT, [node(1, null, "0000"), node(9, null, "0001")], "/next");
    expect(m.children.get(ROOT)!.map((n) => n.id)).toEqual([1, 9]);
    expect(m.more.get(ROOT)).toBe("/next");
    expect(m.ancestors(5)).toEqual([1, 2]);
  });
});

describe("keyMove", () => {
  it("moves, expands, collapses and jumps to the parent", () => {
    const m = model();
    m.expanded.add(1);
    const rows = m.flatten();
    expect(keyMove(rows, 0, "ArrowDown")).toEqual({ kind: "select", index: 1 });
    expect(keyMove(rows, 0, "ArrowUp")).toEqual({ kind: "select", index: 0 });
    expect(keyMove(rows, 1, "ArrowRight")).toEqual({ kind: "expand", id: 2 });
    expect(keyMove(rows, 2, "ArrowLeft")).toEqual({ kind: "select", index: 0 });
    expect(keyMove(rows, 0, "ArrowLeft")).toEqual({ kind: "collapse", id: 1 });
    expect(keyMove(rows, 0, "ArrowRight")).toEqual({ kind: "select", index: 1 });
    expect(keyMove(rows, 3, "ArrowDown")).toEqual({ kind: "select", index: 3 });
    expect(keyMove(rows, 0, "x")).toEqual({ kind: "none" });
  });
});

describe("treeLabel", () => {
  it("names a step's part of a group by its step, an upload by its group alone", () => {
    expect(treeLabel({ group_id: "g0", step: 2 })).toBe("g0 · step 2");
    expect(treeLabel({ group_id: "g0", step: 0 })).toBe("g0");
  });
});
