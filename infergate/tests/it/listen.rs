//! A listener that cannot bind stops the binary before it serves anything: non-zero exit, a clear message, and
//! the other listener never accepts.

use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{free_port, KillOnDrop};

fn conf(listen: u16, metrics: u16) -> String {
    format!(
        "listen: \"127.0.0.1:{listen}\"\nmetrics_listen: \"127.0.0.1:{metrics}\"\n\
         server: {{ grace_period_seconds: 0, graceful_shutdown_timeout_seconds: 1, \
         pid_file: /tmp/infergate-listen-{listen}.pid, upgrade_sock: /tmp/infergate-listen-{listen}.sock }}\n\
         pools:\n  - name: a\n    endpoints: [\"http://127.0.0.1:9\"]\n"
    )
}

/// A port this test holds for the whole run (bound to port 0: a port picked first and bound later could be taken
/// by a concurrent test in between).
fn held_port() -> (TcpListener, u16) {
    let l = TcpListener::bind("127.0.0.1:0").expect("hold a port");
    let port = l.local_addr().expect("its address").port();
    (l, port)
}

/// Run the binary while `_held` holds one of its ports; returns (exit code, stderr). Panics if `free` ever accepts.
fn run_with_a_taken_port(
    _held: TcpListener,
    listen: u16,
    metrics: u16,
    free: u16,
) -> (i32, String) {
    let dir = std::env::temp_dir().join(format!("infergate-listen-{listen}-{metrics}"));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("infergate.yaml");
    std::fs::write(&path, conf(listen, metrics)).unwrap();
    let err_path = dir.join("stderr.log");
    let mut child = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_infergate"))
            .args(["-c", path.to_str().unwrap()])
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::from(std::fs::File::create(&err_path).unwrap()))
            .spawn()
            .unwrap(),
    );
    let start = Instant::now();
    let code = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.code().unwrap_or(-1);
        }
        let served = TcpStream::connect_timeout(
            &format!("127.0.0.1:{free}").parse().unwrap(),
            Duration::from_millis(100),
        )
        .is_ok();
        if served || start.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "still running after {:?}; port {free} accepting: {served}",
                start.elapsed()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let err = std::fs::read_to_string(&err_path).unwrap_or_default();
    let _ = std::fs::remove_dir_all(dir);
    (code, err)
}

#[test]
fn a_taken_listen_port_exits_before_serving() {
    let ((held, listen), metrics) = (held_port(), free_port());
    let (code, err) = run_with_a_taken_port(held, listen, metrics, metrics);
    assert_ne!(code, 0, "{err}");
    assert!(
        err.contains(&format!("infergate: cannot listen on 127.0.0.1:{listen}: ")),
        "{err}"
    );
    assert!(err.to_lowercase().contains("in use"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn a_taken_metrics_port_exits_before_serving() {
    let (listen, (held, metrics)) = (free_port(), held_port());
    let (code, err) = run_with_a_taken_port(held, listen, metrics, listen);
    assert_ne!(code, 0, "{err}");
    assert!(
        err.contains(&format!(
            "infergate: cannot listen on 127.0.0.1:{metrics}: "
        )),
        "{err}"
    );
}
