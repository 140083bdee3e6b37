// Teams: members and roles, personal API tokens (secret shown once), share links,
// webhooks called when a run ends (with their delivery log), datasets.

import { useCallback, useEffect, useState } from "react";
import { DatasetsPanel } from "../components/DatasetsPanel";
import { api, listAll } from "../lib/api";
import { type Team, WRITE_ROLES } from "../lib/types";

interface Member {
  id: number;
  username: string;
  role: string;
}
interface Token {
  id: number;
  name: string;
  prefix: string;
  created_at: string;
  last_used_at: string | null;
  revoked_at: string | null;
  expires_at: string | null;
}
interface Link {
  id: number;
  team: number;
  experiment: number | null;
  run: number | null;
  prefix: string;
  revoked_at: string | null;
  expires_at: string | null;
}

// A token's or share link's expiry (the operator's lifetime, or one asked at creation).
function expiry(at: string | null): string {
  if (!at) return "no expiry";
  return `${new Date(at) < new Date() ? "expired" : "expires"} ${new Date(at).toLocaleString()}`;
}

interface Hook {
  id: number;
  team: number;
  name: string;
  url: string;
  events: string[];
}
interface Delivery {
  id: number;
  run: number;
  event: string;
  state: string;
  attempts: number;
  last_result: string;
  last_error: string;
  created_at: string;
}
const ENDINGS = ["succeeded", "failed", "cancelled"];

