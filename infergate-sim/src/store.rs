//! One engine's stored Responses API responses (`responses_store`): objects by id, conversations, background cancels.

use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use lru::LruCache;
use serde_json::{json, Value};
use tokio::sync::oneshot;

/// Most responses one engine keeps; the oldest is dropped first. vLLM's store never forgets (it warns of a memory
/// leak); the bound keeps a long benchmark from growing the simulator without limit.
pub const MAX_STORED_RESPONSES: usize = 10_000;

/// One turn of a stored conversation, what a `previous_response_id` continues. A turn shares its history with the
/// turn it continued, so a chain of n turns costs memory in n, not n².
#[derive(Clone)]
pub(crate) struct Turn {
    parent: Option<Arc<Turn>>,
    /// The request's input as chat messages, then its answer as an assistant message once there is one.
    messages: Vec<Value>,
}

impl Turn {
    /// A turn continuing `parent` with `input`. System messages are dropped: like vLLM, a continued conversation
    /// carries no instructions over (only the new request's own `instructions` apply).
    pub fn new(parent: Option<Arc<Turn>>, mut input: Vec<Value>) -> Turn {
        input.retain(|m| m.get("role").and_then(Value::as_str) != Some("system"));
        Turn {
            parent,
            messages: input,
        }
    }

    /// The turn with its answer: vLLM continues with the previous output text as an assistant message.
    pub fn answered(mut self, text: &str) -> Turn {
        self.answer(text);
        self
    }

    fn answer(&mut self, text: &str) {
        if !text.is_empty() {
            self.messages
                .push(json!({"role": "assistant", "content": text}));
        }
    }

    /// Every message of the conversation up to and including this turn, oldest first.
    pub fn conversation(&self) -> Vec<&Value> {
        let mut turns = vec![self];
        let mut t = self;
        while let Some(p) = t.parent.as_deref() {
            turns.push(p);
            t = p;
        }
        turns.iter().rev().flat_map(|t| t.messages.iter()).collect()
    }
}

impl Drop for Turn {
    /// Unlinks the history iteratively: dropping a long chain recursively could overflow the stack.
    fn drop(&mut self) {
        let mut next = self.parent.take();
        while let Some(p) = next {
            next = Arc::try_unwrap(p).ok().and_then(|mut t| t.parent.take());
        }
    }
}

struct Stored {
    /// The response object as `GET /v1/responses/{id}` returns it (its current status).
    object: Value,
    turn: Arc<Turn>,
    background: bool,
    /// A background generation still running: sending (or dropping, when the response leaves the store) stops it.
    cancel: Option<oneshot::Sender<()>>,
}

/// What `POST /v1/responses/{id}/cancel` finds.
pub(crate) enum Cancel {
    Unknown,
    /// A response created without `background` (vLLM: "Cannot cancel a synchronous response.").
    Synchronous,
    /// The background response after the cancel: `cancelled`, or unchanged if it had already ended.
    Done(Value),
}

/// The stored responses of one engine, oldest dropped first beyond [`MAX_STORED_RESPONSES`].
pub(crate) struct ResponseStore {
    // Reads peek, so the order is creation order: the oldest response goes first, whatever was read lately.
    map: Mutex<LruCache<String, Stored>>,
}

fn status(object: &Value) -> &str {
    object.get("status").and_then(Value::as_str).unwrap_or("")
}

/// Still generating: vLLM only changes (or cancels) a response in these states.
fn running(object: &Value) -> bool {
    matches!(status(object), "queued" | "in_progress")
}

fn set_status(object: &mut Value, s: &str) {
    if let Some(o) = object.as_object_mut() {
        o.insert("status".into(), json!(s));
    }
}

impl ResponseStore {
    pub fn new(capacity: usize) -> Self {
        ResponseStore {
            map: Mutex::new(LruCache::new(
                NonZeroUsize::new(capacity).unwrap_or(NonZeroUsize::MIN),
            )),
        }
    }

    fn map(&self) -> MutexGuard<'_, LruCache<String, Stored>> {
        // A panic elsewhere while the lock was held leaves nothing half-done worth refusing requests over.
        self.map.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The conversation a `previous_response_id` continues.
    pub fn turn(&self, id: &str) -> Option<Arc<Turn>> {
        self.map().peek(id).map(|s| s.turn.clone())
    }

    /// The stored response object.
    pub fn object(&self, id: &str) -> Option<Value> {
        self.map().peek(id).map(|s| s.object.clone())
    }

    /// Stores a finished synchronous response.
    pub fn put(&self, id: String, object: Value, turn: Turn) {
        self.map().push(
            id,
            Stored {
                object,
                turn: Arc::new(turn),
                background: false,
                cancel: None,
            },
        );
    }

