//! The order of a pool's wait queue: one FIFO per client key, served round-robin between keys, bounded in length.
//! Pure: tickets are numbers; waiting and waking live in `queue`.

use std::collections::VecDeque;

/// Waiting tickets grouped by key. The head is the first ticket of the key whose turn it is; serving it moves that
/// key to the back of the rotation, so a key with many waiting requests cannot starve a key with one.
#[derive(Debug)]
pub struct FairQueue<K> {
    max_len: usize,
    len: usize,
    /// Keys with waiting tickets, in turn order.
    rotation: VecDeque<(K, VecDeque<u64>)>,
}

impl<K: PartialEq> FairQueue<K> {
    pub fn new(max_len: usize) -> Self {
        FairQueue {
            max_len,
            len: 0,
            rotation: VecDeque::new(),
        }
    }

    /// A new bound (reload): tickets already waiting beyond it stay; new ones are refused until below it.
    pub fn set_max_len(&mut self, max_len: usize) {
        self.max_len = max_len;
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Add `ticket` behind `key`'s other tickets; false (and nothing added) when the queue is full.
    pub fn push(&mut self, key: K, ticket: u64) -> bool {
        if self.len >= self.max_len {
            return false;
        }
        match self.rotation.iter_mut().find(|(k, _)| *k == key) {
            Some((_, q)) => q.push_back(ticket),
            None => self.rotation.push_back((key, VecDeque::from([ticket]))),
        }
        self.len += 1;
        true
    }

    /// The ticket whose turn it is.
    pub fn head(&self) -> Option<u64> {
        self.rotation.front().and_then(|(_, q)| q.front().copied())
    }

    /// Serve the head: remove it and pass the turn to the next key.
    pub fn pop_head(&mut self) -> Option<u64> {
        let (key, mut q) = self.rotation.pop_front()?;
        let ticket = q.pop_front();
        if !q.is_empty() {
            self.rotation.push_back((key, q));
        }
        if ticket.is_some() {
            self.len -= 1;
        }
        ticket
    }

    /// Remove a ticket that gave up (timed out, cancelled) wherever it waits; its key keeps its place in the
    /// rotation while it has other tickets. False if it was not waiting.
    pub fn remove(&mut self, ticket: u64) -> bool {
        for i in 0..self.rotation.len() {
            let q = &mut self.rotation[i].1;
            if let Some(j) = q.iter().position(|&t| t == ticket) {
                q.remove(j);
                if q.is_empty() {
                    self.rotation.remove(i);
                }
                self.len -= 1;
                return true;
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(q: &mut FairQueue<&'static str>) -> Vec<u64> {
        std::iter::from_fn(|| q.pop_head()).collect()
    }

    #[test]
    fn one_key_is_fifo() {
        let mut q = FairQueue::new(10);
        for t in 1..=4 {
            assert!(q.push("a", t));
        }
        assert_eq!(q.head(), Some(1));
        assert_eq!(drain(&mut q), [1, 2, 3, 4]);
        assert!(q.is_empty());
        assert_eq!(q.pop_head(), None);
    }

    #[test]
    fn keys_take_turns_whatever_the_arrival_order() {
        let mut q = FairQueue::new(10);
        for t in 1..=5 {
            q.push("a", t);
        }
        q.push("b", 6);
        q.push("b", 7);
        q.push("c", 8);
        assert_eq!(q.len(), 8);
        assert_eq!(drain(&mut q), [1, 6, 8, 2, 7, 3, 4, 5]);
    }

    #[test]
    fn a_key_arriving_later_joins_the_rotation_at_the_back() {
        let mut q = FairQueue::new(10);
        q.push("a", 1);
        q.push("a", 2);
        q.push("a", 3);
        assert_eq!(q.pop_head(), Some(1));
        q.push("b", 4);
        assert_eq!(drain(&mut q), [2, 4, 3]);
    }

    #[test]
    fn bounded_length() {
        let mut q = FairQueue::new(2);
        assert!(q.push("a", 1));
        assert!(q.push("b", 2));
        assert!(!q.push("c", 3));
        assert_eq!(q.len(), 2);
        q.pop_head();
        assert!(q.push("c", 3));
    }

    #[test]
    fn removal_keeps_the_turn_order() {
        let mut q = FairQueue::new(10);
        q.push("a", 1);
        q.push("a", 2);
        q.push("b", 3);
        q.push("c", 4);
        // The head gives up: its key keeps the turn with its next ticket.
        assert!(q.remove(1));
        assert_eq!(q.head(), Some(2));
        // A key's only ticket gives up: the key leaves the rotation.
        assert!(q.remove(3));
        assert!(!q.remove(3));
        assert_eq!(q.len(), 2);
        assert_eq!(drain(&mut q), [2, 4]);
        assert!(!q.remove(99));
    }
}
