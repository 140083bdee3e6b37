// Signed-in or not comes from /api/auth/session/, which answers 200 either way: the
// signed-out landing page makes no failing request.
import { afterEach, describe, expect, it, vi } from "vitest";
import { isSignedIn } from "../lib/api";

afterEach(() => vi.unstubAllGlobals());

function serve(status: number, body: unknown) {
  const calls: string[] = [];
  vi.stubGlobal("fetch", async (url: string) => {
    calls.push(url);
    return { ok: status < 300, status, text: async () => JSON.stringify(body) };
  });
  return calls;
}

describe("isSignedIn", () => {
  it("reads the session's answer", async () => {
    const calls = serve(200, { authenticated: false, username: null, staff: false });
    expect(await isSignedIn()).toBe(false);
    expect(calls).toEqual(["/api/auth/session/"]);
    serve(200, { authenticated: true, username: "ada", staff: false });
    expect(await isSignedIn()).toBe(true);
  });

  it("treats refused credentials as signed out", async () => {
    serve(401, { detail: "unknown or revoked share link" });
    expect(await isSignedIn()).toBe(false);
  });
});
