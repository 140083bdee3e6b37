// Per-token detail of one tree node (GET /api/trees/{id}/nodes/{node_id}/tokens/): token ids,
// their text when the run has a tokenizer, and per token whether it was generated, its
// log-probability, the policy version that produced it, its advantage and its scale (the
// factor train.average puts on its loss: 1 unless the run averages per execution first).

import { api } from "./api";

export interface NodeTokens {
  node: number;
  token_start: number;
  token_end: number;
  advantage: number | null;
  payload: boolean; // false: no readable payload file holds this node
  decoded: boolean;
  truncated: boolean;
  text: string | null;
  ids: number[];
  pieces: string[] | null;
  generated: boolean[];
  logprobs: (number | null)[];
  versions: (number | null)[];
  advantages: (number | null)[];
  scales?: (number | null)[];
}

export type NodeTokensSource = (nodeId: number) => Promise<NodeTokens>;

export function apiNodeTokens(treeId: number): NodeTokensSource {
  return (nodeId) => api<NodeTokens>(`/api/trees/${treeId}/nodes/${nodeId}/tokens/`);
}

export interface TokenCell {
  key: number;
  text: string; // the decoded piece, or the id in brackets without a tokenizer
  generated: boolean;
  title: string; // what a hover shows
}

const fixed = (x: number | null | undefined, digits: number) => (x === null || x === undefined ? "—" : x.toFixed(digits));

/** One cell per token, in order; generated tokens carry logprob, version and advantage,
 * and their scale where it is not 1 (the loss counts advantage × scale). */
export function tokenCells(t: NodeTokens): TokenCell[] {
  return t.ids.map((id, i) => {
    const generated = t.generated[i] ?? false;
    const scale = t.scales?.[i];
    const scaled = scale === null || scale === undefined || scale === 1 ? "" : ` · scale ${scale.toPrecision(4)}`;
    const title = generated
      ? `id ${id} · generated · logprob ${fixed(t.logprobs[i], 4)} · version ${t.versions[i] ?? "—"} · advantage ${fixed(t.advantages[i], 3)}${scaled}`
      : `id ${id} · context`;
    return { key: i, text: t.pieces ? t.pieces[i] : `[${id}]`, generated, title };
  });
}

/** A one-line summary: how many tokens, how many generated, from which versions. */
export function tokenSummary(t: NodeTokens): string {
  const gen = t.generated.filter(Boolean).length;
  const versions = t.versions.filter((v): v is number => v !== null);
  const span = versions.length ? ` · versions ${Math.min(...versions)}–${Math.max(...versions)}` : "";
  const cut = t.truncated ? " (first part)" : "";
  const adv = t.advantage === null ? "" : ` · advantage ${t.advantage.toFixed(3)}`;
  return `${t.ids.length} tokens${cut} · ${gen} generated${span}${adv}`;
}
