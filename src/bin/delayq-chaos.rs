//! `delayq-chaos`: a worker or dispatcher process to kill, for fault-injection tests.
//!
//! - `delayq-chaos worker URL QUEUE GROUP CONSUMER OUT_FILE WORK_MS VISIBILITY_MS`: runs a
//!   worker whose handler takes WORK_MS, then appends `<order id> <attempt>` to OUT_FILE
//!   before returning success (so a kill between the append and the ack shows up as a
//!   duplicate, never as a loss).
//! - `delayq-chaos dispatcher URL QUEUE`: runs a dispatcher.
//!
//! Both run until killed. The crash tests in `tests/engine/crash.rs` kill them with SIGKILL.

use delayq::{Client, Delivery, Dispatcher, DispatcherOptions, Worker, WorkerOptions};
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("worker") if args.len() == 9 => {
            let client = Client::connect(&args[2]).await?;
            let out = Arc::new(Mutex::new(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&args[6])?,
            ));
            let work = Duration::from_millis(args[7].parse()?);
            let vt = Duration::from_millis(args[8].parse()?);
            let handler = move |d: Delivery| {
                let out = out.clone();
                async move {
                    tokio::time::sleep(work).await;
                    let line = format!("{} {}\n", d.id, d.attempt);
                    let mut f = out
                        .lock()
                        .map_err(|_| delayq::HandlerError::retry("poisoned"))?;
                    f.write_all(line.as_bytes())
                        .map_err(|e| delayq::HandlerError::retry(e.to_string()))?;
                    Ok(())
                }
            };
            let opts = WorkerOptions::default()
                .consumer(args[5].clone())
                .concurrency(32)
                .block(Duration::from_millis(200))
                .visibility_timeout(vt)
                .reclaim_every(Duration::from_millis(100));
            Worker::new(&client, &args[3], &args[4], handler, opts)?
                .run(CancellationToken::new())
                .await?;
        }
        Some("dispatcher") if args.len() == 4 => {
            let client = Client::connect(&args[2]).await?;
            Dispatcher::new(&client, &args[3], DispatcherOptions::default())?
                .run(CancellationToken::new())
                .await;
        }
        _ => anyhow::bail!(
            "usage: delayq-chaos worker URL QUEUE GROUP CONSUMER OUT WORK_MS VISIBILITY_MS | dispatcher URL QUEUE"
        ),
    }
    Ok(())
}
