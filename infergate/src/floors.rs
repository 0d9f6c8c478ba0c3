//! The floors of the crate, bottom up, and the test that every `crate::` path in the source points to its own
//! floor or below (README, "Layout").

use std::path::{Path, PathBuf};

/// Each top-level module's floor. A module may use modules of its own floor and of the floors below.
pub const FLOORS: &[(&str, &[&str])] = &[
    (
        "ground",
        &[
            "request",
            "request_id",
            "header_case",
            "live",
            "fnv",
            "ledger",
            "paths",
            "errors",
            "lifecycle",
            "logging",
            "cli",
            "tokens",
            "tls",
        ],
    ),
    ("config", &["config"]),
    (
        "rules",
        &[
            "placement",
            "outlier",
            "cors",
            "forwarded",
            "framing",
            "listen",
        ],
    ),
    ("observation", &["metrics", "engine_stats", "kv_events"]),
    (
        "domain",
        &[
            "pool",
            "access_log",
            "stored_responses",
            "admission",
            "exposure",
            "traces",
        ],
    ),
    ("services", &["clients", "status", "state_file", "cluster"]),
    ("state", &["state"]),
    ("glue", &["proxy", "reload", "metrics_port"]),
    ("top", &["housekeeping", "server"]),
];

/// The floor of top-level module `module`, if it is listed.
fn floor_of(module: &str) -> Option<usize> {
    FLOORS.iter().position(|(_, mods)| mods.contains(&module))
}

/// The top-level module a source file belongs to (`pool/health.rs` → `pool`), None for `lib.rs`, the binary
/// (`main.rs` and its allocator, `alloc.rs`, which uses nothing of the crate) and this file.
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).ok()?;
    let first = rel.components().next()?.as_os_str().to_str()?;
    let name = first.strip_suffix(".rs").unwrap_or(first);
    (!matches!(name, "lib" | "main" | "alloc" | "floors")).then(|| name.to_string())
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = entry.path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// Every `crate::<module>` a file names outside comments and before its unit tests, with its line number. Tests
/// may reach across floors to build what they check.
fn crate_paths(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let lines: Vec<&str> = text.lines().collect();
    for (n, line) in lines.iter().enumerate() {
        let next = lines.get(n + 1).map_or("", |l| l.trim());
        if line.trim() == "#[cfg(test)]" && next.starts_with("mod ") && next.ends_with('{') {
            break;
        }
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(i) = rest.find("crate::") {
            let after = &rest[i + "crate::".len()..];
            let name: String = after
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                out.push((n + 1, name));
            }
            rest = after;
        }
    }
    out
}

/// The imports of the crate's source that point up a floor: (file, line, module, its floor, the target's).
pub fn upward_imports(src: &Path) -> Vec<String> {
    let mut files = Vec::new();
    sources(src, &mut files);
    files.sort();
    let mut found = Vec::new();
    for file in files {
        let Some(module) = module_of(src, &file) else {
            continue;
        };
        let in_tests = file
            .strip_prefix(src)
            .unwrap_or(&file)
            .components()
            .any(|c| c.as_os_str() == "tests" || c.as_os_str() == "tests.rs");
        if in_tests {
            continue;
        }
        let Some(own) = floor_of(&module) else {
            found.push(format!(
                "{}: module `{module}` is on no floor",
                file.display()
            ));
            continue;
        };
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        for (line, target) in crate_paths(&text) {
            match floor_of(&target) {
                Some(f) if f > own => found.push(format!(
                    "{}:{line}: `{module}` ({}) uses `crate::{target}` ({})",
                    file.display(),
                    FLOORS[own].0,
                    FLOORS[f].0
                )),
                Some(_) => {}
                None => found.push(format!(
                    "{}:{line}: `crate::{target}` is on no floor",
                    file.display()
                )),
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn src() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
    }

    #[test]
    fn no_import_points_up_a_floor() {
        let up = upward_imports(&src());
        assert!(up.is_empty(), "imports that point up:\n{}", up.join("\n"));
    }

    #[test]
    fn every_module_of_the_crate_is_on_a_floor() {
        let lib = std::fs::read_to_string(src().join("lib.rs")).unwrap();
        for line in lib.lines() {
            if let Some(m) = line.strip_prefix("pub mod ") {
                let m = m.trim_end_matches(';');
                assert!(m == "floors" || floor_of(m).is_some(), "{m}");
            }
        }
    }

    #[test]
    fn the_scan_sees_an_upward_import() {
        let dir = std::env::temp_dir().join(format!("infergate-floors-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("pool")).unwrap();
        std::fs::write(
            dir.join("pool/mod.rs"),
            "// crate::server in a comment is fine\n#[cfg(test)]\nmod tests;\nuse crate::metrics::Metrics;\nuse crate::state::RouterState;\n",
        )
        .unwrap();
        std::fs::write(dir.join("metrics.rs"), "fn f() { crate::proxy::x(); }\n").unwrap();
        let up = upward_imports(&dir);
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(up.len(), 2, "{up:?}");
        assert!(up[0].contains("`metrics` (observation) uses `crate::proxy` (glue)"));
        assert!(up[1].contains("pool/mod.rs:5: `pool` (domain) uses `crate::state` (state)"));
    }
}
