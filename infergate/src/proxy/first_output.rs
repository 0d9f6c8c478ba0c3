//! Where a streamed answer's first output starts: after the events an engine sends before its prefill has run.
//! vLLM's Responses API opens every stream with `response.created` and `response.in_progress`; the first byte
//! of such a stream says nothing about the prefill, its first output event does.

/// How many SSE events a stream of this route opens with before any output.
pub fn preamble_events(path: &str) -> u8 {
    match path {
        "/v1/responses" => 2,
        _ => 0,
    }
}

/// Counts SSE events across body chunks until the preamble has passed (an event ends at a blank line,
/// `\n\n` or `\r\n\r\n`).
#[derive(Debug, Default, Clone)]
pub struct Preamble {
    events_left: u8,
    at_line_start: bool,
}

impl Preamble {
    pub fn new(events: u8) -> Self {
        Preamble {
            events_left: events,
            at_line_start: false,
        }
    }

    /// Whether `chunk` carries output: bytes after the preamble's last event. Fed every chunk in order; once
    /// true, true for every non-empty chunk.
    pub fn output_in(&mut self, chunk: &[u8]) -> bool {
        if self.events_left == 0 {
            return !chunk.is_empty();
        }
        for (i, &b) in chunk.iter().enumerate() {
            match b {
                b'\r' => {}
                b'\n' if self.at_line_start => {
                    self.at_line_start = false;
                    self.events_left -= 1;
                    if self.events_left == 0 {
                        return i + 1 < chunk.len();
                    }
                }
                b'\n' => self.at_line_start = true,
                _ => self.at_line_start = false,
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CREATED: &[u8] = b"event: response.created\ndata: {\"a\":1}\n\n";
    const IN_PROGRESS: &[u8] = b"event: response.in_progress\ndata: {\"a\":2}\n\n";
    const DELTA: &[u8] = b"event: response.output_text.delta\ndata: {\"delta\":\"x\"}\n\n";

    #[test]
    fn output_starts_after_the_responses_apis_two_announcements() {
        let mut p = Preamble::new(preamble_events("/v1/responses"));
        assert!(!p.output_in(CREATED));
        assert!(!p.output_in(IN_PROGRESS));
        assert!(p.output_in(DELTA));
        assert!(p.output_in(DELTA));
        // Both announcements and the first output in one chunk.
        let mut p = Preamble::new(2);
        assert!(p.output_in(&[CREATED, IN_PROGRESS, DELTA].concat()));
        // Both announcements in one chunk, nothing after them.
        let mut p = Preamble::new(2);
        assert!(!p.output_in(&[CREATED, IN_PROGRESS].concat()));
        assert!(p.output_in(DELTA));
    }

    #[test]
    fn event_ends_split_across_chunks_and_crlf_count() {
        let all = [CREATED, IN_PROGRESS, DELTA].concat();
        let first_output = CREATED.len() + IN_PROGRESS.len();
        for cut in 1..all.len() {
            let mut p = Preamble::new(2);
            let (a, b) = all.split_at(cut);
            let found_in_a = p.output_in(a);
            assert_eq!(found_in_a, cut > first_output, "cut at {cut}");
            if !found_in_a {
                assert!(p.output_in(b), "cut at {cut}");
            }
        }
        let mut p = Preamble::new(2);
        assert!(!p.output_in(b"event: a\r\ndata: 1\r\n\r\nevent: b\r\ndata: 2\r\n\r\n"));
        assert!(p.output_in(b"event: c\r\n"));
    }

    #[test]
    fn other_routes_have_no_preamble() {
        for path in ["/v1/chat/completions", "/v1/completions", "/v1/messages"] {
            let mut p = Preamble::new(preamble_events(path));
            assert!(p.output_in(b"d"), "{path}");
        }
        assert!(!Preamble::new(0).output_in(b""));
    }
}
