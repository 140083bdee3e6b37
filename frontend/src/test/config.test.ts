import { describe, expect, it } from "vitest";
import { apiErrors, buildConfig, defaults, flattenConfig, groups, parseField } from "../lib/config";
import type { ConfigSchema } from "../lib/types";

const schema: ConfigSchema = {
  name: { type: "str", default: "demo", help: "" },
  steps: { type: "int", default: 8, help: "", min: 1 },
  "scheduler.policy": { type: "str", default: "elastic", help: "", choices: ["colocate", "async", "elastic"] },
  "train.lr": { type: "float", default: 0.0003, help: "", above: 0 },
};

describe("config form", () => {
  it("groups fields by section and fills the defaults", () => {
    expect(groups(schema).map(([s]) => s)).toEqual(["run", "scheduler", "train"]);
    expect(defaults(schema)).toMatchObject({ steps: "8", "scheduler.policy": "elastic" });
  });

  it("parses typed values and explains bad ones", () => {
    expect(parseField(schema.steps, "12")).toEqual({ value: 12 });
    expect(parseField(schema.steps, "0").error).toBe("must be at least 1");
    expect(parseField(schema.steps, "1.5").error).toBe("must be a whole number");
    expect(parseField(schema.steps, "ten").error).toMatch(/not a number/);
    expect(parseField(schema["train.lr"], "0").error).toBe("must be more than 0");
    expect(parseField(schema["train.lr"], "0.001")).toEqual({ value: 0.001 });
    expect(parseField(schema["scheduler.policy"], "fifo").error).toBe("one of colocate, async, elastic");
  });

  it("builds the nested config and round-trips through flattenConfig", () => {
    const { config, errors } = buildConfig(schema, { ...defaults(schema), "train.lr": "0.01" });
    expect(errors).toEqual({});
    expect(config).toEqual({ name: "demo", steps: 8, scheduler: { policy: "elastic" }, train: { lr: 0.01 } });
    expect(flattenConfig(config)).toMatchObject({ "train.lr": "0.01", "scheduler.policy": "elastic" });
  });

  it("maps the API's 400 body onto fields", () => {
    expect(apiErrors({ config: { "sim.rollouts": ["fewer than one step"] }, experiment: ["required"] })).toEqual({
      "sim.rollouts": ["fewer than one step"],
      experiment: ["required"],
    });
    expect(apiErrors({ detail: "your role in this team (viewer) cannot do this" })).toEqual({
      _form: ["your role in this team (viewer) cannot do this"],
    });
  });
});
