// @vitest-environment jsdom
import { cleanup, fireEvent, render, screen } from "@testing-library/react";
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from "vitest";
import { TreeRows } from "../components/TreeRow";
import { TreeModel, ROOT } from "../lib/tree";
import type { TreeNode } from "../lib/types";

afterEach(cleanup);

// jsdom lays nothing out: give the scroller the height styles.css gives it.
beforeAll(() => Object.defineProperty(HTMLElement.prototype, "clientHeight", { configurable: true, get: () => 360 }));
afterAll(() => Reflect.deleteProperty(HTMLElement.prototype, "clientHeight")); // Element's again

const node = (id: number, parent: number | null, kind = "continue"): TreeNode => ({
  id, parent, kind, depth: parent === null ? 0 : 1, path_key: String(id).padStart(4, "0"),
  token_start: 0, token_end: 4, trainable: 4, preview: `node ${id}`, advantage: null, leaves: 1,
}); // prettier-ignore

describe("TreeRows", () => {
  it("draws fixed-height rows at their offsets and reports clicks and toggles", () => {
    const m = new TreeModel();
    m.addChildren(ROOT, [node(1, null), node(2, null, "retry")]);
    m.addChildren(1, [node(3, 1)]);
    m.addChildren(3, []); // a leaf
    m.expanded.add(1);
    const rows = m.flatten();
    const onSelect = vi.fn();
    const onToggle = vi.fn();
    render(<TreeRows rows={rows} selected={1} onSelect={onSelect} onToggle={onToggle} onKeyDown={() => undefined} />);
    const drawn = screen.getByTestId("tree-rows").querySelectorAll<HTMLElement>(".tree-row");
    expect([...drawn].map((r) => r.textContent)).toEqual(["▾continuenode 1", "·continuenode 3", "▸retrynode 2"]);
    expect([...drawn].map((r) => r.style.transform)).toEqual(["translateY(0px)", "translateY(22px)", "translateY(44px)"]);
    expect(drawn[1].className).toBe("tree-row selected");
    expect(drawn[1].style.paddingLeft).toBe("24px"); // one level in
    fireEvent.click(drawn[2]);
    expect(onSelect).toHaveBeenCalledWith(2);
    fireEvent.click(screen.getAllByRole("button", { name: "collapse" })[0]);
    expect(onToggle).toHaveBeenCalledWith(1, true);
    expect(onSelect).toHaveBeenCalledTimes(1); // the twisty does not also select
  });
});

describe("TreeRows and path sampling", () => {
  it("marks a node whose generated tokens its step did not train", () => {
    const m = new TreeModel();
    const taken = (id: number, n: number | null): TreeNode => ({ ...node(id, null), taken: n });
    m.addChildren(ROOT, [taken(1, 4), taken(2, 0), taken(3, null)]);
    render(<TreeRows rows={m.flatten()} selected={0} onSelect={() => undefined} onToggle={() => undefined} onKeyDown={() => undefined} />);
    const drawn = screen.getByTestId("tree-rows").querySelectorAll<HTMLElement>(".tree-row");
    expect([...drawn].map((r) => r.classList.contains("untrained"))).toEqual([false, true, false]);
    expect(drawn[1].textContent).toContain("not trained");
    expect(drawn[0].textContent).not.toContain("not trained");
  });
});
