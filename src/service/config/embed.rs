//! Tables that are partly a library option type: `[reconciliation]` carries
//! `ReconcileOptions`'s keys (`cron`, `grace`, `batch`) beside the service's own (`enabled`,
//! `database_url`, `queue`, `group`), each `[[handlers]]` entry `WorkerOptions`'s
//! (`concurrency`, `timeout`, ...) beside its queue, group and kind, and the top level
//! `ClientOptions`'s (`namespace`, `shards`, ...) beside the rest of the file, `[http]`
//! `HttpLimits`'s beside `listen`, `tokens` and `consumer_tokens`.
//!
//! serde's `flatten` would lose `deny_unknown_fields` and the key an error is about, so
//! before the file is deserialized, the option type's keys of such a table are moved into a
//! field of their own ([`OPTIONS`], a name no bare TOML key can take), which is the option
//! type; [`path`] and [`known`] tell errors without it.

use super::ConfigError;
use crate::engine::client::ClientOptions;
use crate::engine::worker::WorkerOptions;
use crate::orders::reconcile::ReconcileOptions;
use crate::service::http::HttpLimits;
use figment::value::{Dict, Tag, Value};
use serde::de::{self, Deserializer, Visitor};
use std::cell::Cell;

/// The field that embeds the option type in a table that is partly one.
pub(crate) const OPTIONS: &str = "<options>";

/// One table (a top-level key; an array of tables: each) whose option type's keys are
/// embedded under [`OPTIONS`], and those keys.
struct Embedded {
    table: &'static str,
    keys: fn() -> &'static [&'static str],
    /// The table's own keys, [`OPTIONS`] among them.
    table_keys: fn() -> &'static [&'static str],
    /// Whether the table also takes the list of option keys it wrote, as [`WRITTEN`].
    written: bool,
}

const EMBEDDED: &[Embedded] = &[
    Embedded {
        table: "reconciliation",
        keys: fields_of::<ReconcileOptions>,
        table_keys: fields_of::<super::ReconciliationConfig>,
        written: false,
    },
    Embedded {
        table: "handlers",
        keys: fields_of::<WorkerOptions>,
        table_keys: fields_of::<super::HandlerConfig>,
        written: true,
    },
    Embedded {
        table: "http",
        keys: fields_of::<HttpLimits>,
        table_keys: fields_of::<super::HttpConfig>,
        written: false,
    },
    // The top level.
    Embedded {
        table: "",
        keys: fields_of::<ClientOptions>,
        table_keys: fields_of::<super::Config>,
        written: false,
    },
];

/// The field that lists the option keys a table wrote (where [`Embedded::written`]).
pub(crate) const WRITTEN: &str = "<written>";

/// Moves each embedding table's option keys into its [`OPTIONS`] table.
pub(super) fn nest(root: &mut Dict) -> Result<(), ConfigError> {
    for e in EMBEDDED {
        let keys = (e.keys)();
        if e.table.is_empty() {
            nest_one(e, "", root, keys)?;
            continue;
        }
        match root.get_mut(e.table) {
            Some(Value::Dict(_, d)) => nest_one(e, e.table, d, keys)?,
            Some(Value::Array(_, items)) => {
                for (i, item) in items.iter_mut().enumerate() {
                    if let Value::Dict(_, d) = item {
                        nest_one(e, &format!("{}.{i}", e.table), d, keys)?;
                    }
                }
            }
            // Absent, or not a table: deserialization says what is wrong.
            _ => {}
        }
    }
    Ok(())
}

