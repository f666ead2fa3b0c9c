// The vendored scripts are the repository's: lua/<name>.lua, and what the binary runs
// (`delayq scripts export DIR`, with the SHA1s it prints); the package's version is the crate's.

import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { mkdtempSync, readFileSync, readdirSync, rmSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { test } from "node:test";
import { SCRIPTS, SCRIPT_NAMES } from "../dist/index.js";
import { BIN, PKG_DIR, REPO, delayq } from "./support/harness.js";

const sha1 = (file) => createHash("sha1").update(readFileSync(file)).digest("hex");
const vendored = (name) => path.join(PKG_DIR, "lua", `${name}.lua`);

test("drift: every vendored script is the repository's lua/<name>.lua with the includes its header names after the header", { timeout: 90_000 }, () => {
  assert.deepEqual(
    readdirSync(path.join(PKG_DIR, "lua")).sort(),
    SCRIPT_NAMES.map((n) => `${n}.lua`).sort(),
    "the package vendors exactly the scripts it runs",
  );
  const incDir = path.join(REPO, "lua", "include");
  const includes = readdirSync(incDir).filter((f) => f.endsWith(".lua")).map((f) => readFileSync(path.join(incDir, f), "utf8"));
  for (const name of SCRIPT_NAMES) {
    // A read-only script's flags line (`#!lua flags=no-writes`, unknown to Redis 6.2) is
    // not in the export, which runs on every supported server.
    const repo = readFileSync(path.join(REPO, "lua", `${name}.lua`), "utf8").replace(/^#![^\n]*\n/, "");
    const lines = repo.split(/(?<=\n)/);
    let n = 0;
    while (n < lines.length && lines[n].startsWith("--")) n += 1;
    const header = lines.slice(0, n).join("");
    const body = lines.slice(n).join("");
    const copy = readFileSync(vendored(name), "utf8");
    const hint = `sdk/typescript/lua/${name}.lua differs from lua/${name}.lua: export it again (delayq scripts export DIR)`;
    // The engine puts the includes the header names (`-- @include a, b`: lua/include/<a>.lua)
    // after the header: the copy is the repo's header, those includes, then its body.
    assert.ok(copy.startsWith(header) && copy.endsWith(body), hint);
    let middle = copy.slice(header.length, copy.length - body.length);
    for (const line of header.split("\n").filter((l) => l.startsWith("-- @include "))) {
      for (const inc of line.slice("-- @include ".length).split(",").map((x) => x.trim())) {
        const text = readFileSync(path.join(incDir, `${inc}.lua`), "utf8");
        assert.equal(middle.split(text).length, 2, `${name}.lua: include ${inc} is not in it once`);
      }
    }
    for (const text of includes) middle = middle.replace(text, "");
    assert.equal(middle.replace(/\n/g, ""), "", hint);
    assert.equal(SCRIPTS[name].sha, sha1(vendored(name)), `the SHA the client sends for ${name}.lua`);
  }
});

// Issue 40: each script the client runs with shard keys takes one KEYS arity, and the
// client passes exactly that many (a call with another count is refused before any write).
const ARITY = { enqueue: 10, cancel: 8, get: 4, reschedule: 5, tag_bulk: 8 };

test("drift: each vendored script with shard keys takes one KEYS arity, none optional", () => {
  for (const [name, n] of Object.entries(ARITY)) {
    const text = readFileSync(vendored(name), "utf8");
    const header = [];
    for (const line of text.split("\n")) {
      if (line.startsWith("#!")) continue;
      if (!line.startsWith("--")) break;
      header.push(line);
    }
    const keys = header.filter((l) => l.startsWith("-- KEYS["));
    assert.ok(keys.length > 0 && !keys.some((l) => l.includes("optional")), `${name}.lua: an optional key`);
    assert.ok(keys.some((l) => l.startsWith(`-- KEYS[${n}]`) || l.includes(`, KEYS[${n}]`)), `${name}.lua: KEYS[${n}] documented`);
    assert.ok(text.includes(`Always all ${n} KEYS`), `${name}.lua: its header states the arity`);
    assert.ok(
      text.includes(`if #KEYS ~= ${n} then return redis.error_reply('ERR delayq ${name}: ${n} KEYS expected') end`),
      `${name}.lua: refuses any other count`,
    );
  }
});

test("drift: every vendored script is what `delayq scripts export` writes", { timeout: 90_000 }, async () => {
  const dir = mkdtempSync(path.join(os.tmpdir(), "delayq-ts-export-"));
  try {
    const r = await delayq(["scripts", "export", dir]);
    assert.equal(r.code, 0, `${BIN} scripts export failed: ${r.stderr}`);
    // One {"script","sha1","bytes"} line per script: the SHA1 EVALSHA takes.
    const listed = new Map(r.stdout.trim().split("\n").map((l) => JSON.parse(l)).map((x) => [x.script, x]));
    for (const name of SCRIPT_NAMES) {
      const file = path.join(dir, `${name}.lua`);
      assert.equal(sha1(vendored(name)), sha1(file), `sdk/typescript/lua/${name}.lua differs from the binary's ${name}.lua`);
      assert.equal(listed.get(name)?.sha1, SCRIPTS[name].sha, `the binary runs ${name}.lua under another SHA1`);
      assert.equal(listed.get(name)?.bytes, readFileSync(vendored(name)).length);
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("the package's version is the crate's", { timeout: 90_000 }, () => {
  const cargo = readFileSync(path.join(REPO, "Cargo.toml"), "utf8");
  const pkgSection = /\[package\]([\s\S]*?)(\n\[|$)/.exec(cargo)[1];
  const crate = /^version\s*=\s*"([^"]+)"/m.exec(pkgSection)[1];
  const pkg = JSON.parse(readFileSync(path.join(PKG_DIR, "package.json"), "utf8"));
  assert.equal(pkg.version, crate, "sdk/typescript/package.json version != Cargo.toml version");
  const lock = JSON.parse(readFileSync(path.join(PKG_DIR, "package-lock.json"), "utf8"));
  assert.equal(lock.version, crate, "package-lock.json is out of date (npm install)");
  assert.equal(lock.packages[""].version, crate);
  // Dependencies come from the npm registry only.
  for (const [name, p] of Object.entries(lock.packages)) {
    if (p.resolved !== undefined) {
      assert.ok(p.resolved.startsWith("https://registry.npmjs.org/"), `${name} resolved outside the npm registry`);
    }
    if (name !== "") assert.ok(p.integrity, `${name} has no integrity hash`);
  }
});