export function TeamPage() {
  const [teams, setTeams] = useState<Team[]>([]);
  const [team, setTeam] = useState<Team | null>(null);
  const [members, setMembers] = useState<Member[]>([]);
  const [tokens, setTokens] = useState<Token[]>([]);
  const [links, setLinks] = useState<Link[]>([]);
  const [hooks, setHooks] = useState<Hook[]>([]);
  const [deliveries, setDeliveries] = useState<Record<number, Delivery[]>>({});
  const [hookForm, setHookForm] = useState({ url: "", events: ["succeeded", "failed"] });
  const [secret, setSecret] = useState("");
  const [form, setForm] = useState({ username: "", role: "member", token: "", newTeam: "" });
  const [error, setError] = useState("");
  const guard = (p: Promise<unknown>) => p.catch((e) => setError(String(e)));

  const reload = useCallback(async () => {
    const ts = await listAll<Team>("/api/teams/");
    setTeams(ts);
    setTeam((cur) => ts.find((t) => t.id === cur?.id) ?? ts[0] ?? null);
    setTokens(await listAll<Token>("/api/tokens/"));
  }, []);

  useEffect(() => {
    void guard(reload());
  }, [reload]);

  useEffect(() => {
    if (!team) return;
    void guard(api<Member[]>(`/api/teams/${team.id}/members/`).then(setMembers));
    void guard(listAll<Link>(`/api/share-links/?team=${team.id}`).then(setLinks));
    void guard(loadHooks(team.id));
  }, [team]);

  async function loadHooks(teamId: number) {
    const mine = (await listAll<Hook>("/api/webhooks/")).filter((h) => h.team === teamId);
    setHooks(mine);
    const logs: Record<number, Delivery[]> = {};
    for (const h of mine) logs[h.id] = await api<Delivery[]>(`/api/webhooks/${h.id}/deliveries/`);
    setDeliveries(logs);
  }
  const addHook = async (e: React.FormEvent) => {
    e.preventDefault();
    if (!team) return;
    await guard(api("/api/webhooks/", { method: "POST", json: { team: team.id, ...hookForm } }));
    await guard(loadHooks(team.id));
  };
  const removeHook = async (id: number) => {
    await guard(api(`/api/webhooks/${id}/`, { method: "DELETE" }));
    if (team) await guard(loadHooks(team.id));
  };
  const toggleEnding = (ending: string) =>
    setHookForm((f) => ({
      ...f,
      events: f.events.includes(ending) ? f.events.filter((x) => x !== ending) : [...f.events, ending],
    }));

  const addMember = async (e: React.FormEvent) => {
    e.preventDefault();
    if (!team) return;
    await guard(api(`/api/teams/${team.id}/members/`, { method: "POST", json: { username: form.username, role: form.role } }));
    setMembers(await api<Member[]>(`/api/teams/${team.id}/members/`));
  };
  const removeMember = async (username: string) => {
    if (!team) return;
    await guard(api(`/api/teams/${team.id}/members/${encodeURIComponent(username)}/`, { method: "DELETE" }));
    setMembers(await api<Member[]>(`/api/teams/${team.id}/members/`));
  };
  const createToken = async (e: React.FormEvent) => {
    e.preventDefault();
    const t = await api<Token & { key: string }>("/api/tokens/", { method: "POST", json: { name: form.token || "token" } });
    setSecret(t.key);
    setTokens(await listAll<Token>("/api/tokens/"));
  };
  const revokeToken = async (id: number) => {
    await guard(api(`/api/tokens/${id}/`, { method: "DELETE" }));
    setTokens(await listAll<Token>("/api/tokens/"));
  };
  const revokeLink = async (id: number) => {
    await guard(api(`/api/share-links/${id}/`, { method: "DELETE" }));
    if (team) setLinks(await listAll<Link>(`/api/share-links/?team=${team.id}`));
  };
  const createTeam = async (e: React.FormEvent) => {
    e.preventDefault();
    await guard(api("/api/teams/", { method: "POST", json: { name: form.newTeam } }));
    await reload();
  };

  return (
    <div className="team-page">
      <h2>Teams</h2>
      {error && <p className="error">{error}</p>}
      <div className="filters">
        {teams.map((t) => (
          <button key={t.id} className={team?.id === t.id ? "active" : ""} onClick={() => setTeam(t)}>
            {t.name} ({t.role})
          </button>
        ))}
        <form onSubmit={createTeam}>
          <input placeholder="new team name" value={form.newTeam} onChange={(e) => setForm({ ...form, newTeam: e.target.value })} />
          <button disabled={!form.newTeam}>create team</button>
        </form>
      </div>
      {team && (
        <section>
          <h3>Members of {team.name}</h3>
          <table data-testid="members">
            <tbody>
              {members.map((m) => (
                <tr key={m.id}>
                  <td>{m.username}</td>
                  <td>{m.role}</td>
                  <td>
                    <button onClick={() => void removeMember(m.username)}>remove</button>
                  </td>
                </tr>
              ))}
            </tbody>
          </table>
          <form onSubmit={addMember}>
            <input placeholder="username" value={form.username} onChange={(e) => setForm({ ...form, username: e.target.value })} />
            <select value={form.role} onChange={(e) => setForm({ ...form, role: e.target.value })}>
              {["owner", "admin", "member", "viewer"].map((r) => (
                <option key={r}>{r}</option>
              ))}
            </select>
            <button>add or change role</button>
          </form>
          <h3>Share links</h3>
          <table data-testid="share-links">
            <tbody>
              {links.map((l) => (
                <tr key={l.id}>
                  <td>{l.run ? `run ${l.run}` : `experiment ${l.experiment}`}</td>
                  <td>{l.prefix}…</td>
                  <td>{expiry(l.expires_at)}</td>
                  <td>{l.revoked_at ? `revoked ${new Date(l.revoked_at).toLocaleString()}` : <button onClick={() => void revokeLink(l.id)}>revoke</button>}</td>
                </tr>
              ))}
            </tbody>
          </table>
          <p className="muted">create a share link from a run's page</p>
          <h3>Webhooks</h3>
          <p className="muted">called with a JSON body (Slack-compatible) when one of the team's runs ends</p>
          <table data-testid="webhooks">
            <tbody>
              {hooks.map((h) => (
                <tr key={h.id}>
                  <td>{h.url}</td>
                  <td>{h.events.join(", ")}</td>
                  <td>
                    {(deliveries[h.id] ?? []).slice(0, 5).map((d) => (
                      <div key={d.id} className="delivery">
                        run {d.run} {d.event}: {d.state} after {d.attempts} attempt{d.attempts === 1 ? "" : "s"}
                        {d.last_result ? ` (${d.last_result}${d.last_error ? `: ${d.last_error}` : ""})` : ""}
                      </div>
                    ))}
                  </td>
                  <td>
                    <button onClick={() => void removeHook(h.id)}>remove</button>
                  </td>
                </tr>
              ))}
            </tbody>
          </table>
          <form onSubmit={addHook}>
            <input placeholder="webhook URL" value={hookForm.url} onChange={(e) => setHookForm({ ...hookForm, url: e.target.value })} />
            {ENDINGS.map((ending) => (
              <label key={ending}>
                <input type="checkbox" checked={hookForm.events.includes(ending)} onChange={() => toggleEnding(ending)} /> {ending}
              </label>
            ))}
            <button disabled={!hookForm.url || hookForm.events.length === 0}>add webhook</button>
            <button type="button" onClick={() => team && void guard(loadHooks(team.id))}>
              refresh deliveries
            </button>
          </form>
          <DatasetsPanel key={team.id} teamId={team.id} canWrite={WRITE_ROLES.includes(team.role ?? "")} />
        </section>
      )}
      <section>
        <h3>Your API tokens</h3>
        {secret && (
          <p className="note" data-testid="token-secret">
            new token (copy it now, it is not shown again): <code>{secret}</code>
          </p>
        )}
        <table data-testid="tokens">
          <tbody>
            {tokens.map((t) => (
              <tr key={t.id}>
                <td>{t.name}</td>
                <td>{t.prefix}…</td>
                <td>{expiry(t.expires_at)}</td>
                <td>{t.last_used_at ? `used ${new Date(t.last_used_at).toLocaleString()}` : "never used"}</td>
                <td>{t.revoked_at ? "revoked" : <button onClick={() => void revokeToken(t.id)}>revoke</button>}</td>
              </tr>
            ))}
          </tbody>
        </table>
        <form onSubmit={createToken}>
          <input placeholder="token name" value={form.token} onChange={(e) => setForm({ ...form, token: e.target.value })} />
          <button>create token</button>
        </form>
      </section>
    </div>
  );
}
