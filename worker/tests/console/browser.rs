//! A headless Chromium driven over WebDriver: chromedriver started per test
//! on a free port, one browser session on it, and screenshots kept as files
//! under `test-output/console/` in the workspace (CI keeps them).

use std::net::TcpListener;
use std::os::unix::process::CommandExt as _;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::elements::Element;
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::json;

/// The longest any wait for the page lasts: a hang fails fast.
pub(crate) const PAGE_WAIT: Duration = Duration::from_secs(15);

/// Debian's driver; another one with `FLOTILLA_CHROMEDRIVER`.
fn chromedriver_path() -> String {
    std::env::var("FLOTILLA_CHROMEDRIVER").unwrap_or_else(|_| "/usr/bin/chromedriver".into())
}

/// A browser session and the driver process behind it.
pub(crate) struct Browser {
    pub(crate) client: Client,
    driver: Child,
    base: String,
}

impl Browser {
    /// Starts chromedriver and a headless Chromium 1280×900 for the console at `base`.
    ///
    /// # Panics
    /// chromedriver is missing (install Debian's `chromium` and
    /// `chromium-driver`; `scripts/build-deps` does) or does not start.
    pub(crate) async fn start(base: &str) -> Self {
        let path = chromedriver_path();
        assert!(
            std::path::Path::new(&path).exists(),
            "{path} is missing: install Debian's chromium and chromium-driver (scripts/build-deps does)"
        );
        let port = free_port();
        // Its own process group, so the browsers it starts go with it.
        let driver = Command::new(&path)
            .arg(format!("--port={port}"))
            .process_group(0)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting chromedriver");
        let url = format!("http://127.0.0.1:{port}");
        let mut capabilities = serde_json::Map::new();
        capabilities.insert(
            "goog:chromeOptions".into(),
            json!({"args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                            "--disable-dev-shm-usage", "--window-size=1280,900"]}),
        );
        let deadline = tokio::time::Instant::now() + PAGE_WAIT;
        let client = loop {
            let connector = hyper_util::client::legacy::connect::HttpConnector::new();
            match ClientBuilder::new(connector)
                .capabilities(capabilities.clone())
                .connect(&url)
                .await
            {
                Ok(client) => break client,
                Err(e) if tokio::time::Instant::now() < deadline => {
                    tracing::debug!(error = %e, "chromedriver not ready yet");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("no browser session from chromedriver at {url}: {e}"),
            }
        };
        Self {
            client,
            driver,
            base: base.to_owned(),
        }
    }

    /// Opens the console at `route` (`#/jobs`, `#/fleet`…).
    pub(crate) async fn open(&self, route: &str) {
        self.client
            .goto(&format!("{}/ui/{route}", self.base))
            .await
            .expect("opening the console");
    }

    /// Waits for the element `css` to be shown.
    pub(crate) async fn find(&self, css: &str) -> Element {
        self.client
            .wait()
            .at_most(PAGE_WAIT)
            .for_element(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("{css} never appeared: {e}"))
    }

    /// Waits until the text content of `css` (collapsed parts and SVG text
    /// included) satisfies `check`; returns it.
    pub(crate) async fn text_until(&self, css: &str, check: impl Fn(&str) -> bool) -> String {
        let deadline = tokio::time::Instant::now() + PAGE_WAIT;
        let mut last = String::new();
        while tokio::time::Instant::now() < deadline {
            let read = self
                .client
                .execute(
                    "const e = document.querySelector(arguments[0]); return e ? e.textContent : null;",
                    vec![json!(css)],
                )
                .await;
            if let Ok(serde_json::Value::String(text)) = read {
                if check(&text) {
                    return text;
                }
                last = text;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("{css} never showed what was expected; last text: {last:?}");
    }

    /// Types `text` into the input `css`, replacing what it held.
    pub(crate) async fn fill(&self, css: &str, text: &str) {
        let input = self.find(css).await;
        input.clear().await.expect("clearing an input");
        input.send_keys(text).await.expect("typing");
    }

    pub(crate) async fn click(&self, css: &str) {
        self.find(css)
            .await
            .click()
            .await
            .unwrap_or_else(|e| panic!("clicking {css}: {e}"));
    }

    /// Signs in with `token` and waits for the sign-in form to go.
    pub(crate) async fn sign_in(&self, token: &str) {
        self.open("#/jobs").await;
        self.fill("#token", token).await;
        self.click("#sign-in").await;
        self.find("#sign-out").await;
    }

    /// Saves the page as `test-output/console/<name>.png`.
    pub(crate) async fn screenshot(&self, name: &str) {
        let png = self.client.screenshot().await.expect("taking a screenshot");
        let dir = screenshot_dir();
        std::fs::create_dir_all(&dir).expect("creating the screenshot directory");
        std::fs::write(dir.join(format!("{name}.png")), png).expect("writing a screenshot");
    }

    /// Ends the session and the driver.
    pub(crate) async fn close(self) {
        let _ = self.client.clone().close().await;
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // The driver's whole group, so a failed test leaves no browser behind.
        let group = format!("-{}", self.driver.id());
        let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
        let _ = self.driver.wait();
    }
}

/// `test-output/console/` at the workspace root.
pub(crate) fn screenshot_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../test-output/console")
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("binding a free port");
    listener.local_addr().expect("a bound port").port()
}