fn nest_one(e: &Embedded, at: &str, d: &mut Dict, keys: &[&str]) -> Result<(), ConfigError> {
    // Written in the file, the fields' own names are unknown keys like any other.
    if let Some(k) = [OPTIONS, WRITTEN].into_iter().find(|k| d.contains_key(*k)) {
        let path = [e.table.to_owned(), k.to_owned()];
        let key = if at.is_empty() {
            k.to_owned()
        } else {
            format!("{at}.{k}")
        };
        return Err(ConfigError::at(
            key,
            format!(
                "unknown key {k:?} (known: {})",
                known(&path, (e.table_keys)()).join(", ")
            ),
        ));
    }
    let inner: Dict = keys
        .iter()
        .filter_map(|k| d.remove(*k).map(|v| ((*k).to_owned(), v)))
        .collect();
    if e.written {
        let written = inner.keys().map(|k| Value::from(k.as_str())).collect();
        d.insert(WRITTEN.to_owned(), Value::Array(Tag::Default, written));
    }
    d.insert(OPTIONS.to_owned(), Value::Dict(Tag::Default, inner));
    Ok(())
}

/// An error's key path without the [`OPTIONS`] step. A value an option type refused
/// (`parsed`: its own message, not a wrong type) is named as the checks after
/// deserialization name theirs, `handlers[0].timeout`; other errors as figment does,
/// `handlers.0.concurrency`.
pub(super) fn path(path: &[String], parsed: bool) -> String {
    let bracket = parsed && path.iter().any(|p| p == OPTIONS);
    let mut out = String::new();
    for p in path.iter().filter(|p| *p != OPTIONS) {
        if bracket && p.parse::<usize>().is_ok() {
            out.push_str(&format!("[{p}]"));
        } else {
            if !out.is_empty() {
                out.push('.');
            }
            out.push_str(p);
        }
    }
    out
}

/// A table's known keys, the [`OPTIONS`] field replaced by the option type's keys.
pub(super) fn known(path: &[String], known: &'static [&'static str]) -> Vec<&'static str> {
    // The unknown key's table: the top level, or the top-level key it is under.
    let table = match path {
        [first, _, ..] => first.as_str(),
        _ => "",
    };
    let options = EMBEDDED
        .iter()
        .find(|e| e.table == table)
        .map_or(&[][..], |e| (e.keys)());
    known
        .iter()
        .filter(|k| **k != WRITTEN)
        .flat_map(|k| {
            if *k == OPTIONS {
                options
            } else {
                std::slice::from_ref(k)
            }
        })
        .copied()
        .collect()
}

/// The field names a derived `Deserialize` of `T` asks its deserializer for (its
/// `deserialize_struct` call): the keys of its table, renames applied, skipped ones left out.
pub(crate) fn fields_of<T: de::DeserializeOwned>() -> &'static [&'static str] {
    struct Probe<'a>(&'a Cell<&'static [&'static str]>);
    impl<'de> Deserializer<'de> for Probe<'_> {
        type Error = de::value::Error;
        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
            Err(de::Error::custom("not a struct"))
        }
        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Self::Error> {
            self.0.set(fields);
            Err(de::Error::custom("fields read"))
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
            byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map enum
            identifier ignored_any
        }
    }
    let fields = Cell::new(&[][..]);
    let _ = T::deserialize(Probe(&fields));
    fields.get()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An option key spelled like one of its table's own would be taken from the table.
    #[test]
    fn an_option_type_shares_no_key_with_its_table() {
        for e in EMBEDDED {
            let own = (e.table_keys)();
            assert!(own.contains(&OPTIONS), "{}", e.table);
            for k in (e.keys)() {
                assert!(!own.contains(k), "{}: {k}", e.table);
            }
        }
    }

    #[test]
    fn the_fields_of_an_option_type_are_its_keys() {
        assert_eq!(
            fields_of::<ReconcileOptions>(),
            &["cron", "grace", "batch"][..]
        );
        assert_eq!(
            fields_of::<crate::engine::loops::dispatcher::DispatcherOptions>(),
            &[
                "batch",
                "max_idle",
                "idle_poll",
                "max_call",
                "linger",
                "lateness_budget",
                "takeover_after"
            ][..]
        );
    }
}
