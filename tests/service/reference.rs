//! The generated references in `docs/reference/` are what the code says: the command line
//! reference is every verb's `--help` (clap), and the configuration reference is every key
//! of `delayq serve`'s file as `src/service/config/raw.rs` declares it (its doc comments
//! and types: the one place the file's keys are described today). Each test fails when the
//! committed file differs; `DELAYQ_UPDATE_DOCS=1 cargo test --test service reference::`
//! rewrites them.
#![allow(clippy::unwrap_used)]

use crate::support::serve::BIN;
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Compares `text` with the committed `path` (relative to the repository), or rewrites it
/// when `DELAYQ_UPDATE_DOCS=1`.
fn check_generated(path: &str, text: &str) {
    let file: PathBuf = repo().join(path);
    if std::env::var("DELAYQ_UPDATE_DOCS").as_deref() == Ok("1") {
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, text).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(&file).unwrap_or_default();
    if committed != text {
        let first = committed
            .lines()
            .zip(text.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| committed.lines().count().min(text.lines().count()));
        panic!(
            "{path} is not what the code generates (first difference at line {}: committed {:?}, generated {:?}); \
             run `DELAYQ_UPDATE_DOCS=1 cargo test --test service reference::` and commit the result",
            first + 1,
            committed.lines().nth(first),
            text.lines().nth(first)
        );
    }
}

/// `delayq <verb...> --help`, with no `DELAYQ_*` variable that could show in it.
fn help(verb: &[&str]) -> String {
    let mut cmd = Command::new(BIN);
    cmd.args(verb).arg("--help");
    for (k, _) in std::env::vars() {
        if k.starts_with("DELAYQ_") {
            cmd.env_remove(k);
        }
    }
    let o = cmd
        .env("NO_COLOR", "1")
        .env("COLUMNS", "100")
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "delayq {} --help failed",
        verb.join(" ")
    );
    String::from_utf8(o.stdout).unwrap()
}

/// The sub-verbs a help text lists under `Commands:` (without `help`).
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| l.trim() != "Commands:")
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_owned)
        .collect()
}

fn cli_reference() -> String {
    let mut out = String::from(
        "# Command line reference\n\n\
         <!-- Generated from the code (clap) by tests/service/reference.rs; do not edit. \
         Regenerate: DELAYQ_UPDATE_DOCS=1 cargo test --test service reference:: -->\n\n\
         Every verb's `--help`, as this build prints it. Each result is one JSON line on \
         stdout; exit codes: 0 ok, 1 not found, 2 invalid input (nothing written), 3 Redis \
         or runtime failure (`delayq healthcheck`: 0 healthy, 1 anything else). The global \
         options (`--redis-url`, `--namespace`, `--redis-tls-*`) apply to every verb.\n",
    );
    let mut todo: Vec<Vec<String>> = vec![vec![]];
    while let Some(verb) = todo.pop() {
        let args: Vec<&str> = verb.iter().map(String::as_str).collect();
        let text = help(&args);
        let name = if verb.is_empty() {
            "delayq".to_owned()
        } else {
            format!("delayq {}", verb.join(" "))
        };
        out.push_str(&format!(
            "\n## `{name}`\n\n```text\n{}\n```\n",
            text.trim_end()
        ));
        // Depth first, in the order clap lists them.
        for sub in subcommands(&text).into_iter().rev() {
            let mut v = verb.clone();
            v.push(sub);
            todo.push(v);
        }
    }
    out
}

#[test]
fn the_cli_reference_is_what_clap_prints() {
    let text = cli_reference();
    for verb in [
        "schedule",
        "serve",
        "healthcheck",
        "queue create",
        "dead replay",
    ] {
        assert!(
            text.contains(&format!("## `delayq {verb}`")),
            "{verb} missing"
        );
    }
    check_generated("docs/reference/cli.md", &text);
}

/// One field of a config struct: name, Rust type, doc text.
struct Field {
    name: String,
    ty: String,
    doc: String,
}

/// Every `pub struct` of `raw.rs` with its doc text and its `pub` fields.
fn parse_structs(src: &str) -> Vec<(String, String, Vec<Field>)> {
    let mut structs = Vec::new();
    let mut doc: Vec<String> = Vec::new();
    let mut current: Option<(String, String, Vec<Field>)> = None;
    for line in src.lines() {
        let t = line.trim();
        if let Some(d) = t.strip_prefix("///") {
            doc.push(d.trim().to_owned());
        } else if t.starts_with("#[") {
            // Attributes sit between a doc comment and its item.
        } else if let Some(rest) = t.strip_prefix("pub struct ") {
            let name = rest.split_whitespace().next().unwrap().to_owned();
            current = Some((name, doc.join(" "), Vec::new()));
            doc.clear();
        } else if t == "}" {
            if let Some(s) = current.take() {
                structs.push(s);
            }
            doc.clear();
        } else if let (Some((_, _, fields)), Some(rest)) =
            (current.as_mut(), t.strip_prefix("pub "))
        {
            let (name, ty) = rest.split_once(':').unwrap();
            fields.push(Field {
                name: name.trim().to_owned(),
                ty: ty.trim().trim_end_matches(',').to_owned(),
                doc: doc.join(" "),
            });
            doc.clear();
        } else {
            doc.clear();
        }
    }
    structs
}

