import { StrictMode } from "react";
import { createRoot } from "react-dom/client";
import { App } from "./App";
import "./styles.css";

// A share link may arrive as /share/<key> (server route) or /#/share/<key>: use the hash.
const m = window.location.pathname.match(/^\/share\/([^/]+)\/?$/);
if (m) window.history.replaceState(null, "", `/#/share/${m[1]}`);

createRoot(document.getElementById("root")!).render(
  <StrictMode>
    <App />
  </StrictMode>,
);
