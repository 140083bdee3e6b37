// @vitest-environment jsdom
import { cleanup, render, screen } from "@testing-library/react";
import { afterEach, describe, expect, it } from "vitest";
import { RoleTimelineView } from "../components/RoleTimelineView";
import { RolloutPanel } from "../components/RolloutPanel";
import { RoleTimeline } from "../lib/roles";
import { RolloutTracker } from "../lib/rollouts";
import { ev } from "./events";

afterEach(cleanup);

describe("RolloutPanel", () => {
  it("shows in-flight and finished counts, statuses and the duration histogram", () => {
    const t = new RolloutTracker();
    t.apply(ev("rollout_started", 0, { rollout_id: "a", task_id: "x", group_id: "g", step: 0 }));
    t.apply(ev("rollout_started", 0, { rollout_id: "b", task_id: "x", group_id: "g", step: 0 }));
    t.apply(ev("rollout_finished", 9, { rollout_id: "b", status: "timeout", progress: 0.4, reward: 0.4, turns: 2, tokens: 5 }));
    render(<RolloutPanel tracker={t} version={1} />);
    expect(screen.getByTestId("inflight-count").textContent).toBe("1");
    expect(screen.getByTestId("finished-count").textContent).toBe("1");
    expect(screen.getByText("timeout 1")).toBeTruthy();
    expect(screen.getByTestId("duration-histogram").children).toHaveLength(20);
  });
});

describe("RoleTimelineView", () => {
  it("draws one lane per unit once roles change, and says so before", () => {
    const tl = new RoleTimeline();
    const { rerender } = render(<RoleTimelineView timeline={tl} version={0} showShares={false} />);
    expect(screen.getByText("no role changes yet")).toBeTruthy();
    tl.apply(ev("role_change", 0, { unit: 0, gpus: [0], from_role: "idle", to_role: "rollout" }));
    tl.apply(ev("role_change", 1, { unit: 2, gpus: [1], from_role: "idle", to_role: "train" }));
    rerender(<RoleTimelineView timeline={tl} version={1} showShares={false} />);
    expect(screen.getByTestId("role-timeline").getAttribute("data-units")).toBe("2");
    expect(screen.getByTestId("role-timeline").querySelector("canvas.lanes")).not.toBeNull();
  });
});
