//! The binary rejects each kind of bad configuration with a message naming file, key and reason, and a
//! non-zero exit, before binding any port; `-t` validates a good file.

use std::net::TcpListener;
use std::process::Command;

fn write_conf(name: &str, text: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("infergate-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn run(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_infergate"))
        .args(args)
        .env("RUST_LOG", "error")
        .output()
        .expect("runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn good(listen: &str) -> String {
    format!(
        "listen: \"{listen}\"\npools:\n  - name: a\n    endpoints:\n      - url: http://127.0.0.1:9\n"
    )
}

#[test]
fn each_kind_of_bad_input_exits_non_zero_with_its_message() {
    // Hold the listen port: a router that got as far as binding would fail differently.
    let held = TcpListener::bind("127.0.0.1:0").unwrap();
    let listen = held.local_addr().unwrap().to_string();
    let base = good(&listen);
    let cases: Vec<(&str, String, &str)> = vec![
        ("bad_yaml.yaml", "listen: [unclosed\n".to_string(), "invalid YAML"),
        (
            "unknown_key.yaml",
            base.replace("pools:", "poools: []\npools:"),
            "poools: unknown key `poools`; did you mean `pools`?",
        ),
        (
            "bad_duration.yaml",
            format!("{base}timeouts: {{ connect: soon }}\n"),
            "timeouts.connect: invalid duration `soon`",
        ),
        (
            "bad_url.yaml",
            base.replace("http://127.0.0.1:9", "ftp://127.0.0.1:9"),
            "pools[0].endpoints[0].url: unsupported scheme `ftp`",
        ),
        (
            "duplicate_pool.yaml",
            format!("{base}  - name: a\n    models: [m]\n    endpoints:\n      - url: http://127.0.0.1:10\n"),
            "pools[1].name: duplicate pool name `a`",
        ),
        (
            "no_endpoints.yaml",
            format!("listen: \"{listen}\"\npools:\n  - name: a\n    endpoints: []\n"),
            "pools[0].endpoints: at least one endpoint is required",
        ),
    ];
    for (name, text, expected) in cases {
        let path = write_conf(name, &text);
        for args in [
            vec!["-c", path.to_str().unwrap()],
            vec!["-t", "-c", path.to_str().unwrap()],
        ] {
            let (code, _out, err) = run(&args);
            assert_ne!(code, 0, "{name} {args:?} exited 0");
            assert!(
                err.contains(&format!("{}: ", path.display())),
                "{name}: no file name in `{err}`"
            );
            assert!(
                err.contains(expected),
                "{name}: expected `{expected}` in `{err}`"
            );
            assert!(!err.contains("panicked"), "{name}: {err}");
        }
    }
    drop(held);
}

#[test]
fn test_flag_accepts_a_good_file_and_the_shipped_configs() {
    let path = write_conf("good.yaml", &good("127.0.0.1:0"));
    let (code, out, err) = run(&["-t", "-c", path.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("valid"));
    for shipped in ["../conf/infergate.yaml", "../conf/demo.yaml"] {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(shipped);
        let (code, out, err) = run(&["-t", "-c", p.to_str().unwrap()]);
        assert_eq!(code, 0, "{shipped}: {out}{err}");
    }
}

#[test]
fn missing_config_argument_and_missing_file_are_clear() {
    let (code, _, err) = run(&[]);
    assert_ne!(code, 0);
    assert!(err.contains("-c FILE"), "{err}");
    let (code, _, err) = run(&["-c", "/nonexistent/infergate.yaml"]);
    assert_ne!(code, 0);
    assert!(
        err.contains("/nonexistent/infergate.yaml: cannot read"),
        "{err}"
    );
}
