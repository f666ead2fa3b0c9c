//! Headless Chromium driven over WebDriver (Debian's `chromium` and `chromium-driver`,
//! installed by `.ci/test`; nothing is downloaded): one ChromeDriver per test on a free port,
//! a fresh profile per session, screenshots saved under `target/ui-screenshots/` (and
//! copied to `docs/screenshots/` with `DELAYQ_UPDATE_SCREENSHOTS=1`).

use fantoccini::{Client, ClientBuilder, Locator};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A ChromeDriver process and a browser session on it.
pub struct Browser {
    pub client: Client,
    driver: Child,
    _profile: tempfile::TempDir,
}

impl Browser {
    /// Starts ChromeDriver and a headless Chromium window of `width` x `height`.
    pub async fn start(width: u32, height: u32) -> Browser {
        let port = super::serve::free_port();
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver is not installed (apt-get install chromium chromium-driver; .ci/test does)");
        let url = format!("http://127.0.0.1:{port}");
        let up = super::poll(Duration::from_secs(30), async || {
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .ok()
        })
        .await;
        assert!(up.is_some(), "chromedriver did not start");
        let profile = tempfile::tempdir().unwrap();
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            serde_json::json!({
                "binary": "/usr/bin/chromium",
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--disable-quic", "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync", "--hide-scrollbars",
                    format!("--window-size={width},{height}"),
                    format!("--user-data-dir={}", profile.path().display()),
                ]
            }),
        );
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        let last = std::cell::RefCell::new(None);
        let client = super::poll(Duration::from_secs(10), || {
            let (connector, caps, url, last) = (connector.clone(), caps.clone(), &url, &last);
            async move {
                let mut builder = ClientBuilder::new(connector);
                builder.capabilities(caps);
                let r = builder.connect(url).await;
                r.map_err(|e| *last.borrow_mut() = Some(e)).ok()
            }
        })
        .await;
        let last = last.into_inner();
        let Some(client) = client else {
            panic!("no browser session: {last:?}");
        };
        Browser {
            client,
            driver,
            _profile: profile,
        }
    }

    /// Waits until `css` matches an element whose text satisfies `cond`; returns its text.
    pub async fn wait_text(&self, css: &str, what: &str, cond: impl Fn(&str) -> bool) -> String {
        let last = std::cell::RefCell::new(String::new());
        let found = super::poll(Duration::from_secs(30), || {
            let (client, last, cond) = (&self.client, &last, &cond);
            async move {
                let t = client
                    .find(Locator::Css(css))
                    .await
                    .ok()?
                    .text()
                    .await
                    .ok()?;
                if cond(&t) {
                    return Some(t);
                }
                *last.borrow_mut() = t;
                None
            }
        })
        .await;
        let last = last.into_inner();
        match found {
            Some(t) => t,
            None => {
                let page = self.client.source().await.unwrap_or_default();
                panic!("timed out waiting for {what} ({css}); last text {last:?}; page:\n{page}");
            }
        }
    }

    /// Waits until `css` matches an element, and returns it.
    pub async fn wait(&self, css: &str) -> fantoccini::elements::Element {
        let found = super::poll(Duration::from_secs(30), || async {
            self.client.find(Locator::Css(css)).await.ok()
        })
        .await;
        match found {
            Some(el) => el,
            None => {
                let page = self.client.source().await.unwrap_or_default();
                panic!("timed out waiting for {css}; page:\n{page}");
            }
        }
    }

    /// Clicks the element `css` matches now.
    pub async fn click(&self, css: &str) {
        let el = self.client.find(Locator::Css(css)).await.unwrap();
        el.click().await.unwrap();
    }

    /// Saves a screenshot of the page as `<name>.png`.
    pub async fn screenshot(&self, name: &str) {
        let png = self.client.screenshot().await.unwrap();
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let dir = root.join("target").join("ui-screenshots");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("{name}.png")), &png).unwrap();
        if std::env::var("DELAYQ_UPDATE_SCREENSHOTS").is_ok_and(|v| v == "1") {
            let docs = root.join("docs").join("screenshots");
            std::fs::create_dir_all(&docs).unwrap();
            std::fs::write(docs.join(format!("{name}.png")), &png).unwrap();
        }
    }

    /// Ends the session and the driver.
    pub async fn close(mut self) {
        let _ = self.client.clone().close().await;
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}
