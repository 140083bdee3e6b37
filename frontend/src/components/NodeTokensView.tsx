// The tokens of one tree node: generated tokens highlighted, hover for logprob, version
// and advantage; token ids in brackets when the run has no tokenizer.

import { tokenCells, tokenSummary, type NodeTokens } from "../lib/nodeTokens";

const generatedStyle = { background: "#d9f2dd", borderBottom: "1px solid #3a9d4f" };

export function NodeTokensView({ tokens }: { tokens: NodeTokens }) {
  if (!tokens.payload) return <p className="muted">no token payload stored for this node</p>;
  const cells = tokenCells(tokens);
  return (
    <div data-testid="node-tokens">
      <div className="muted">
        {tokenSummary(tokens)}
        {tokens.decoded ? "" : " · token ids (no tokenizer)"}
      </div>
      <pre className="tokens">
        {cells.map((c) => (
          <span key={c.key} className={c.generated ? "tok generated" : "tok"} style={c.generated ? generatedStyle : undefined} title={c.title}>
            {c.text}
            {tokens.decoded ? "" : " "}
          </span>
        ))}
      </pre>
    </div>
  );
}
