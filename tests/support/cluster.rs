//! A throwaway Redis Cluster: six nodes (three masters, three replicas) on free ports in temp
//! dirs, `cluster-node-timeout 2000`, created with `redis-cli --cluster create`, killed on drop.

use delayq::LocalRedis;
use std::collections::HashMap;
use std::process::Command;
use std::time::{Duration, Instant};

pub struct LocalCluster {
    pub nodes: Vec<LocalRedis>,
}

fn free_port() -> u16 {
    delayq::testing::local_redis::free_port().unwrap()
}

impl LocalCluster {
    pub fn start() -> LocalCluster {
        let mut nodes = Vec::new();
        for _ in 0..6 {
            // An explicit bus port: the default (port + 10000) can exceed 65535.
            let bus = free_port().to_string();
            nodes.push(
                LocalRedis::start_with(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "2000",
                    "--cluster-port",
                    &bus,
                ])
                .unwrap(),
            );
        }
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        let out = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .output()
            .expect("redis-cli");
        assert!(
            out.status.success(),
            "cluster create failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let c = LocalCluster { nodes };
        c.wait_ok(Duration::from_secs(60));
        c
    }

    /// `redis+cluster://` URL with every node as a seed.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        format!("redis+cluster://{}", hosts.join(","))
    }

    fn cli(port: u16, args: &[&str]) -> Option<String> {
        let out = Command::new("redis-cli")
            .arg("-p")
            .arg(port.to_string())
            .args(args)
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Waits until every live node reports `cluster_state:ok` and agrees on 3 masters.
    pub fn wait_ok(&self, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let ok = self.live_ports().iter().all(|p| {
                Self::cli(*p, &["cluster", "info"]).is_some_and(|i| i.contains("cluster_state:ok"))
            });
            if ok {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "cluster not ok within {within:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn live_ports(&self) -> Vec<u16> {
        self.nodes
            .iter()
            .filter(|n| Self::cli(n.port(), &["ping"]).is_some())
            .map(LocalRedis::port)
            .collect()
    }

    /// The port of the master serving `key`'s slot.
    pub fn master_of(&self, key: &str) -> u16 {
        let port = self.live_ports()[0];
        let slot = Self::cli(port, &["cluster", "keyslot", key])
            .unwrap()
            .trim()
            .parse::<u16>()
            .unwrap();
        let nodes = Self::cli(port, &["cluster", "nodes"]).unwrap();
        let mut masters: HashMap<u16, (u16, u16)> = HashMap::new();
        for line in nodes.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 9 || !f[2].contains("master") || f[2].contains("fail") {
                continue;
            }
            let p: u16 = f[1].split(['@', ':']).nth(1).unwrap().parse().unwrap();
            for range in &f[8..] {
                let (a, b) = range.split_once('-').unwrap_or((range, range));
                if let (Ok(a), Ok(b)) = (a.parse(), b.parse()) {
                    masters.insert(a, (b, p));
                }
            }
        }
        masters
            .iter()
            .find(|(a, (b, _))| **a <= slot && slot <= *b)
            .map(|(_, (_, p))| *p)
            .expect("a master for the slot")
    }

    /// Kills (SIGKILL) the node on `port`.
    pub fn kill(&mut self, port: u16) {
        for n in self.nodes.iter_mut() {
            if n.port() == port {
                n.kill();
            }
        }
    }
}
