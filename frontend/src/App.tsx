import { lazy, Suspense, useEffect, useState } from "react";
import { HashRouter, Navigate, NavLink, Route, Routes, useLocation, useParams } from "react-router-dom";
import { isSignedIn, listAll, logout } from "./lib/api";
import { WRITE_ROLES, type Team } from "./lib/types";
import { LoginPage } from "./pages/LoginPage";

// Pages load on first visit: the sign-in screen needs neither charts nor lists.
const BenchPage = lazy(() => import("./pages/BenchPage").then((m) => ({ default: m.BenchPage })));
const ClusterPage = lazy(() => import("./pages/ClusterPage").then((m) => ({ default: m.ClusterPage })));
const ComparePage = lazy(() => import("./pages/ComparePage").then((m) => ({ default: m.ComparePage })));
const LaunchPage = lazy(() => import("./pages/LaunchPage").then((m) => ({ default: m.LaunchPage })));
const RunsPage = lazy(() => import("./pages/RunsPage").then((m) => ({ default: m.RunsPage })));
const RunView = lazy(() => import("./pages/RunView").then((m) => ({ default: m.RunView })));
const SweepPage = lazy(() => import("./pages/SweepPage").then((m) => ({ default: m.SweepPage })));
const SharePage = lazy(() => import("./pages/SharePage").then((m) => ({ default: m.SharePage })));
const TeamPage = lazy(() => import("./pages/TeamPage").then((m) => ({ default: m.TeamPage })));

function RunRoute() {
  const { id = "" } = useParams();
  return <RunView key={id} runId={Number(id)} />;
}

function Shell() {
  const [signedIn, setSignedIn] = useState<boolean | null>(null);
  const location = useLocation();
  const shared = location.pathname.startsWith("/share/") || location.pathname === "/bench";
  // A viewer in every team can launch nothing: the Launch link is hidden from them.
  const [canLaunch, setCanLaunch] = useState(false);
  useEffect(() => {
    if (!shared) void isSignedIn().then(setSignedIn);
  }, [shared]);
  useEffect(() => {
    if (!signedIn) return;
    listAll<Team>("/api/teams/")
      .then((teams) => setCanLaunch(teams.some((t) => t.role !== null && WRITE_ROLES.includes(t.role))))
      .catch(() => undefined);
  }, [signedIn]);

  if (shared)
    return (
      <main>
        <Suspense fallback={<p>loading…</p>}>
          <Routes>
            <Route path="/share/:key" element={<SharePage />} />
            <Route path="/bench" element={<BenchPage />} />
          </Routes>
        </Suspense>
      </main>
    );
  if (signedIn === null) return <p>loading…</p>;
  if (!signedIn) return <LoginPage onDone={() => setSignedIn(true)} />;
  return (
    <>
      <nav>
        <b>Gyre</b>
        <NavLink to="/runs">Runs</NavLink>
        {canLaunch && <NavLink to="/launch">Launch</NavLink>}
        {canLaunch && <NavLink to="/sweep">Sweep</NavLink>}
        <NavLink to="/compare">Compare</NavLink>
        <NavLink to="/team">Team</NavLink>
        <NavLink to="/cluster">Cluster</NavLink>
        <button className="linkish" onClick={() => void logout().then(() => setSignedIn(false))}>
          sign out
        </button>
      </nav>
      <main>
        <Suspense fallback={<p>loading…</p>}>
          <Routes>
            <Route path="/" element={<Navigate to="/runs" replace />} />
            <Route path="/runs" element={<RunsPage />} />
            <Route path="/runs/:id" element={<RunRoute />} />
            <Route path="/launch" element={<LaunchPage />} />
            <Route path="/sweep" element={<SweepPage />} />
            <Route path="/compare" element={<ComparePage />} />
            <Route path="/team" element={<TeamPage />} />
            <Route path="/cluster" element={<ClusterPage />} />
            <Route path="*" element={<p>no such page</p>} />
          </Routes>
        </Suspense>
      </main>
    </>
  );
}

export function App() {
  return (
    <HashRouter>
      <Shell />
    </HashRouter>
  );
}
