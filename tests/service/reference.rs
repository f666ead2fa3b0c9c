//! The generated references in `docs/reference/` are what the code says: the command line
//! reference is every verb's `--help` (clap), and the configuration reference is every key
//! of `delayq serve`'s file as `src/service/config/raw.rs` and the library option types it
//! embeds declare it (their doc comments and types: the one place each key is described).
//! Each test fails when the committed file differs; `DELAYQ_UPDATE_DOCS=1 cargo test --test
//! service reference::` rewrites them.
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

/// One field of a config struct: name, Rust type, doc text, and its attributes' text
/// (`#[serde(default)]` ...).
#[derive(Clone)]
struct Field {
    name: String,
    ty: String,
    doc: String,
    attrs: String,
}

/// Every `pub struct` of `raw.rs` with its doc text and its `pub` fields.
fn parse_structs(src: &str) -> Vec<(String, String, Vec<Field>)> {
    let mut structs = Vec::new();
    let mut doc: Vec<String> = Vec::new();
    let mut current: Option<(String, String, Vec<Field>)> = None;
    let mut attrs = String::new();
    for line in src.lines() {
        let t = line.trim();
        if let Some(d) = t.strip_prefix("///") {
            doc.push(d.trim().to_owned());
        } else if t.starts_with("#[") {
            // Attributes sit between a doc comment and its item.
            attrs.push_str(t);
            continue;
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
            // `#[serde(skip)]`: an option the configuration does not have; `<written>`: the
            // keys an entry wrote, not a key (src/service/config/embed.rs).
            if attrs.contains("serde(skip)")
                || attrs.contains("serde(skip,")
                || attrs.contains("\"<written>\"")
            {
                attrs.clear();
                doc.clear();
                continue;
            }
            // `#[serde(rename = "key")]`: the key is the rename.
            let name = attrs
                .split("rename = \"")
                .nth(1)
                .and_then(|r| r.split('"').next())
                .unwrap_or(name);
            fields.push(Field {
                name: name.trim().to_owned(),
                ty: ty.trim().trim_end_matches(',').to_owned(),
                doc: doc.join(" "),
                attrs: std::mem::take(&mut attrs),
            });
            doc.clear();
        } else {
            doc.clear();
        }
        attrs.clear();
    }
    structs
}

/// The attributes' text of every `pub struct` of `raw.rs` (`#[serde(deny_unknown_fields,
/// default)]` ...), by name.
fn struct_attrs(src: &str) -> std::collections::HashMap<String, String> {
    let mut out = std::collections::HashMap::new();
    let mut attrs = String::new();
    for line in src.lines() {
        let t = line.trim();
        if t.starts_with("#[") {
            attrs.push_str(t);
        } else if let Some(rest) = t.strip_prefix("pub struct ") {
            let name = rest.split_whitespace().next().unwrap().to_owned();
            out.insert(name, std::mem::take(&mut attrs));
        } else if !t.starts_with("///") {
            attrs.clear();
        }
    }
    out
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
        "Duration" | "Backoff" | "RateLimit" | "Durability" | "MetricsToken" | "ConsumerSpan" => {
            "string".into()
        }
        "Vec<std::net::IpAddr>" => "array of strings".into(),
        "PriorityMode" => "array of integers".into(),
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
    doc_plain(doc).replace('|', "\\|")
}

/// A doc comment as plain text (rustdoc links reduced to their text: `[`x`](path)` and
/// `[`x`]` to `` `x` ``).
fn doc_plain(doc: &str) -> String {
    let mut s = doc.to_owned();
    let mut from = 0;
    while let Some(at) = s[from..].find("](").map(|i| from + i) {
        match s[at..].find(')').map(|e| at + e + 1) {
            Some(end) if !s[at..end].contains(char::is_whitespace) => {
                s.replace_range(at + 1..end, "");
            }
            _ => {}
        }
        from = at + 1;
    }
    s.replace("[`", "`").replace("`]", "`")
}

/// Field types that are values, not tables (see [`toml_type`] and [`schema_of_type`]).
const VALUE_TYPES: &[&str] = &[
    "String",
    "bool",
    "usize",
    "u64",
    "u32",
    "u16",
    "Duration",
    "serde_json::Value",
    "DispatchConfig",
    "Secrets",
    "Backoff",
    "RateLimit",
    "PriorityMode",
    "Durability",
    "ConsumerSpan",
    "std::net::IpAddr",
    "MetricsToken",
];

