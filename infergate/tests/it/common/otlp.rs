//! An OTLP/HTTP trace receiver on loopback, as a collector's `otlp` receiver: it takes `POST /v1/traces` with a
//! protobuf `ExportTraceServiceRequest`, decodes it with the official definitions (`opentelemetry-proto`) and keeps
//! the spans. It can be told to hang: read each export and never answer, as a wedged collector does.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// One received span, ids in hex as `traceparent` writes them.
#[derive(Debug, Clone)]
pub struct ReceivedSpan {
    pub service: String,
    pub name: String,
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a root span.
    pub parent_span_id: String,
    /// OTLP's span kind: 2 server, 3 client.
    pub kind: i32,
    /// 0 unset, 1 ok, 2 error.
    pub status: i32,
    pub attributes: HashMap<String, Value>,
}

impl ReceivedSpan {
    /// An attribute as text (strings as they are, numbers and booleans printed).
    pub fn attr(&self, key: &str) -> Option<String> {
        Some(match self.attributes.get(key)? {
            Value::StringValue(s) => s.clone(),
            Value::IntValue(i) => i.to_string(),
            Value::DoubleValue(d) => d.to_string(),
            Value::BoolValue(b) => b.to_string(),
            other => format!("{other:?}"),
        })
    }

    pub fn int(&self, key: &str) -> Option<i64> {
        match self.attributes.get(key)? {
            Value::IntValue(i) => Some(*i),
            _ => None,
        }
    }

    pub fn double(&self, key: &str) -> Option<f64> {
        match self.attributes.get(key)? {
            Value::DoubleValue(d) => Some(*d),
            _ => None,
        }
    }
}

pub struct OtlpReceiver {
    pub addr: SocketAddr,
    spans: Arc<parking_lot::Mutex<Vec<ReceivedSpan>>>,
    hang: Arc<AtomicBool>,
    /// Export requests read (answered or not).
    exports: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn attributes(kvs: &[KeyValue]) -> HashMap<String, Value> {
    kvs.iter()
        .filter_map(|kv| Some((kv.key.clone(), kv.value.as_ref()?.value.clone()?)))
        .collect()
}

impl OtlpReceiver {
    pub async fn start() -> OtlpReceiver {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let spans = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let hang = Arc::new(AtomicBool::new(false));
        let exports = Arc::new(AtomicUsize::new(0));
        let (s, h, e) = (spans.clone(), hang.clone(), exports.clone());
        let task = tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                tokio::spawn(serve(conn, s.clone(), h.clone(), e.clone()));
            }
        });
        OtlpReceiver {
            addr,
            spans,
            hang,
            exports,
            task,
        }
    }

    /// The `tracing.endpoint` value for this receiver.
    pub fn endpoint(&self) -> String {
        format!("http://{}/v1/traces", self.addr)
    }

    /// From now on read exports and never answer them.
    pub fn hang(&self) {
        self.hang.store(true, Ordering::SeqCst);
    }

    pub fn exports(&self) -> usize {
        self.exports.load(Ordering::SeqCst)
    }

    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.spans.lock().clone()
    }

    /// The spans once `done` says they are all in (polled for up to 20 s).
    pub async fn spans_when(&self, done: impl Fn(&[ReceivedSpan]) -> bool) -> Vec<ReceivedSpan> {
        for _ in 0..400 {
            let got = self.spans();
            if done(&got) {
                return got;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let got = self.spans();
        panic!("the spans never arrived; got {}: {got:#?}", got.len());
    }
}

/// One connection: HTTP/1.1 requests with a Content-Length body, kept alive.
async fn serve(
    mut conn: TcpStream,
    spans: Arc<parking_lot::Mutex<Vec<ReceivedSpan>>>,
    hang: Arc<AtomicBool>,
    exports: Arc<AtomicUsize>,
) {
    let mut buf = Vec::new();
    loop {
        let head_end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            let mut chunk = [0u8; 8192];
            match conn.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
        let len = super::content_length(&head);
        while buf.len() < head_end + len {
            let mut chunk = [0u8; 65536];
            match conn.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        let body: Vec<u8> = buf.drain(..head_end + len).skip(head_end).collect();
        exports.fetch_add(1, Ordering::SeqCst);
        if hang.load(Ordering::SeqCst) {
            // A wedged collector: the connection stays open, nothing comes back.
            tokio::time::sleep(Duration::from_secs(600)).await;
            return;
        }
        let ok = head.starts_with("POST /v1/traces ")
            && head
                .to_ascii_lowercase()
                .contains("content-type: application/x-protobuf");
        let decoded = ok
            .then(|| ExportTraceServiceRequest::decode(body.as_slice()).ok())
            .flatten();
        let status = match decoded {
            Some(req) => {
                let mut got = spans.lock();
                for rs in req.resource_spans {
                    let service = rs
                        .resource
                        .as_ref()
                        .and_then(|r| {
                            attributes(&r.attributes)
                                .remove("service.name")
                                .map(|v| match v {
                                    Value::StringValue(s) => s,
                                    other => format!("{other:?}"),
                                })
                        })
                        .unwrap_or_default();
                    for ss in rs.scope_spans {
                        for s in ss.spans {
                            got.push(ReceivedSpan {
                                service: service.clone(),
                                name: s.name.clone(),
                                trace_id: hex(&s.trace_id),
                                span_id: hex(&s.span_id),
                                parent_span_id: hex(&s.parent_span_id),
                                kind: s.kind,
                                status: s.status.as_ref().map_or(0, |st| st.code),
                                attributes: attributes(&s.attributes),
                            });
                        }
                    }
                }
                "200 OK"
            }
            None => "400 Bad Request",
        };
        // An empty ExportTraceServiceResponse encodes to no bytes.
        let resp = format!(
            "HTTP/1.1 {status}\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n"
        );
        if conn.write_all(resp.as_bytes()).await.is_err() {
            return;
        }
    }
}
