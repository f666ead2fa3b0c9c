//! `delayq serve`'s HTTP API fuzzed from its own `/openapi.json` by schemathesis (PyPI,
//! installed by `.ci/test`): a bounded number of generated requests per operation, positive
//! and negative, with and without a token, then stateful sequences. No answer may be a 5xx,
//! every answer must match its documented schema (every error inside the envelope), status
//! code and content type.
#![allow(clippy::unwrap_used)]

use crate::support;

use delayq::LocalRedis;
use std::process::Command;
use std::time::Duration;
use support::serve::Serve;

/// The schemathesis version `.ci/test` installs.
const SCHEMATHESIS: &str = "4.32.5";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_holds_to_its_openapi_document_under_schemathesis() {
    let version = Command::new("python3")
        .args(["-c", "import schemathesis; print(schemathesis.__version__)"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    assert!(
        !version.is_empty(),
        "schemathesis is not installed: python3 -m pip install schemathesis=={SCHEMATHESIS} \
         (.ci/test does)"
    );
    let redis = LocalRedis::start().unwrap();
    let mut serve = Serve::start(
        &format!(
            r#"
redis_url = "{}"
queues = ["q", "order-close"]
[http]
listen = "127.0.0.1:{{port}}"
tokens = ["schemathesis-token"]
# Long polls (`wait_ms`) end within the request deadline, well inside schemathesis's 10 s.
request_timeout = "4s"
"#,
            redis.url()
        ),
        None,
    );
    serve.wait_ready(Duration::from_secs(30)).await;
    let base = serve.base();
    let report = serve.dir.path().join("report");
    let run = |auth: bool, seed: &str, examples: &str| {
        let mut args = vec![
            "-c".to_owned(),
            "import sys; sys.argv[0] = 'st'; from schemathesis.cli import schemathesis; sys.exit(schemathesis())".to_owned(),
            "run".to_owned(),
            format!("{base}/openapi.json"),
            "--checks".to_owned(),
            "not_a_server_error,response_schema_conformance,status_code_conformance,content_type_conformance".to_owned(),
            "--max-examples".to_owned(),
            examples.to_owned(),
            "--seed".to_owned(),
            seed.to_owned(),
            "--generation-database".to_owned(),
            "none".to_owned(),
            "--request-timeout".to_owned(),
            "10".to_owned(),
            "--no-color".to_owned(),
            "--report-dir".to_owned(),
            report.display().to_string(),
        ];
        if auth {
            args.extend([
                "-H".to_owned(),
                "Authorization: Bearer schemathesis-token".to_owned(),
            ]);
        }
        // Run in the test's temp dir: schemathesis keeps a cache in its working directory.
        Command::new("python3")
            .args(&args)
            .current_dir(serve.dir.path())
            .output()
            .unwrap()
    };
    for (auth, seed, examples) in [(true, "1", "30"), (false, "2", "10")] {
        let o = run(auth, seed, examples);
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success(),
            "schemathesis (token: {auth}) found failures:\n{out}\n{}\n--- serve log ---\n{}",
            String::from_utf8_lossy(&o.stderr),
            serve.log()
        );
        assert!(out.contains("passed"), "{out}");
    }
    serve.sigterm();
    assert_eq!(serve.wait_exit(Duration::from_secs(30)).await, Some(0));
}