/// The struct a field type names (`Option<T>`, `Vec<T>`: `T`), unless it is a value.
fn table_type(ty: &str) -> Option<&str> {
    let ty = ty
        .strip_prefix("Option<")
        .and_then(|t| t.strip_suffix('>'))
        .unwrap_or(ty);
    let ty = ty
        .strip_prefix("Vec<")
        .and_then(|t| t.strip_suffix('>'))
        .unwrap_or(ty);
    (!VALUE_TYPES.contains(&ty)).then_some(ty)
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The configuration's structs with their attributes: every `pub struct` of `raw.rs`, and
/// each library option type one of their fields embeds (`DispatcherOptions`, ...), found by
/// name under `src/`: those deserialize themselves, and their doc comments are the keys'
/// descriptions.
#[allow(clippy::type_complexity)]
fn config_structs() -> (
    Vec<(String, String, Vec<Field>)>,
    std::collections::HashMap<String, String>,
) {
    let raw = std::fs::read_to_string(repo().join("src/service/config/raw.rs")).unwrap();
    let mut structs = parse_structs(&raw);
    let mut attrs = struct_attrs(&raw);
    let mut files = Vec::new();
    rust_files(&repo().join("src"), &mut files);
    files.sort();
    loop {
        let missing = structs
            .iter()
            .flat_map(|(_, _, fields)| fields.iter().filter_map(|f| table_type(&f.ty)))
            .find(|t| !structs.iter().any(|(n, _, _)| n == t))
            .map(str::to_owned);
        let Some(name) = missing else { break };
        let (src, found) = files
            .iter()
            .map(|f| std::fs::read_to_string(f).unwrap())
            .filter(|src| src.contains(&format!("pub struct {name} {{")))
            .find_map(|src| {
                let found = parse_structs(&src)
                    .into_iter()
                    .find(|(n, _, _)| *n == name)?;
                Some((src, found))
            })
            .unwrap_or_else(|| panic!("pub struct {name} not found under src/"));
        attrs.insert(name.clone(), struct_attrs(&src).remove(&name).unwrap());
        structs.push(found);
    }
    // A field renamed `<options>` is an option type whose keys sit in its table itself
    // (src/service/config/embed.rs): its fields take its place, and it is no table.
    let embedded = |f: &Field| f.attrs.contains("rename = \"<options>\"");
    let inlined: Vec<String> = structs
        .iter()
        .flat_map(|(_, _, fields)| fields.iter().filter(|f| embedded(f)))
        .map(|f| f.ty.clone())
        .collect();
    let snapshot = structs.clone();
    for (_, _, fields) in &mut structs {
        *fields = fields
            .iter()
            .flat_map(|f| match embedded(f) {
                // Its keys may be left out where its type has `#[serde(default)]`.
                true => {
                    let default = attrs[&f.ty].contains("default");
                    let (_, _, inner) = snapshot.iter().find(|(n, _, _)| *n == f.ty).unwrap();
                    inner
                        .iter()
                        .map(|g| Field {
                            attrs: if default {
                                format!("{}#[serde(default)]", g.attrs)
                            } else {
                                g.attrs.clone()
                            },
                            ..g.clone()
                        })
                        .collect()
                }
                false => vec![f.clone()],
            })
            .collect();
    }
    structs.retain(|(n, _, _)| !inlined.contains(n) || structs_use(&snapshot, n));
    (structs, attrs)
}

/// Whether a field of `structs`, other than an `<options>` one, has the type `name`.
fn structs_use(structs: &[(String, String, Vec<Field>)], name: &str) -> bool {
    structs.iter().any(|(_, _, fields)| {
        fields
            .iter()
            .any(|f| !f.attrs.contains("<options>") && table_type(&f.ty) == Some(name))
    })
}

fn config_reference() -> String {
    let (structs, _) = config_structs();
    let find = |name: &str| structs.iter().find(|(n, _, _)| n == name);
    let (_, _, top) = find("Config").expect("struct Config in raw.rs");
    let mut out = String::from(
        "# Configuration reference (`delayq serve`)\n\n\
         <!-- Generated from src/service/config/raw.rs and the option types it embeds by \
         tests/service/reference.rs; do not edit. Regenerate: DELAYQ_UPDATE_DOCS=1 cargo test --test service reference:: -->\n\n\
         Every key of `delayq serve --config FILE` (TOML), generated from the configuration's \
         types and their doc comments: `src/service/config/raw.rs` and the library's option \
         types it embeds (`DispatcherOptions` for `[dispatcher]`, ...), the one place each key \
         is described. Defaults are as those comments state them; the ranges are checked \
         where the values are defined (the library's option types) and a bad value exits 2 \
         naming the key.\n\n\
         **Environment:** every key can be overridden with `DELAYQ_<KEY>`, nested keys with \
         `__` (`DELAYQ_HTTP__LISTEN`); an array of tables (`[[handlers]]`, `[[schedules]]`) is \
         set whole (`DELAYQ_HANDLERS='[{...}]'`). Values are TOML \
         (`DELAYQ_HTTP__TOKENS='[\"a-long-token\"]'`). Only the file's own top-level keys are \
         read; other `DELAYQ_*` variables are left alone.\n\n\
         **Editors:** [`delayq.schema.json`](delayq.schema.json), beside this page, is the JSON \
         Schema of the same keys, generated from the same declarations (and checked by the \
         same test): unknown keys, wrong types and missing required keys are underlined as \
         you type, and every key's meaning shows on hover. Taplo and the Even Better TOML \
         extension of VS Code read it from a first line `#:schema \
         ./docs/reference/delayq.schema.json` (a path relative to the TOML file, or a URL), or \
         for every `delayq.toml` of a repository from a `.taplo.toml` at its root: \
         `[[rule]]` with `include = [\"**/delayq.toml\"]`, then `[rule.schema]` with \
         `path = \"docs/reference/delayq.schema.json\"`.\n",
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
            attrs: f.attrs.clone(),
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

/// The JSON Schema of one Rust field type (`Option<T>` as `T`); a type it does not know
/// fails the test, so the schema never guesses.
fn schema_of_type(ty: &str, structs: &[String]) -> serde_json::Value {
    use serde_json::json;
    let ty = ty
        .strip_prefix("Option<")
        .and_then(|t| t.strip_suffix('>'))
        .unwrap_or(ty);
    let strings = json!({"type": "array", "items": {"type": "string"}});
    match ty {
        "String" | "Duration" | "Backoff" | "RateLimit" | "Durability" | "MetricsToken" => {
            json!({"type": "string"})
        }
        "ConsumerSpan" => json!({"type": "string", "enum": ["link", "parent"]}),
        "Vec<std::net::IpAddr>" => strings,
        "bool" => json!({"type": "boolean"}),
        "usize" | "u64" => json!({"type": "integer", "minimum": 0}),
        "u32" => json!({"type": "integer", "minimum": 0, "maximum": u32::MAX}),
        "u16" => json!({"type": "integer", "minimum": 0, "maximum": u16::MAX}),
        "Vec<String>" => strings,
        "Vec<u32>" | "PriorityMode" => {
            json!({"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": u32::MAX}})
        }
        "serde_json::Value" => json!({}),
        // cancel_on: rules checked by engine::events (every surface's one place).
        "Vec<serde_json::Value>" => {
            json!({"type": "array", "items": {"type": "object", "required": ["event", "match"],
                "properties": {"event": {"type": "string"}, "match": {"anyOf": [{"type": "string"}, strings]},
                    "remember": {"type": "string"}, "queues": strings}}})
        }
        "DispatchConfig" => {
            json!({"anyOf": [{"type": "string", "enum": ["all", "none"]}, strings]})
        }
        "Secrets" => json!({"anyOf": [{"type": "string"}, strings]}),
        other => {
            let (array, base) = match other.strip_prefix("Vec<").and_then(|t| t.strip_suffix('>')) {
                Some(b) => (true, b),
                None => (false, other),
            };
            assert!(
                structs.iter().any(|s| s == base),
                "raw.rs field type {other:?}: tell schema_of_type its JSON Schema"
            );
            let r = json!({"$ref": format!("#/definitions/{base}")});
            if array {
                json!({"type": "array", "items": r})
            } else {
                r
            }
        }
    }
}

/// The JSON Schema (draft 7, what Taplo / Even Better TOML read) of `delayq.toml`, from the
/// same declarations as the configuration reference: every table closed to unknown keys
/// where serve refuses them (`deny_unknown_fields`), a key required only where serve
/// requires it (not `redis_url`: the environment may set it).
fn config_schema() -> String {
    use serde_json::{Map, Value, json};
    let (structs, attrs) = config_structs();
    let names: Vec<String> = structs.iter().map(|(n, _, _)| n.clone()).collect();
    let object = |name: &str, doc: &str, fields: &[Field]| -> Value {
        let sattrs = attrs.get(name).map_or("", String::as_str);
        let struct_default = sattrs.contains("default");
        let mut props = Map::new();
        let mut required = Vec::new();
        for f in fields {
            let mut p = schema_of_type(&f.ty, &names);
            p.as_object_mut()
                .unwrap()
                .insert("description".into(), Value::String(doc_plain(&f.doc)));
            props.insert(f.name.clone(), p);
            let optional =
                struct_default || f.ty.starts_with("Option<") || f.attrs.contains("default");
            if !optional {
                required.push(Value::String(f.name.clone()));
            }
        }
        let mut o = Map::new();
        o.insert("type".into(), json!("object"));
        if !doc.is_empty() {
            o.insert("description".into(), Value::String(doc_plain(doc)));
        }
        o.insert("properties".into(), Value::Object(props));
        if !required.is_empty() {
            o.insert("required".into(), Value::Array(required));
        }
        if sattrs.contains("deny_unknown_fields") {
            o.insert("additionalProperties".into(), json!(false));
        }
        Value::Object(o)
    };
    let mut definitions = Map::new();
    let mut root = Value::Null;
    for (name, doc, fields) in &structs {
        if name == "Config" {
            root = object(name, doc, fields);
        } else {
            definitions.insert(name.clone(), object(name, doc, fields));
        }
    }
    let root = root.as_object_mut().expect("struct Config in raw.rs");
    root.insert(
        "$schema".into(),
        json!("http://json-schema.org/draft-07/schema#"),
    );
    root.insert("title".into(), json!("delayq.toml (delayq serve --config)"));
    root.insert(
        "$comment".into(),
        json!(
            "Generated from src/service/config/raw.rs and the option types it embeds by \
             tests/service/reference.rs; do not edit. Regenerate: DELAYQ_UPDATE_DOCS=1 cargo test --test service reference::"
        ),
    );
    root.insert("definitions".into(), Value::Object(definitions));
    serde_json::to_string_pretty(&root).unwrap() + "\n"
}

#[test]
fn the_config_schema_is_what_the_config_types_declare() {
    let text = config_schema();
    let schema: serde_json::Value = serde_json::from_str(&text).unwrap();
    // Every top-level key, and nothing else, is allowed; tables refer to their definitions.
    let props = schema["properties"].as_object().unwrap();
    let mut keys: Vec<&str> = props.keys().map(String::as_str).collect();
    let mut want = delayq::service::config::raw::TOP_LEVEL_KEYS.to_vec();
    keys.sort_unstable();
    want.sort_unstable();
    assert_eq!(keys, want);
    assert_eq!(schema["additionalProperties"], false);
    assert!(
        schema.get("required").is_none(),
        "redis_url may come from the environment"
    );
    assert_eq!(props["http"]["$ref"], "#/definitions/HttpConfig");
    assert_eq!(
        props["handlers"]["items"]["$ref"],
        "#/definitions/HandlerConfig"
    );
    let handler = &schema["definitions"]["HandlerConfig"];
    assert_eq!(handler["required"], serde_json::json!(["group", "kind"]));
    assert_eq!(
        handler["properties"]["visibility_timeout"]["type"],
        "string"
    );
    assert_eq!(handler["additionalProperties"], false);
    assert_eq!(props["shards"]["maximum"], u16::MAX);
    // Every $ref names a definition.
    for cap in text.split("\"$ref\": \"#/definitions/").skip(1) {
        let name = &cap[..cap.find('"').unwrap()];
        assert!(schema["definitions"].get(name).is_some(), "{name}");
    }
    check_generated("docs/reference/delayq.schema.json", &text);
}