/// The TOML type of a Rust field type, and whether the key may be left out.
fn toml_type(ty: &str) -> String {
    let inner = ty
        .strip_prefix("Option<")
        .and_then(|t| t.strip_suffix('>'))
        .unwrap_or(ty);
    match inner {
        "String" => "string".into(),
        "bool" => "boolean".into(),
        "usize" | "u64" | "u32" | "u16" => "integer".into(),
        "Vec<String>" => "array of strings".into(),
        "Vec<u32>" => "array of integers".into(),
        "serde_json::Value" => "any value".into(),
        "DispatchConfig" => "`\"all\"`, `\"none\"` or array of strings".into(),
        "Secrets" => "string or array of strings".into(),
        other if other.starts_with("Vec<") => "array of tables".into(),
        _ => "table".into(),
    }
}

/// Markdown-safe text of a doc comment (rustdoc links reduced to their text).
fn doc_text(doc: &str) -> String {
    let mut s = doc.replace('|', "\\|");
    while let Some(start) = s.find("](crate::") {
        let end = s[start..].find(')').map_or(s.len(), |e| start + e + 1);
        s.replace_range(start + 1..end, "");
    }
    s.replace("[`", "`").replace("`]", "`")
}

fn config_reference() -> String {
    let src = std::fs::read_to_string(repo().join("src/service/config/raw.rs")).unwrap();
    let structs = parse_structs(&src);
    let find = |name: &str| structs.iter().find(|(n, _, _)| n == name);
    let (_, _, top) = find("Config").expect("struct Config in raw.rs");
    let mut out = String::from(
        "# Configuration reference (`delayq serve`)\n\n\
         <!-- Generated from src/service/config/raw.rs by tests/service/reference.rs; do not \
         edit. Regenerate: DELAYQ_UPDATE_DOCS=1 cargo test --test service reference:: -->\n\n\
         Every key of `delayq serve --config FILE` (TOML), generated from the configuration's \
         types and their doc comments in `src/service/config/raw.rs`, which are today the one \
         place the file's keys are described. Defaults are as those comments state them; the \
         ranges are checked where the values are defined (the library's option types) and a \
         bad value exits 2 naming the key.\n\n\
         **Environment:** every key can be overridden with `DELAYQ_<KEY>`, nested keys with \
         `__` (`DELAYQ_HTTP__LISTEN`); an array of tables (`[[handlers]]`, `[[schedules]]`) is \
         set whole (`DELAYQ_HANDLERS='[{...}]'`). Values are TOML \
         (`DELAYQ_HTTP__TOKENS='[\"a-long-token\"]'`). Only the file's own top-level keys are \
         read; other `DELAYQ_*` variables are left alone.\n",
    );
    let mut section = |title: &str, env_prefix: Option<&str>, fields: &[Field], doc: &str| {
        out.push_str(&format!("\n## {title}\n\n"));
        if !doc.is_empty() {
            out.push_str(&format!("{}\n\n", doc_text(doc)));
        }
        out.push_str("| key | type | environment | meaning |\n|---|---|---|---|\n");
        for f in fields {
            let env = env_prefix.map_or_else(
                || "(the whole array)".to_owned(),
                |p| format!("`{p}{}`", f.name.to_uppercase()),
            );
            out.push_str(&format!(
                "| `{}` | {} | {env} | {} |\n",
                f.name,
                toml_type(&f.ty),
                doc_text(&f.doc)
            ));
        }
    };
    let is_struct = |ty: &str| {
        let base = ty
            .strip_prefix("Vec<")
            .and_then(|t| t.strip_suffix('>'))
            .unwrap_or(ty);
        find(base).map(|s| (ty.starts_with("Vec<"), s))
    };
    let plain: Vec<Field> = top
        .iter()
        .filter(|f| is_struct(&f.ty).is_none())
        .map(|f| Field {
            name: f.name.clone(),
            ty: f.ty.clone(),
            doc: f.doc.clone(),
        })
        .collect();
    section("Top level", Some("DELAYQ_"), &plain, "");
    for f in top {
        if let Some((array, (_, sdoc, fields))) = is_struct(&f.ty) {
            let (title, env) = if array {
                (format!("`[[{}]]`", f.name), None::<String>)
            } else {
                (
                    format!("`[{}]`", f.name),
                    Some(format!("DELAYQ_{}__", f.name.to_uppercase())),
                )
            };
            let doc = if array {
                format!(
                    "{} Environment: `DELAYQ_{}` replaces the whole array.",
                    sdoc,
                    f.name.to_uppercase()
                )
            } else {
                sdoc.clone()
            };
            section(&title, env.as_deref(), fields, &doc);
        }
    }
    out
}

#[test]
fn the_config_reference_is_what_the_config_types_declare() {
    let text = config_reference();
    // Every top-level key serve reads is documented, and the handlers' keys are.
    for key in delayq::service::config::raw::TOP_LEVEL_KEYS {
        assert!(
            text.contains(&format!("| `{key}` |"))
                || text.contains(&format!("`[{key}]`"))
                || text.contains(&format!("`[[{key}]]`")),
            "{key} missing from the config reference"
        );
    }
    assert!(text.contains("| `visibility_timeout` | string |"));
    check_generated("docs/reference/config.md", &text);
}
