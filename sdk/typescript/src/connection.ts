// Redis URLs and connections: one server (`redis://`, `rediss://`) or a cluster
// (`redis+cluster://host:port,host:port`, `rediss+cluster://`), as the Rust `RedisTarget`.

import { Cluster, Redis, type ClusterOptions, type RedisOptions } from "ioredis";
import { InvalidInputError, RedisError, ReplyError } from "./errors.js";
import type { Script } from "./scripts.js";

export type Conn = Redis | Cluster;

export type Target =
  | { cluster: false; options: RedisOptions }
  | { cluster: true; nodes: { host: string; port: number }[]; options: RedisOptions };

const bad = (reason: string) => new InvalidInputError("invalid_redis_url", `invalid redis url: ${reason}`);

function hostPort(text: string, tls: boolean): { host: string; port: number } {
  let u: URL;
  try {
    u = new URL(`${tls ? "rediss" : "redis"}://${text}`);
  } catch {
    throw bad("a host is not host:port");
  }
  if (!u.hostname || u.username || u.password || (u.pathname !== "" && u.pathname !== "/")) {
    throw bad("a host is not host:port");
  }
  return { host: u.hostname.replace(/^\[|\]$/g, ""), port: u.port ? Number(u.port) : 6379 };
}

function auth(user: string, pass: string): RedisOptions {
  const o: RedisOptions = {};
  try {
    if (user) o.username = decodeURIComponent(user);
    if (pass) o.password = decodeURIComponent(pass);
  } catch {
    throw bad("the credentials are not URL-encoded correctly");
  }
  return o;
}

/** Parses a Redis URL. Error messages never repeat the URL (it may hold a password). */
export function parseRedisUrl(url: string): Target {
  if (typeof url !== "string" || url === "") throw bad("empty");
  for (const [scheme, tls] of [
    ["redis+cluster://", false],
    ["rediss+cluster://", true],
  ] as const) {
    if (url.startsWith(scheme)) {
      const rest = url.slice(scheme.length);
      const at = rest.lastIndexOf("@");
      const creds = at >= 0 ? rest.slice(0, at) : "";
      const hosts = (at >= 0 ? rest.slice(at + 1) : rest).replace(/\/+$/, "");
      const nodes = hosts
        .split(",")
        .map((h) => h.trim())
        .filter((h) => h !== "")
        .map((h) => hostPort(h, tls));
      if (nodes.length === 0) throw bad("a cluster URL needs at least one host:port");
      const colon = creds.indexOf(":");
      const options = {
        ...(colon >= 0 ? auth(creds.slice(0, colon), creds.slice(colon + 1)) : auth(creds, "")),
        ...(tls ? { tls: {} } : {}),
      };
      return { cluster: true, nodes, options };
    }
  }
  let u: URL;
  try {
    u = new URL(url);
  } catch {
    throw bad("not a URL (redis://[user:pass@]host:port[/db], rediss:// or redis+cluster://h1:p1,h2:p2)");
  }
  if (u.protocol !== "redis:" && u.protocol !== "rediss:") {
    throw bad("the scheme must be redis://, rediss://, redis+cluster:// or rediss+cluster://");
  }
  if (!u.hostname) throw bad("no host");
  const options: RedisOptions = {
    host: u.hostname.replace(/^\[|\]$/g, ""),
    port: u.port ? Number(u.port) : 6379,
    ...auth(u.username, u.password),
  };
  const db = u.pathname.replace(/^\//, "");
  if (db !== "") {
    if (!/^[0-9]+$/.test(db)) throw bad("the database must be a number");
    options.db = Number(db);
  }
  if (u.protocol === "rediss:") options.tls = { servername: options.host as string };
  return { cluster: false, options };
}

export interface ConnSettings {
  connectTimeoutMs: number;
  responseTimeoutMs: number;
}

/** Opens a connection (and waits until it is ready). */
export async function openConn(target: Target, s: ConnSettings): Promise<Conn> {
  const common: RedisOptions = {
    lazyConnect: true,
    connectTimeout: s.connectTimeoutMs,
    commandTimeout: s.responseTimeoutMs,
    // A command in flight when a connection breaks fails (its outcome is unknown) instead
    // of being sent again on the next connection.
    autoResendUnfulfilledCommands: false,
    maxRetriesPerRequest: 3,
  };
  let conn: Conn;
  if (target.cluster) {
    const opts: ClusterOptions = {
      lazyConnect: true,
      redisOptions: { ...common, ...target.options, lazyConnect: false },
      clusterRetryStrategy: (times) => Math.min(100 * times, 2000),
      slotsRefreshTimeout: s.connectTimeoutMs,
    };
    conn = new Cluster(target.nodes, opts);
  } else {
    conn = new Redis({ ...common, ...target.options });
  }
  // Errors are reported to the calls that meet them; without a listener ioredis would
  // print each reconnection attempt.
  conn.on("error", () => {});
  try {
    await conn.connect();
  } catch (e) {
    conn.disconnect();
    throw new RedisError("connecting", e);
  }
  return conn;
}

/** Loads `script` into the cache of every server that may run it. */
export async function loadScript(conn: Conn, script: Script): Promise<void> {
  const shas = (
    conn instanceof Cluster
      ? await Promise.all(conn.nodes("master").map((n) => n.script("LOAD", script.source)))
      : [await conn.script("LOAD", script.source)]
  ) as unknown[];
  // The server names a script by the SHA1 of its text: EVALSHA would never find it otherwise.
  for (const sha of shas) {
    if (sha !== script.sha) {
      throw new ReplyError(`loading ${script.name}.lua`, `the server answered SHA ${String(sha)}, not ${script.sha}`);
    }
  }
}
