//! The state file's format, version 1: JSON lines, so a truncated file is detected where it ends and no line
//! needs more memory than its own bytes.
//!
//! ```text
//! {"format":"infergate-sessions","version":1,"key_check":"<16 hex>","writer":"<16 hex>","written_at_ms":N,"pools":P}
//! {"pool":"default","endpoints":["http://10.0.0.5:8000",...],"sessions":S}     one per pool, then its S rows:
//! [key,endpoint_index,last_seen_ms,[[lineage,size],...]]                     least recently served first
//! {"end":true,"sessions":TOTAL}
//! ```
//!
//! `key_check` is the session-key hash of a fixed text: a build whose hash differs (std's SipHash keys are not
//! promised stable across Rust releases) would misread every key, so its file is refused. `writer` names the
//! process that wrote the file, `written_at_ms` when (Unix milliseconds); `last_seen_ms` too. Endpoints are
//! named by URL (`http://host:port`), never by the in-process id. Anything unexpected refuses the whole file:
//! the caller then starts with no bindings, as it would without a file.

use serde::{Deserialize, Serialize};

use crate::placement::sessions::{session_hash, MAX_LINEAGES};

/// The `format` value of the header line.
pub const FORMAT: &str = "infergate-sessions";
/// The version this build writes and reads.
pub const VERSION: u64 = 1;
/// The longest a session row can be (a row with every number at its maximum is about 190 bytes).
pub const MAX_ROW_BYTES: usize = 256;
/// Pools and endpoints per pool a file may name.
pub const MAX_POOLS: usize = 1024;
pub const MAX_ENDPOINTS: usize = 65_536;

/// A whole file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateDoc {
    /// The writing process's random id.
    pub writer: u64,
    pub written_at_ms: u64,
    pub pools: Vec<PoolState>,
}

/// One pool's bindings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolState {
    pub name: String,
    /// Endpoint URLs; rows refer to them by index.
    pub endpoints: Vec<String>,
    pub sessions: Vec<Row>,
}

/// One binding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    pub key: u64,
    /// Index into the pool's `endpoints`.
    pub endpoint: u32,
    pub last_seen_ms: u64,
    /// (lineage, size of its last turn), most recent first.
    pub lineages: Vec<(u64, u32)>,
}

/// What a reader accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest file.
    pub max_bytes: usize,
    /// Most rows, all pools together.
    pub max_sessions: usize,
}

/// Why a file was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FormatError {
    TooLarge { bytes: usize, max: usize },
    NotAStateFile,
    Version(String),
    KeyCheck,
    TooManySessions { max: usize },
    Truncated,
    Invalid { line: usize, reason: String },
}

impl std::fmt::Display for FormatError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FormatError::TooLarge { bytes, max } => {
                write!(
                    f,
                    "{bytes} bytes, more than the {max} this configuration can have written"
                )
            }
            FormatError::NotAStateFile => write!(f, "not an infergate session state file"),
            FormatError::Version(v) => {
                write!(f, "format version {v}; this build reads version {VERSION}")
            }
            FormatError::KeyCheck => write!(
                f,
                "written by a build whose session-key hash differs (a different Rust release?)"
            ),
            FormatError::TooManySessions { max } => {
                write!(
                    f,
                    "more than {max} sessions, the sum of the pools' max_sessions"
                )
            }
            FormatError::Truncated => {
                write!(f, "truncated (the writer stopped before its end line)")
            }
            FormatError::Invalid { line, reason } => write!(f, "line {line}: {reason}"),
        }
    }
}

