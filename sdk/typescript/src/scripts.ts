// The Lua scripts of the repository's `lua/` folder, vendored into this package as files
// (lua/<name>.lua) and run by SHA (EVALSHA), loaded again when Redis answers NOSCRIPT.

import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";

/** The scripts this package runs. */
export const SCRIPT_NAMES = ["enqueue", "cancel", "reschedule", "get", "tag_bulk", "order_rules"] as const;
export type ScriptName = (typeof SCRIPT_NAMES)[number];

export interface Script {
  name: ScriptName;
  /** The exact text of lua/<name>.lua. */
  source: string;
  /** Its SHA1, as `SCRIPT LOAD` answers it. */
  sha: string;
}

/** The folder holding the vendored scripts. */
export const LUA_DIR = fileURLToPath(new URL("../lua/", import.meta.url));

function load(name: ScriptName): Script {
  const source = readFileSync(new URL(`../lua/${name}.lua`, import.meta.url), "utf8");
  return { name, source, sha: createHash("sha1").update(source, "utf8").digest("hex") };
}

export const SCRIPTS: Record<ScriptName, Script> = {
  enqueue: load("enqueue"),
  cancel: load("cancel"),
  reschedule: load("reschedule"),
  get: load("get"),
  tag_bulk: load("tag_bulk"),
  order_rules: load("order_rules"),
};

/** True when `e` is Redis's NOSCRIPT answer (the script is not in its cache). */
export function isNoScript(e: unknown): boolean {
  return String((e as Error | undefined)?.message ?? "").startsWith("NOSCRIPT");
}