    /// Stores a background response as first answered (`queued`); its generation stops when the receiver fires.
    pub fn put_background(&self, id: String, object: Value, turn: Turn) -> oneshot::Receiver<()> {
        let (tx, rx) = oneshot::channel();
        self.map().push(
            id,
            Stored {
                object,
                turn: Arc::new(turn),
                background: true,
                cancel: Some(tx),
            },
        );
        rx
    }

    /// Moves a running background response to `status` (`in_progress`, or `failed` when the engine stopped).
    pub fn advance(&self, id: &str, status: &str) {
        if let Some(s) = self.map().peek_mut(id) {
            if running(&s.object) {
                set_status(&mut s.object, status);
            }
        }
    }

    /// The final object of a background response, and its answer for a continuation; a cancelled one stays so.
    pub fn finish(&self, id: &str, object: Value, answer: &str) {
        if let Some(s) = self.map().peek_mut(id) {
            if running(&s.object) {
                s.object = object;
                Arc::make_mut(&mut s.turn).answer(answer);
                s.cancel = None;
            }
        }
    }

    /// Cancels a running background response (its generation is aborted); an ended one is returned unchanged.
    pub fn cancel(&self, id: &str) -> Cancel {
        let mut map = self.map();
        let Some(s) = map.peek_mut(id) else {
            return Cancel::Unknown;
        };
        if !s.background {
            return Cancel::Synchronous;
        }
        if running(&s.object) {
            set_status(&mut s.object, "cancelled");
            if let Some(tx) = s.cancel.take() {
                let _ = tx.send(());
            }
        }
        Cancel::Done(s.object.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(id: &str, status: &str) -> Value {
        json!({"id": id, "object": "response", "status": status, "output": []})
    }

    fn user(text: &str) -> Value {
        json!({"role": "user", "content": text})
    }

    #[test]
    fn conversations_chain_without_instructions_and_the_oldest_goes_first() {
        let store = ResponseStore::new(2);
        let first = Turn::new(
            None,
            vec![json!({"role": "system", "content": "be brief"}), user("a")],
        );
        store.put("r1".into(), obj("r1", "completed"), first.answered("A"));
        let second = Turn::new(store.turn("r1"), vec![user("b")]).answered("B");
        let texts: Vec<&str> = second
            .conversation()
            .iter()
            .filter_map(|m| m["content"].as_str())
            .collect();
        assert_eq!(texts, ["a", "A", "b", "B"]);
        store.put("r2".into(), obj("r2", "completed"), second);
        store.put("r3".into(), obj("r3", "completed"), Turn::new(None, vec![]));
        assert!(store.object("r1").is_none(), "the oldest was dropped");
        // The continuation keeps the history it was built on.
        assert_eq!(store.turn("r2").map(|t| t.conversation().len()), Some(4));
        assert!(matches!(store.cancel("r2"), Cancel::Synchronous));
        assert!(matches!(store.cancel("nope"), Cancel::Unknown));
    }

    #[test]
    fn background_responses_advance_finish_and_cancel() {
        let store = ResponseStore::new(10);
        let mut rx = store.put_background(
            "b1".into(),
            obj("b1", "queued"),
            Turn::new(None, vec![user("x")]),
        );
        store.advance("b1", "in_progress");
        assert_eq!(
            store.object("b1").map(|o| o["status"].clone()),
            Some(json!("in_progress"))
        );
        let Cancel::Done(o) = store.cancel("b1") else {
            panic!("a background response")
        };
        assert_eq!(o["status"], "cancelled");
        assert_eq!(rx.try_recv(), Ok(()));
        // A late end of the generation does not undo the cancel.
        store.finish("b1", obj("b1", "completed"), "late");
        assert_eq!(
            store.object("b1").map(|o| o["status"].clone()),
            Some(json!("cancelled"))
        );
        assert_eq!(store.turn("b1").map(|t| t.conversation().len()), Some(1));

        let _rx = store.put_background(
            "b2".into(),
            obj("b2", "queued"),
            Turn::new(None, vec![user("y")]),
        );
        store.finish("b2", obj("b2", "incomplete"), "Y");
        let Cancel::Done(o) = store.cancel("b2") else {
            panic!("a background response")
        };
        assert_eq!(
            o["status"], "incomplete",
            "an ended response is returned unchanged"
        );
        assert_eq!(store.turn("b2").map(|t| t.conversation().len()), Some(2));
    }

    #[test]
    fn a_long_chain_drops_without_recursion() {
        let mut t = Turn::new(None, vec![user("0")]);
        for i in 1..200_000 {
            t = Turn::new(Some(Arc::new(t)), vec![user(&i.to_string())]);
        }
        assert_eq!(t.conversation().len(), 200_000);
        drop(t);
    }
}
