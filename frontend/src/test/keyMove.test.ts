import { describe, expect, it } from "vitest";
import { keyMove, ROOT, TreeModel } from "../lib/tree";
import type { TreeNode } from "../lib/types";

const node = (id: number, parent: number | null): TreeNode => ({
  id, parent, kind: "continue", depth: parent === null ? 0 : 1, path_key: String(id).padStart(4, "0"),
  token_start: 0, token_end: 4, trainable: 4, preview: `node ${id}`, advantage: null, leaves: 1,
}); // prettier-ignore

describe("keyMove ArrowLeft on an expanded node", () => {
  it("collapses a node with children, but goes to the parent from one that has none", () => {
    const m = new TreeModel();
    m.addChildren(ROOT, [node(1, null)]);
    m.addChildren(1, [node(2, 1)]);
    m.expanded.add(1);
    m.expanded.add(2); // expanded before its (empty) children were known
    expect(keyMove(m.flatten(), 1, "ArrowLeft")).toEqual({ kind: "collapse", id: 2 }); // still loading
    m.addChildren(2, []);
    expect(keyMove(m.flatten(), 1, "ArrowLeft")).toEqual({ kind: "select", index: 0 }); // loaded: none
    expect(keyMove(m.flatten(), 0, "ArrowLeft")).toEqual({ kind: "collapse", id: 1 });
  });
});