/// The hash every file must carry in `key_check`.
pub fn key_check() -> String {
    format!("{:016x}", session_hash(b"infergate state file key check"))
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct HeaderLine {
    format: String,
    version: u64,
    key_check: String,
    writer: String,
    written_at_ms: u64,
    pools: u64,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct PoolLine {
    pool: String,
    endpoints: Vec<String>,
    sessions: u64,
}

type RowLine = (u64, u32, u64, Vec<(u64, u32)>);

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct EndLine {
    end: bool,
    sessions: u64,
}

/// The file's text.
pub fn encode(doc: &StateDoc) -> String {
    let rows: usize = doc.pools.iter().map(|p| p.sessions.len()).sum();
    let mut out = String::with_capacity(256 + rows * 64);
    push_line(
        &mut out,
        &HeaderLine {
            format: FORMAT.to_string(),
            version: VERSION,
            key_check: key_check(),
            writer: format!("{:016x}", doc.writer),
            written_at_ms: doc.written_at_ms,
            pools: doc.pools.len() as u64,
        },
    );
    for p in &doc.pools {
        push_line(
            &mut out,
            &PoolLine {
                pool: p.name.clone(),
                endpoints: p.endpoints.clone(),
                sessions: p.sessions.len() as u64,
            },
        );
        for r in &p.sessions {
            push_line(&mut out, &(r.key, r.endpoint, r.last_seen_ms, &r.lineages));
        }
    }
    push_line(
        &mut out,
        &EndLine {
            end: true,
            sessions: rows as u64,
        },
    );
    out
}

/// The header's writer and time, reading the first line only (is this file new, and someone else's?).
pub fn peek(bytes: &[u8]) -> Result<(u64, u64), FormatError> {
    let first = bytes.split(|&b| b == b'\n').next().unwrap_or_default();
    let h = header(first)?;
    Ok((parse_hex(&h.writer, 1)?, h.written_at_ms))
}

fn header(line: &[u8]) -> Result<HeaderLine, FormatError> {
    let v: serde_json::Value =
        serde_json::from_slice(line).map_err(|_| FormatError::NotAStateFile)?;
    if v.get("format").and_then(|f| f.as_str()) != Some(FORMAT) {
        return Err(FormatError::NotAStateFile);
    }
    match v.get("version") {
        Some(n) if n.as_u64() == Some(VERSION) => {}
        Some(n) => return Err(FormatError::Version(n.to_string())),
        None => return Err(FormatError::Version("(none)".into())),
    }
    let h: HeaderLine = serde_json::from_value(v).map_err(|e| invalid(1, e))?;
    if h.key_check != key_check() {
        return Err(FormatError::KeyCheck);
    }
    Ok(h)
}

fn invalid(line: usize, reason: impl std::fmt::Display) -> FormatError {
    FormatError::Invalid {
        line,
        reason: reason.to_string(),
    }
}

fn parse_hex(s: &str, line: usize) -> Result<u64, FormatError> {
    u64::from_str_radix(s, 16).map_err(|_| invalid(line, format!("`{s}` is not a hex number")))
}

/// Read a whole file, within `limits`.
pub fn decode(bytes: &[u8], limits: Limits) -> Result<StateDoc, FormatError> {
    if bytes.len() > limits.max_bytes {
        return Err(FormatError::TooLarge {
            bytes: bytes.len(),
            max: limits.max_bytes,
        });
    }
    // Every line ends in a newline, the end line included: anything else was cut short.
    let body = bytes.strip_suffix(b"\n").ok_or(FormatError::Truncated)?;
    let mut lines = body
        .split(|&b| b == b'\n')
        .enumerate()
        .map(|(i, l)| (i + 1, l));
    let (_, first) = lines.next().ok_or(FormatError::Truncated)?;
    let h = header(first)?;
    let writer = parse_hex(&h.writer, 1)?;
    let pools = usize::try_from(h.pools).unwrap_or(usize::MAX);
    if pools > MAX_POOLS {
        return Err(invalid(1, format!("{pools} pools, more than {MAX_POOLS}")));
    }
    let mut next = || lines.next().ok_or(FormatError::Truncated);
    let mut doc = StateDoc {
        writer,
        written_at_ms: h.written_at_ms,
        pools: Vec::with_capacity(pools),
    };
    let mut total = 0usize;
    for _ in 0..pools {
        let (n, l) = next()?;
        let p: PoolLine = serde_json::from_slice(l).map_err(|e| invalid(n, e))?;
        if p.endpoints.len() > MAX_ENDPOINTS {
            return Err(invalid(n, format!("more than {MAX_ENDPOINTS} endpoints")));
        }
        let count = usize::try_from(p.sessions).unwrap_or(usize::MAX);
        total = total.saturating_add(count);
        if total > limits.max_sessions {
            return Err(FormatError::TooManySessions {
                max: limits.max_sessions,
            });
        }
        let mut sessions = Vec::with_capacity(count.min(1 << 16));
        for _ in 0..count {
            let (n, l) = next()?;
            if l.len() > MAX_ROW_BYTES {
                return Err(invalid(
                    n,
                    format!("a row longer than {MAX_ROW_BYTES} bytes"),
                ));
            }
            let (key, endpoint, last_seen_ms, lineages): RowLine =
                serde_json::from_slice(l).map_err(|e| invalid(n, e))?;
            if endpoint as usize >= p.endpoints.len() {
                return Err(invalid(
                    n,
                    format!("endpoint index {endpoint} out of range"),
                ));
            }
            if lineages.len() > MAX_LINEAGES {
                return Err(invalid(n, format!("more than {MAX_LINEAGES} lineages")));
            }
            sessions.push(Row {
                key,
                endpoint,
                last_seen_ms,
                lineages,
            });
        }
        doc.pools.push(PoolState {
            name: p.pool,
            endpoints: p.endpoints,
            sessions,
        });
    }
    let (n, l) = next()?;
    let end: EndLine = serde_json::from_slice(l).map_err(|e| invalid(n, e))?;
    if !end.end || end.sessions != total as u64 {
        return Err(invalid(n, "the end line does not match the rows"));
    }
    if let Some((n, _)) = lines.next() {
        return Err(invalid(n, "text after the end line"));
    }
    Ok(doc)
}

/// One line of any kind, as JSON, and its newline.
fn push_line<T: Serialize>(out: &mut String, v: &T) {
    // Strings, numbers and lists only: serialisation cannot fail.
    out.push_str(&serde_json::to_string(v).unwrap_or_default());
    out.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        max_bytes: 1 << 20,
        max_sessions: 100,
    };

    fn doc() -> StateDoc {
        StateDoc {
            writer: 0xfeed,
            written_at_ms: 1_700_000_000_000,
            pools: vec![
                PoolState {
                    name: "chat".into(),
                    endpoints: vec!["http://10.0.0.5:8000".into(), "http://[::1]:8001".into()],
                    sessions: vec![
                        Row {
                            key: u64::MAX,
                            endpoint: 1,
                            last_seen_ms: 1_699_999_999_000,
                            lineages: vec![(u64::MAX, u32::MAX); MAX_LINEAGES],
                        },
                        Row {
                            key: 7,
                            endpoint: 0,
                            last_seen_ms: 1_700_000_000_000,
                            lineages: vec![(1, 100), (2, 50)],
                        },
                    ],
                },
                PoolState {
                    name: "empty \"pool\"".into(),
                    endpoints: vec![],
                    sessions: vec![],
                },
            ],
        }
    }

    #[test]
    fn round_trip() {
        let text = encode(&doc());
        assert_eq!(text.lines().count(), 6);
        assert!(text.starts_with(&format!(
            "{{\"format\":\"infergate-sessions\",\"version\":1,\"key_check\":\"{}\",\"writer\":\"000000000000feed\"",
            key_check()
        )));
        assert_eq!(decode(text.as_bytes(), LIMITS), Ok(doc()));
        assert_eq!(peek(text.as_bytes()), Ok((0xfeed, 1_700_000_000_000)));
        let max_row = text.lines().nth(2).unwrap();
        assert!(max_row.len() <= MAX_ROW_BYTES, "{}", max_row.len());
    }

    #[test]
    fn another_version_or_file_is_refused_by_its_first_line() {
        let text = encode(&doc());
        let v2 = text.replacen("\"version\":1", "\"version\":2", 1);
        assert_eq!(
            decode(v2.as_bytes(), LIMITS),
            Err(FormatError::Version("2".into()))
        );
        // A future version may change every other line: only the first is read.
        let v2_other = format!("{}\nsomething else entirely\n", v2.lines().next().unwrap());
        assert_eq!(
            decode(v2_other.as_bytes(), LIMITS),
            Err(FormatError::Version("2".into()))
        );
        assert_eq!(peek(v2.as_bytes()), Err(FormatError::Version("2".into())));
        for other in [
            "",
            "\n",
            "hello\n",
            "{}\n",
            "{\"format\":\"x\",\"version\":1}\n",
            "\u{0}\u{1}binary",
        ] {
            let e = decode(other.as_bytes(), LIMITS).unwrap_err();
            assert!(
                matches!(e, FormatError::NotAStateFile | FormatError::Truncated),
                "{other:?}: {e:?}"
            );
        }
        let other_hash = text.replacen(&key_check(), "0123456789abcdef", 1);
        assert_eq!(
            decode(other_hash.as_bytes(), LIMITS),
            Err(FormatError::KeyCheck)
        );
    }

    #[test]
    fn every_truncation_is_refused() {
        let text = encode(&doc());
        for cut in 0..text.len() {
            let e =
                decode(&text.as_bytes()[..cut], LIMITS).expect_err("a cut file must be refused");
            assert!(
                matches!(
                    e,
                    FormatError::Truncated
                        | FormatError::NotAStateFile
                        | FormatError::Invalid { .. }
                ),
                "cut at {cut}: {e:?}"
            );
        }
        // Lines missing from the middle, and lines added after the end.
        let lines: Vec<&str> = text.lines().collect();
        let without_row = format!(
            "{}\n{}\n{}\n{}\n{}\n",
            lines[0], lines[1], lines[3], lines[4], lines[5]
        );
        assert!(decode(without_row.as_bytes(), LIMITS).is_err());
        let extra = format!("{text}{}\n", lines[5]);
        assert!(matches!(
            decode(extra.as_bytes(), LIMITS),
            Err(FormatError::Invalid { line: 7, .. })
        ));
    }

    #[test]
    fn bounds() {
        let text = encode(&doc());
        assert_eq!(
            decode(
                text.as_bytes(),
                Limits {
                    max_bytes: 100,
                    ..LIMITS
                }
            ),
            Err(FormatError::TooLarge {
                bytes: text.len(),
                max: 100
            })
        );
        assert_eq!(
            decode(
                text.as_bytes(),
                Limits {
                    max_sessions: 1,
                    ..LIMITS
                }
            ),
            Err(FormatError::TooManySessions { max: 1 })
        );
        // A pool line that claims more rows than the file holds allocates nothing up front and ends as truncated.
        let lines: Vec<&str> = text.lines().collect();
        let huge = format!(
            "{}\n{{\"pool\":\"chat\",\"endpoints\":[],\"sessions\":99}}\n",
            lines[0].replace("\"pools\":2", "\"pools\":1")
        );
        assert_eq!(decode(huge.as_bytes(), LIMITS), Err(FormatError::Truncated));
        // Rows must point at an endpoint and carry at most MAX_LINEAGES lineages.
        let bad_index = text.replacen("[7,0,", "[7,2,", 1);
        assert!(matches!(
            decode(bad_index.as_bytes(), LIMITS),
            Err(FormatError::Invalid { line: 4, .. })
        ));
        let mut d = doc();
        d.pools[0].sessions[1].lineages = vec![(1, 1); MAX_LINEAGES + 1];
        assert!(matches!(
            decode(encode(&d).as_bytes(), LIMITS),
            Err(FormatError::Invalid { line: 4, .. })
        ));
        let pools = text.replacen("\"pools\":2", &format!("\"pools\":{}", MAX_POOLS + 1), 1);
        assert!(matches!(
            decode(pools.as_bytes(), LIMITS),
            Err(FormatError::Invalid { line: 1, .. })
        ));
    }
}
