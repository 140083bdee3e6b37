// @vitest-environment jsdom
import { cleanup, render, screen } from "@testing-library/react";
import { afterEach, describe, expect, it } from "vitest";
import { NodeTokensView } from "../components/NodeTokensView";
import { TreeBrowser } from "../components/TreeBrowser";
import { tokenCells, tokenSummary, type NodeTokens } from "../lib/nodeTokens";
import { memoryTreeSource } from "../lib/treeSource";
import type { TreeInfo, TreeNode } from "../lib/types";

afterEach(cleanup);

const sample: NodeTokens = {
  node: 7,
  token_start: 10,
  token_end: 14,
  advantage: 0.5,
  payload: true,
  decoded: true,
  truncated: false,
  text: "fix the bug",
  ids: [5, 6, 7, 8],
  pieces: ["fix", " the", " b", "ug"],
  generated: [false, true, true, true],
  logprobs: [null, -0.25, -1.5, -0.125],
  versions: [null, 2, 3, 3],
  advantages: [null, 0.5, 0.5, 0.5],
};

describe("tokenCells", () => {
  it("marks generated tokens and puts logprob, version and advantage in the hover", () => {
    const cells = tokenCells(sample);
    expect(cells.map((c) => c.text)).toEqual(["fix", " the", " b", "ug"]);
    expect(cells.map((c) => c.generated)).toEqual([false, true, true, true]);
    expect(cells[0].title).toBe("id 5 · context");
    expect(cells[2].title).toBe("id 7 · generated · logprob -1.5000 · version 3 · advantage 0.500");
    expect(tokenSummary(sample)).toBe("4 tokens · 3 generated · versions 2–3 · advantage 0.500");
  });

  it("adds a token's scale to the hover where train.average makes it not 1", () => {
    const cells = tokenCells({ ...sample, scales: [null, 1, 0.25, 0.25] });
    expect(cells[1].title).not.toContain("scale");
    expect(cells[2].title).toBe("id 7 · generated · logprob -1.5000 · version 3 · advantage 0.500 · scale 0.2500");
  });

  it("shows ids when the run has no tokenizer", () => {
    const cells = tokenCells({ ...sample, decoded: false, pieces: null, text: null });
    expect(cells.map((c) => c.text)).toEqual(["[5]", "[6]", "[7]", "[8]"]);
  });
});

describe("NodeTokensView", () => {
  it("highlights generated tokens with a hover title", () => {
    render(<NodeTokensView tokens={sample} />);
    const spans = screen.getByTestId("node-tokens").querySelectorAll("span.tok");
    expect(spans).toHaveLength(4);
    expect(screen.getByTestId("node-tokens").querySelectorAll("span.tok.generated")).toHaveLength(3);
    expect(spans[1].getAttribute("title")).toContain("logprob -0.2500 · version 2");
  });

  it("says so when no payload holds the node", () => {
    render(<NodeTokensView tokens={{ ...sample, payload: false, ids: [] }} />);
    expect(screen.getByText("no token payload stored for this node")).toBeTruthy();
  });
});

describe("TreeBrowser node detail", () => {
  it("fetches the selected node's tokens and shows them", async () => {
    const node: TreeNode = {
      id: 7, parent: null, kind: "continue", depth: 0, path_key: "000", token_start: 10,
      token_end: 14, trainable: 3, preview: "fix the bug", advantage: 0.5, leaves: 1,
    };
    const info: TreeInfo = {
      id: 1, run: 1, group_id: "g", step: 0, rollouts: 1, nodes: 1, depth: 0, tokens_unique: 4,
      tokens_per_call: 4, dedup_ratio: 1, branch_counts: {},
    };
    const asked: number[] = [];
    const tokens = async (id: number) => {
      asked.push(id);
      return sample;
    };
    render(<TreeBrowser tree={info} source={memoryTreeSource([node])} tokens={tokens} />);
    const view = await screen.findByTestId("node-tokens");
    expect(asked).toEqual([7]);
    expect(view.querySelectorAll("span.tok.generated")).toHaveLength(3);
    expect(view.textContent).toContain("fix the bug");
  });
});
