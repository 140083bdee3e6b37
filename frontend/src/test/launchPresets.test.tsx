// @vitest-environment jsdom
// The launch form's presets are the server's (/api/config/presets/, the configs of
// `configs/`), not a list in the bundle: choosing one fills the form from its config.
import { cleanup, fireEvent, render, screen } from "@testing-library/react";
import { MemoryRouter } from "react-router-dom";
import { afterEach, describe, expect, it, vi } from "vitest";
import { presetValues } from "../lib/config";
import { LaunchPage } from "../pages/LaunchPage";

const schema = {
  name: { type: "str", default: "demo", help: "" },
  steps: { type: "int", default: 8, help: "", min: 1 },
  "scheduler.policy": { type: "str", default: "elastic", help: "", choices: ["colocate", "async", "elastic"] },
};
const presets = {
  default: { name: "demo", steps: 8, scheduler: { policy: "elastic" } },
  presets: { "from-server": { name: "served", steps: 3, scheduler: { policy: "async" } } },
};
const bodies: Record<string, unknown> = {
  "/api/config/schema/": schema,
  "/api/config/presets/": presets,
  "/api/teams/": [],
  "/api/experiments/": [],
};

afterEach(() => {
  cleanup();
  vi.unstubAllGlobals();
});

describe("launch presets", () => {
  it("flattens each served config to form values", () => {
    expect(presetValues(presets)).toEqual({ "from-server": { name: "served", steps: "3", "scheduler.policy": "async" } });
  });

  it("lists the served presets and fills the form from the one chosen", async () => {
    vi.stubGlobal("fetch", async (url: string) => {
      const path = url.split("?")[0];
      const found = path in bodies;
      return { ok: found, status: found ? 200 : 404, text: async () => JSON.stringify(bodies[path] ?? {}) };
    });
    render(
      <MemoryRouter>
        <LaunchPage />
      </MemoryRouter>,
    );
    const option = await screen.findByRole("option", { name: "from-server" });
    expect(option).toBeTruthy();
    fireEvent.change(screen.getByLabelText("preset"), { target: { value: "from-server" } });
    expect((document.querySelector('input[name="steps"]') as HTMLInputElement).value).toBe("3");
    expect((document.querySelector('select[name="scheduler.policy"]') as HTMLSelectElement).value).toBe("async");
    expect((document.querySelector('input[name="name"]') as HTMLInputElement).value).toBe("served");
  });
});
